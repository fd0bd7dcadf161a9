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
    """A topology read a key of another task (hop there with ``ctx.send`` and read it there)."""


class HopFailed(TopologyError):
    """User code raised while a record or hop message ran; none of the unit's writes or messages were kept.

    ``hop`` is the topology or handler that raised (possibly a local hop deep in
    the unit), ``task`` the task it ran on, ``error`` the exception as text.
    """

    def __init__(self, hop: str, task: int, error: str, what: str) -> None:
        self.hop = hop
        self.task = task
        self.error = error
        self.what = what  # (kept: the client rebuilds the typed error from its constructor arguments)
        super().__init__(hop, f"{error} (task {task}, {what}); fix the code or the input")
