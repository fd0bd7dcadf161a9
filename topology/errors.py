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


class QueryFailed(TopologyError):
    """A query topology's function raised, or the query outgrew its bounds; nothing of it is left running."""

    def __init__(self, query: str, task: int, error: str) -> None:
        self.query = query
        self.task = task
        self.error = error
        super().__init__(query, f"{error} (query call on task {task})")


class QueryTimeout(TopologyError):
    """A query topology ran past its deadline: it was stopped (on the workers too) and returned nothing."""

    grpc_code = "DEADLINE_EXCEEDED"

    def __init__(self, query: str, timeout_s: float) -> None:
        self.query = query
        self.timeout_s = timeout_s
        super().__init__(query, f"did not finish within its deadline of {timeout_s:.3g} s; pass a longer "
                                "timeout_s to cluster.query, or make the query read less")
