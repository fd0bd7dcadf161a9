"""Depot retention: where a partition may be trimmed (by age, by size, on request), and the trim itself.

A depot record carries no time of its own here, so retention keeps *marks*: each retention check a leader
makes records, for every partition whose end moved, ``(end offset, the leader's time, bytes appended so
far)`` in ``_meta`` (one replicated entry, so every replica and every later leader holds the same marks).
A mark says "every record below this offset was appended at or before this time", which is all retention
by age needs: the records below the newest mark older than ``retention_ms`` are old enough to go. A record
is therefore deleted at most one check interval after it expires. Retention by size compares the bytes
appended since the partition's start (``PartitionInfo.appended_bytes`` minus the bytes below the start)
with its bound, and finds the cut between two marks by linear interpolation (exact at marks, estimated
between them; the next mark corrects the estimate, so the error never accumulates).

The promise rule (docs/replication.md, "Depot trims"): a trim entry deletes only records below the
partition's *applied* end when the leader built it (:func:`replog.trims.trim_point`: a replication rule, in
replog/ with the simulator that checks it). Applied records are in every ISR member's log, so a trim never
deletes a record whose append could still be truncated or retried, and what a reader was told is readable
(``PartitionInfo``, answered from applied state) stays readable until a trim the leader built after it.
Every replica deletes the same range (the entry holds a RocksDB range delete); disk space returns when each
replica compacts the range in the background (conductor.worker.retention).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack

from pstate.depots import (
    DEPOT_META,
    DEPOT_META_END,
    META,
    PartitionInfo,
    check_partition,
    read_partition_info,
    read_partition_meta,
    times_below,
)
from pstate.engine import Reader
from pstate.store import ChangeSetBuilder
from replog.trims import trim_point

_RETENTION = b"rt:"
#: marks kept per partition; past it the older half is thinned (coarser, still correct: a mark stays exact)
MAX_MARKS = 64


@dataclass(frozen=True)
class RetentionPolicy:
    """A depot's bounds (0: none). ``compaction`` keeps the latest record per key (:mod:`pstate.compaction`),
    deleting a key's tombstone ``delete_retention_ms`` after it was compacted."""

    retention_ms: int = 0
    retention_bytes: int = 0
    compaction: bool = False
    delete_retention_ms: int = 24 * 3600 * 1000

    def __post_init__(self) -> None:
        assert min(self.retention_ms, self.retention_bytes, self.delete_retention_ms) >= 0, self

    @property
    def bounded(self) -> bool:
        return self.retention_ms > 0 or self.retention_bytes > 0


@dataclass(frozen=True)
class Mark:
    """Every record below ``offset`` was appended by ``time_ms``; ``appended_bytes`` were appended below it."""

    offset: int
    time_ms: int
    appended_bytes: int


@dataclass(frozen=True)
class RetentionState:
    """A partition's retention metadata: bytes appended below its start (estimated between marks), marks."""

    start_bytes: int = 0
    marks: tuple[Mark, ...] = field(default_factory=tuple)
    #: records and bytes above the start that key compaction deleted (pstate.compaction)
    compacted_records: int = 0
    compacted_bytes: int = 0


def _key(depot: str, partition: int) -> bytes:
    return _RETENTION + depot.encode() + b"\x00" + check_partition(partition)


def read_state(reader: Reader, depot: str, partition: int) -> RetentionState:
    return decode_state(reader.get(META, _key(depot, partition)))


def decode_state(raw: bytes | None) -> RetentionState:
    """A partition's retention state from its ``_meta`` value (None: never written)."""
    if raw is None:
        return RetentionState()
    start_bytes, marks, records, nbytes = msgpack.unpackb(raw)
    return RetentionState(start_bytes, tuple(Mark(*m) for m in marks), records, nbytes)


def write_state(builder: ChangeSetBuilder, depot: str, partition: int, state: RetentionState) -> None:
    assert len(state.marks) <= MAX_MARKS + 1, len(state.marks)
    raw = msgpack.packb([state.start_bytes, [[m.offset, m.time_ms, m.appended_bytes] for m in state.marks],
                         state.compacted_records, state.compacted_bytes])
    builder.writes.put(META, _key(depot, partition), raw)


@dataclass(frozen=True)
class PartitionSize:
    """What ``conductor status`` shows of a partition: its offsets, records held and bytes held (estimated
    between marks after a trim at an arbitrary offset)."""

    start: int
    end: int
    records: int
    bytes: int


def partition_size(reader: Reader, depot: str, partition: int) -> PartitionSize:
    info = read_partition_info(reader, depot, partition)
    st = read_state(reader, depot, partition)
    records = max(0, info.end - info.start - st.compacted_records)
    return PartitionSize(info.start, info.end, records, live_bytes(info, st))


def partition_sizes(reader: Reader) -> list[tuple[str, int, PartitionSize]]:
    """Every depot partition that holds or held records: (depot, partition, size), in key order."""
    out = []
    for k, _v in reader.scan(META, DEPOT_META, DEPOT_META_END):
        rest = k[len(DEPOT_META):]  # name, NUL, partition u32
        depot, partition = rest[:-5].decode(), int.from_bytes(rest[-4:], "big")
        out.append((depot, partition, partition_size(reader, depot, partition)))
    return out


def live_bytes(info: PartitionInfo, state: RetentionState) -> int:
    return max(0, info.appended_bytes - state.start_bytes - state.compacted_bytes)


#: below this many trimmed bytes a partition's trimmed range is not worth a compaction of its own
MIN_COMPACTION_BYTES = 1 << 20


def compaction_due(trimmed_bytes: int, live_bytes: int) -> bool:
    """Whether a partition's range trimmed since its last compaction should be compacted now (disk space back).

    Once it holds as many bytes as the partition keeps (at least :data:`MIN_COMPACTION_BYTES`): dead files
    stay within about the live ones, and compactions are amortized over what was trimmed (a compaction per
    trim would rewrite the partition's newest files again and again under a steady writer: twice the
    writer's p99 in bench.retention).
    """
    return trimmed_bytes >= max(MIN_COMPACTION_BYTES, live_bytes)


def _points(info: PartitionInfo, state: RetentionState) -> list[tuple[int, int]]:
    """(offset, bytes appended below it), ascending: the start, the marks above it, the end."""
    pts = [(info.start, state.start_bytes)]
    pts += [(m.offset, m.appended_bytes) for m in state.marks if info.start < m.offset < info.end]
    if info.end > info.start:
        pts.append((info.end, max(info.appended_bytes, state.start_bytes)))
    return pts


def bytes_below(info: PartitionInfo, state: RetentionState, offset: int) -> int:
    """Bytes appended below ``offset`` (start <= offset <= end): exact at marks, interpolated between them."""
    pts = _points(info, state)
    prev = pts[0]
    for o, b in pts[1:]:
        if offset <= o:
            if o == prev[0]:
                return b
            return prev[1] + (b - prev[1]) * (offset - prev[0]) // (o - prev[0])
        prev = (o, b)
    return prev[1]


def _cut_for_bytes(info: PartitionInfo, state: RetentionState, bound: int) -> int:
    """The lowest offset above which at most ``bound`` bytes remain (interpolated between marks)."""
    target = info.appended_bytes - bound  # bytes that must lie below the cut
    pts = _points(info, state)
    if target <= pts[0][1]:
        return info.start
    prev = pts[0]
    for o, b in pts[1:]:
        if b >= target:
            span = b - prev[1]
            return o if span <= 0 else prev[0] + -(-(target - prev[1]) * (o - prev[0]) // span)
        prev = (o, b)
    return info.end


def retention_cut(policy: RetentionPolicy, info: PartitionInfo, state: RetentionState, now_ms: int) -> int:
    """Where ``policy`` wants the partition to start now (its start when nothing is due). Pure."""
    cut = info.start
    if policy.retention_ms > 0:
        for m in state.marks:
            if m.time_ms <= now_ms - policy.retention_ms:
                cut = max(cut, m.offset)
    if policy.retention_bytes > 0 and live_bytes(info, state) > policy.retention_bytes:
        cut = max(cut, _cut_for_bytes(info, state, policy.retention_bytes))
    return min(cut, info.end)


def with_mark(state: RetentionState, info: PartitionInfo, now_ms: int) -> RetentionState:
    """The state with a mark at the partition's end now (if the end moved), thinned to :data:`MAX_MARKS`."""
    marks = [m for m in state.marks if m.offset > info.start]
    if info.end > info.start and (not marks or marks[-1].offset < info.end):
        marks.append(Mark(info.end, now_ms, info.appended_bytes))
    if len(marks) > MAX_MARKS:  # keep the newest half whole, every other one of the older half
        half = len(marks) // 2
        marks = marks[:half][1::2] + marks[half:]
    return RetentionState(state.start_bytes, tuple(marks), state.compacted_records, state.compacted_bytes)


def trim(builder: ChangeSetBuilder, depot: str, partition: int, before: int, applied: Reader) -> int:
    """Trim ``depot[partition]`` below ``before`` (clamped by :func:`trim_point`); return the new start.

    ``applied`` reads the applied state (the promise rule's applied end); the builder reads through staged
    entries, so two trims in flight compose.
    """
    info = read_partition_info(builder.reader, depot, partition)
    applied_end = read_partition_info(applied, depot, partition).end
    return _trim(builder, depot, partition, before, info, applied_end, read_state(builder.reader, depot, partition))


def _trim(builder: ChangeSetBuilder, depot: str, partition: int, before: int, info: PartitionInfo,
          applied_end: int, state: RetentionState) -> int:
    """:func:`trim` with the partition's bounds, applied end and retention state already read (a check has them)."""
    new_start = trim_point(before, info.start, max(applied_end, info.start))
    if new_start == info.start:
        return info.start
    builder.depot_trim(depot, partition, new_start)
    write_state(builder, depot, partition, trimmed_state(info, state, new_start))
    return new_start


def trimmed_state(info: PartitionInfo, state: RetentionState, new_start: int) -> RetentionState:
    """The retention state once the partition starts at ``new_start`` (``info.start < new_start <= info.end``). Pure."""
    start_bytes = bytes_below(info, state, new_start)
    marks = tuple(m for m in state.marks if m.offset > new_start)
    # compacted records below the new start leave with it; the counts are clamped, not exact
    return RetentionState(start_bytes, marks, 0, 0) if new_start >= info.end else RetentionState(
        start_bytes, marks, state.compacted_records, min(state.compacted_bytes, info.appended_bytes - start_bytes))


def check(builder: ChangeSetBuilder, depot: str, partition: int, policy: RetentionPolicy, now_ms: int,
          applied: Reader) -> int:
    """One retention check of a partition: a mark at its applied end, then the trim the policy wants (if any).
    Returns the records trimmed."""
    info = read_partition_info(builder.reader, depot, partition)
    applied_info = read_partition_info(applied, depot, partition)
    state = read_state(builder.reader, depot, partition)
    # the mark is at the applied end: marks, like trims, never speak of records that may not be kept
    marked = with_mark(state, PartitionInfo(info.start, max(applied_info.end, info.start),
                                            applied_info.appended_bytes), now_ms)
    if marked != state:
        write_state(builder, depot, partition, marked)
    cut = retention_cut(policy, info, marked, now_ms)
    if cut <= info.start:
        return 0
    # the state as written above: the mark's write is staged in this builder, which _trim writes over
    return _trim(builder, depot, partition, cut, info, applied_info.end, marked) - info.start


# ---------------------------------------------------------------------- checks planned off the task thread


@dataclass(frozen=True)
class PlannedCheck:
    """One partition's retention check, decided from the applied state off the task thread
    (:func:`plan_check`); the leader's task thread only writes it (:func:`write_planned`), unless the
    partition's start or retention state moved since (then the next check plans again)."""

    depot: str
    partition: int
    #: the partition's start and the raw retention state the plan was made from (its guard)
    start: int
    state_raw: bytes | None
    #: the retention state to write: the new mark, and the trim's start bytes when it trims
    state: RetentionState
    #: the new start (``start``: no trim), at most the applied end the plan read (the promise rule)
    new_start: int
    #: the time runs the trim deletes (:func:`pstate.depots.times_below`, read below an applied offset)
    runs: tuple[bytes, bytes] | None


def plan_check(applied: Reader, depot: str, partition: int, policy: RetentionPolicy, now_ms: int
               ) -> PlannedCheck | None:
    """:func:`check` over the applied state only, for any thread; None when it would write nothing.

    ``applied`` need not be a snapshot: the state is read before the partition's bounds, so a trim applied
    between the two reads leaves an old state beside a new start, which :func:`write_planned`'s guard refuses,
    and a mark read is never above the bounds read after it. The decision is :func:`check`'s over what is
    applied: the same mark (at the applied end), the same :func:`retention_cut` and
    :func:`replog.trims.trim_point`, with the applied end as the partition's end.
    """
    raw = applied.get(META, _key(depot, partition))
    state = decode_state(raw)
    info = read_partition_info(applied, depot, partition)
    marked = with_mark(state, info, now_ms)
    new_start = trim_point(retention_cut(policy, info, marked, now_ms), info.start, info.end)
    if new_start == info.start:
        return None if marked == state else PlannedCheck(depot, partition, info.start, raw, marked, new_start, None)
    return PlannedCheck(depot, partition, info.start, raw, trimmed_state(info, marked, new_start), new_start,
                        times_below(applied, depot, check_partition(partition), new_start))


def write_planned(builder: ChangeSetBuilder, plan: PlannedCheck) -> int:
    """Write ``plan`` into the leader's entry (two reads through the builder: the guard); returns the records
    trimmed (0 when the partition moved since the plan: another trim, check or compaction round went first)."""
    info, last = read_partition_meta(builder.reader, plan.depot, plan.partition)
    key = _key(plan.depot, plan.partition)
    if info.start != plan.start or builder.reader.get(META, key) != plan.state_raw:
        return 0
    write_state(builder, plan.depot, plan.partition, plan.state)
    if plan.new_start == info.start:
        return 0
    builder.depot_trim_writes(plan.depot, plan.partition, info, last, plan.new_start, plan.runs)
    return plan.new_start - info.start
