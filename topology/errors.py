"""The errors a topology raises, kept apart from the runtime so the client can name them without loading it."""

from __future__ import annotations


class TopologyError(Exception):
    """A topology function failed or misused its context; the message names the topology and the fix."""

    grpc_code = "FAILED_PRECONDITION"

    def __init__(self, topology: str, message: str) -> None:
        self.topology = topology
        self.message = message
        super().__init__(f"topology {topology}: {message}")


class ForeignRead(TopologyError):
    """A topology read a key owned by another task group."""
