"""The client's own error: bad use of the client, refused before anything is sent."""

from __future__ import annotations

from conductor.wire.errors import MillraceError


class ClientError(MillraceError):
    """Bad use of the client (unknown module, depot or ack level); the message says what exists."""

    def __init__(self, message: str) -> None:
        super().__init__("INVALID_ARGUMENT", message)
