"""Typed errors of the replication layer.

Every error says what went wrong and what the caller should do next, because
these messages reach operators through the CLI and clients through gRPC
status codes (see ``GRPC_CODE``); a bare ``RuntimeError`` helps nobody at 3 a.m.
"""

from __future__ import annotations


class ReplogError(Exception):
    """Base of every replication-layer error."""

    #: name of the ``grpc.StatusCode`` member this error maps to (kept as a
    #: string so that ``replog`` never imports grpc).
    grpc_code: str = "INTERNAL"


class CorruptLog(ReplogError):
    """A log segment holds a bad frame before its tail: the replica must recover from the leader."""

    grpc_code = "DATA_LOSS"

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(
            f"corrupt replog segment {path} at byte {offset}: {reason}; "
            "the replica must be rebuilt from the leader (delete its replog directory and restart it)"
        )


class OffsetOutOfRange(ReplogError):
    """A read asked for offsets the log no longer (or does not yet) hold."""

    grpc_code = "OUT_OF_RANGE"

    def __init__(self, offset: int, start: int, end: int) -> None:
        self.offset = offset
        self.start = start
        self.end = end
        super().__init__(
            f"offset {offset} is outside the log [{start}, {end}); "
            "read from the start offset or fetch a checkpoint (far-horizon catchup)"
        )


class NotLeader(ReplogError):
    """This replica does not lead the group (any more); retry against the leader."""

    grpc_code = "FAILED_PRECONDITION"

    def __init__(self, group: str, leader: str | None = None, epoch: int | None = None,
                 retry_at: str | None = None) -> None:
        self.group = group
        self.leader = leader
        self.epoch = epoch
        self.retry_at = retry_at if retry_at is not None else leader
        where = f"; retry at {self.retry_at}" if self.retry_at else "; refresh metadata and retry"
        super().__init__(f"this replica is not the leader of task group {group} (epoch {epoch}){where}")


class StalledGroup(ReplogError):
    """The ISR is smaller than min-ISR, so nothing can be applied; appends fail instead of waiting forever."""

    grpc_code = "UNAVAILABLE"

    def __init__(self, group: str, isr: list[str] | tuple[str, ...], min_isr: int) -> None:
        self.group = group
        self.isr = list(isr)
        self.min_isr = min_isr
        super().__init__(
            f"task group {group} is stalled: ISR {self.isr} has {len(self.isr)} member(s) but min-ISR is "
            f"{min_isr}; bring followers back (check `conductor status`) or lower replication.min.isr"
        )


class Backpressure(ReplogError):
    """Too much is in flight; the append waited its bound and gave up rather than buffer without limit."""

    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, group: str, what: str) -> None:
        self.group = group
        self.what = what
        super().__init__(f"task group {group} is overloaded ({what}); retry later or slow the producer")


class FencedEpoch(ReplogError):
    """A message carried an epoch older than ours: it comes from a deposed leader and is dropped."""

    grpc_code = "FAILED_PRECONDITION"

    def __init__(self, group: str, got: int, current: int) -> None:
        self.group = group
        self.got = got
        self.current = current
        super().__init__(f"task group {group}: message from epoch {got} is older than epoch {current}; dropped")


class InvalidFrame(ReplogError):
    """Raw batch frames failed validation (bad length, CRC or layout) before touching the log.

    Raised by the follower append path for frames that arrived over the network: the
    bytes were damaged in transit or produced by a buggy peer, and nothing was written.
    """

    grpc_code = "DATA_LOSS"

    def __init__(self, position: int, reason: str) -> None:
        self.position = position
        self.reason = reason
        super().__init__(
            f"invalid replog frame at byte {position} of the received data: {reason}; "
            "nothing was appended, fetch the frames again from the leader"
        )


class UnexpectedOffset(ReplogError):
    """Frames handed to a follower's log do not start exactly at its end offset (a gap or an overlap)."""

    grpc_code = "FAILED_PRECONDITION"

    def __init__(self, expected: int, got: int) -> None:
        self.expected = expected
        self.got = got
        what = "a gap" if got > expected else "an overlap"
        super().__init__(
            f"frames start at offset {got} but the log ends at offset {expected} ({what}); "
            f"fetch from offset {expected}, or truncate to the divergence point first"
        )


class CorruptEpochFile(ReplogError):
    """The leader-epoch checkpoint file is damaged (bad checksum or syntax)."""

    grpc_code = "DATA_LOSS"

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"corrupt leader-epoch checkpoint {path}: {reason}; "
            "the replica must be rebuilt from the leader (delete its data directory and restart it)"
        )


class EntryTooLarge(ReplogError):
    """A record, or the replog entry an append would become, is over its limit; nothing was logged.

    ``what`` is ``"record"`` (``replication.max.record.bytes``) or ``"entry"``
    (``replication.max.entry.bytes``: the records with their topologies'
    effects and hop messages). Retrying the same append fails the same way.
    """

    grpc_code = "INVALID_ARGUMENT"

    def __init__(self, group: str, what: str, size: int, limit: int) -> None:
        self.group = group
        self.what = what
        self.size = size
        self.limit = limit
        super().__init__(
            f"task group {group}: the {what} is {size:,} bytes, over replication.max.{what}.bytes = {limit:,}; "
            f"nothing was written: split it, store large values elsewhere, or raise the option"
        )


class AppendFailed(ReplogError):
    """Building this append's entry raised an unexpected error; this append alone failed and nothing of it was written.

    The leader keeps serving every other request. ``error`` names the exception;
    the node log has its traceback.
    """

    grpc_code = "INTERNAL"

    def __init__(self, group: str, error: str) -> None:
        self.group = group
        self.error = error
        super().__init__(f"task group {group}: this append failed while its entry was built ({error}); nothing of "
                         "it was written and the group keeps serving; the node log has the traceback")


class ReplicaFailed(NotLeader):
    """This replica hit a fault (damaged data, a full disk, an internal error) and gave up; it restarts itself.

    A kind of :class:`NotLeader`: clients look the leader up again and retry,
    since leadership moves to another in-sync replica.
    """

    grpc_code = "UNAVAILABLE"

    def __init__(self, group: str, kind: str, reason: str) -> None:  # (NotLeader.__init__ would word it as a move)
        self.group = group
        self.kind = kind
        self.reason = reason
        self.leader = None
        self.epoch = None
        self.retry_at = None
        ReplogError.__init__(self, f"replica of task group {group} failed ({kind}: {reason}); it gave up leadership and "
                         "restarts from disk; retry (another in-sync replica leads)")


class CorruptStorageMarks(ReplogError):
    """The storage marks file is damaged: the replica cannot tell what it acknowledged."""

    grpc_code = "DATA_LOSS"

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"storage marks {path} are damaged: {reason}")
