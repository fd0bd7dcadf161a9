"""The client's own errors: bad use of the client, and a full client queue; both refused before anything is sent."""

from __future__ import annotations

from conductor.wire.errors import MillraceError


class ClientError(MillraceError):
    """Bad use of the client (unknown module, depot or ack level); the message says what exists."""

    def __init__(self, message: str) -> None:
        super().__init__("INVALID_ARGUMENT", message)


class QueueFull(MillraceError):
    """A queue of this client stayed full for the client's timeout: the app appends faster than the cluster answers.

    Nothing of the refused record was queued or sent. ``option`` names the
    ``Cluster.connect`` option that sets the bound ``limit``: raise it, or wait
    for earlier appends (their futures) before queueing more.
    """

    def __init__(self, what: str, option: str, limit: int, waited_s: float) -> None:
        self.what = what
        self.option = option
        self.limit = limit
        self.waited_s = waited_s
        super().__init__("RESOURCE_EXHAUSTED", f"{what} stayed full for {waited_s:.1f}s ({option}={limit:,}); wait "
                         f"for earlier appends to be answered, or pass a larger {option} to Cluster.connect")
