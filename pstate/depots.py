"""A depot's partitions in a task group's store: the record keys, the partition bounds in ``_meta``, reads.

Depot records live in their own column family, keyed by partition (u32) and offset (u64), big-endian, so
one partition's records are one contiguous, ordered range: one key per record, or (since session 16) one
value per appended batch, keyed by its last offset (:mod:`pstate.depot_batches` has the layout, its version
and why). ``_meta`` holds each partition's ``[start, end)`` and the bytes ever appended to it (what retention
by size measures, :mod:`pstate.retention`); every read clamps to ``start`` (a trim may leave a batch's records
below it on disk). Writes go through ``ChangeSetBuilder`` (pstate.store); this module has the reads.

A partition that never stored a batch (an older store, or a depot filled one record an append) holds only record
keys, so its offsets map to keys one to one, and a read takes its values in RocksDB's C loop without building
a key object per record (:meth:`pstate.reader.DbReader.values`), as reads did before batches. The first batch a
partition stores writes ``db:`` + depot + NUL + partition (u32) -> empty in ``_meta`` (:func:`batched_key`, in
the same entry, so every replica has it with the batch and a reader that sees the batch sees it too); a
partition with it is read key by key (:func:`pstate.depot_batches.read_slice`). It is never removed: a trim or a
compaction that leaves no batch only keeps the partition on the general path.

Record times. Every record has a time in milliseconds: the leader's clock when it built the entry, or an
event time the app gave with the append. Records appended together share one time, so times are kept as
*runs* in ``_meta``: ``dt:`` + depot + partition + first offset -> time (i64) + the partition's max-so-far
time (i64, the largest time of any record up to and including this run). A run covers the records from its
first offset up to the next run's; an append whose time equals the partition's last one writes no run.
The key and value are written by the leader into the entry, so every replica stores the same times.
Records appended before times existed (older code) have none: :func:`record_time` says ``None`` for them,
and :func:`offset_for_time` treats them as older than any time.

Event times may go backwards; the max-so-far time never does, so :func:`offset_for_time` (Kafka's
``offsetsForTimes``) is defined on it: the first offset whose max-so-far time is at or after ``t``. With
times that never go backwards (the leader's clock, in the common case) that is exactly the first record at
or after ``t``; with times that do, every record before the answer is older than ``t`` (retention by age
may delete them) and a late record after it may be older too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pstate.codec import unpack_many
from pstate.depot_batches import Slice, read_slice
from pstate.errors import SchemaMismatch, rocks_errors
from pstate.packed_records import PackedRecords
from pstate.reader import DbReader

if TYPE_CHECKING:
    from pstate.engine import Reader
    from pstate.store import TaskGroupStore

META = "_meta"
_DEPOT_META = b"d:"
#: the ``_meta`` keys of depot partition bounds are ``DEPOT_META + name + NUL + partition (u32)``
DEPOT_META, DEPOT_META_END = _DEPOT_META, b"d;"
#: pstate.compaction's cursor key prefix (a compacted partition has one)
COMPACTION_CURSOR = b"kx:"
_DEPOT_TIME = b"dt:"
_BATCHED = b"db:"
_TIME = 1 << 63
_U32 = 1 << 32
_U64 = 1 << 64


def depot_cf(name: str) -> str:
    return "depot:" + name


def batched_key(name: str, p: bytes) -> bytes:
    """The ``_meta`` key saying the partition (``p``: u32) stored a batch (module docstring)."""
    return _BATCHED + name.encode() + b"\x00" + p


@dataclass(frozen=True)
class PartitionInfo:
    """Offsets held by one depot partition: records ``start <= offset < end``.

    ``appended_bytes`` counts the bytes of every record ever appended (0 for partitions written before it was
    kept); a trim leaves it as it is, so bytes between two offsets are a difference of two counts. Stored in
    the partition's ``_meta`` value by :func:`encode_partition_meta`, its one encoder.
    """

    start: int
    end: int
    appended_bytes: int = 0


def check_partition(partition: int) -> bytes:
    if type(partition) is not int or not 0 <= partition < _U32:
        raise SchemaMismatch("partition", "int in [0, 2**32)", repr(partition))
    return partition.to_bytes(4, "big")


def check_offset(offset: int, what: str) -> int:
    if type(offset) is not int or not 0 <= offset < _U64:
        raise SchemaMismatch(what, "int in [0, 2**64)", repr(offset))
    return offset


class DepotView:
    """Reads of one depot's per-partition logs (records stored per key or per batch: :mod:`pstate.depot_batches`)."""

    def __init__(self, store: TaskGroupStore, name: str, reader: Reader) -> None:
        self._store = store
        self.name = name
        self._reader = reader
        self._cf = depot_cf(name)

    def partition_info(self, partition: int) -> PartitionInfo:
        return read_partition_info(self._reader, self.name, partition)

    def time_of(self, partition: int, offset: int) -> int | None:
        """The time (ms) of the record at ``offset``; None when it has none or is not in the partition."""
        info = self.partition_info(partition)
        if not info.start <= check_offset(offset, "offset") < info.end:
            return None
        return record_time(self._reader, self.name, partition, offset)

    def offset_for_time(self, partition: int, time_ms: int) -> int | None:
        """The first offset whose max-so-far time is at or after ``time_ms`` (module docstring); None: no such record."""
        return offset_for_time(self._reader, self.name, partition, time_ms)

    def time_runs(self, partition: int, start: int, stop: int) -> list[tuple[int, int]]:
        """The times of records ``start <= offset < stop`` as runs (first offset, time ms; -1 = none)."""
        return time_runs(self._reader, self.name, partition, start, stop)

    def _slice(self, partition: int, start: int, end: int | None, max_bytes: int) -> tuple[Slice, int, bool]:
        """Records ``max(start, partition start) <= offset < end`` (:func:`pstate.depot_batches.read_slice`),
        where the range read stops (``end`` clamped to the partition's end), and whether the partition is
        key-compacted (:meth:`compacted`: its offsets may have gaps)."""
        check_partition(partition)
        check_offset(start, "start")
        info = self.partition_info(partition)
        stop = info.end if end is None else min(check_offset(end, "end"), info.end)
        compacted = self.compacted(partition)
        with rocks_errors("read", self._store.path):
            first = max(start, info.start)
            if not compacted and stop > first:
                fast = self._record_keys_slice(partition, first, stop, max_bytes)
                if fast is not None:
                    return fast, stop, False
            return read_slice(self._reader, self._cf, partition, first, stop, info.end, max_bytes,
                              not compacted), stop, compacted

    def _record_keys_slice(self, partition: int, first: int, stop: int, max_bytes: int) -> Slice | None:
        """Records ``first <= offset < stop`` of a partition holding only record keys (module docstring), read
        as values alone; None: not such a partition, or a trim ran between the reads (read it key by key)."""
        p = check_partition(partition)
        reader = self._reader
        if not isinstance(reader, DbReader) or reader.get(META, batched_key(self.name, p)) is not None:
            return None  # (read after the bounds: a batch below `stop` was applied with its mark before them)
        lo = p + first.to_bytes(8, "big")
        got = reader.values(self._cf, lo, p + stop.to_bytes(8, "big"), stop - first, max_bytes)
        # Offsets are dense and trims only ever remove a prefix: if `first` is still there, the values began at it.
        if not got or (len(got) < stop - first and sum(map(len, got)) < max_bytes) or reader.get(self._cf, lo) is None:
            return None
        return Slice([(first, len(got))], PackedRecords.of(got), len(got) < stop - first)

    def read(self, partition: int, start: int, end: int | None = None,
             max_bytes: int = 1 << 20) -> list[tuple[int, Any]]:
        """Records ``start <= offset < end`` as (offset, record), stopping once ``max_bytes`` are read.

        At least one record is returned if any is in range, so a record larger
        than ``max_bytes`` never stalls a reader.
        """
        sl, _stop, _compacted = self._slice(partition, start, end, max_bytes)
        return list(zip(sl.offsets(), unpack_many([sl.records.data]), strict=True))

    def read_packed(self, partition: int, start: int, end: int | None = None, max_bytes: int = 1 << 20
                    ) -> tuple[PackedRecords, int, int, list[int]]:
        """The records of :meth:`read` as stored, packed (a reply carries them as they are, the reader decodes
        them once, at the far end): ``(records, first, next, offsets)``.

        ``offsets`` is empty when the offsets are dense (``first .. next - 1``); a key-compacted partition's
        read lists them, and its ``next`` is past the gap after the last record when the read reached ``end``
        or the partition's end (:meth:`read_sparse`).
        """
        sl, stop, compacted = self._slice(partition, start, end, max_bytes)
        if compacted:
            offsets = sl.offsets()
            nxt = offsets[-1] + 1 if sl.full else max(start, stop)
            return sl.records, offsets[0] if offsets else nxt, nxt, offsets
        if not sl.spans:
            return sl.records, start, start, []
        assert len(sl.spans) == 1, f"depot {self.name}[{partition}] offsets are not dense: {sl.spans[:4]}"
        first, n = sl.spans[0]
        return sl.records, first, first + n, []

    def read_raw(self, partition: int, start: int, end: int | None = None,
                 max_bytes: int = 1 << 20) -> tuple[int, int, list[bytes]]:
        """Like :meth:`read` but the records as stored (msgpack bytes): ``(first, next, records)``; the
        partition's offsets are dense (not key-compacted)."""
        records, first, nxt, _ = self.read_packed(partition, start, end, max_bytes)
        return first, nxt, records.split()

    def compacted(self, partition: int) -> bool:
        """Key compaction ran on the partition (pstate.compaction): its offsets may have gaps."""
        return self._reader.get(META, COMPACTION_CURSOR + self.name.encode() + b"\x00"
                                + check_partition(partition)) is not None

    def read_sparse(self, partition: int, start: int, end: int | None = None,
                    max_bytes: int = 1 << 20) -> tuple[list[int], list[bytes], int]:
        """Records of a partition that may have gaps (key compaction): ``(offsets, records, next)``, records as
        stored; ``next`` is where to read on (past the gap after the last record when the read reached ``end``
        or the partition's end)."""
        sl, stop, _compacted = self._slice(partition, start, end, max_bytes)
        offsets = sl.offsets()
        return offsets, sl.records.split(), offsets[-1] + 1 if sl.full else max(start, stop)


def depot_meta_key(name: str, p: bytes) -> bytes:
    return _DEPOT_META + name.encode() + b"\x00" + p


def read_partition_info(reader: Reader, name: str, partition: int) -> PartitionInfo:
    raw = reader.get(META, depot_meta_key(name, check_partition(partition)))
    return PartitionInfo(0, 0) if raw is None else decode_partition_meta(raw)[0]


def read_partition_meta(reader: Reader, name: str, partition: int) -> tuple[PartitionInfo, tuple[int, int] | None]:
    """The partition's bounds and its last time run (time, max-so-far time; None: no record has a time).

    A value written before it held the last run (16 or 24 bytes) is completed from the time index.
    """
    raw = reader.get(META, depot_meta_key(name, check_partition(partition)))
    if raw is None:
        return PartitionInfo(0, 0), None
    info, last, complete = decode_partition_meta(raw)
    return (info, last) if complete else (info, last_time(reader, name, partition, info.end))


def encode_partition_meta(info: PartitionInfo, last: tuple[int, int] | None) -> bytes:
    """The partition's ``_meta`` value, every field of it (the only writer; :func:`decode_partition_meta` reads it).

    ``start``, ``end``, ``appended_bytes`` (u64 each, big-endian), then, once a record has a time, the last
    time run's time and max-so-far time (i64 each), so an append reads one key.
    """
    head = info.start.to_bytes(8, "big") + info.end.to_bytes(8, "big") + info.appended_bytes.to_bytes(8, "big")
    return head if last is None else head + last[0].to_bytes(8, "big") + last[1].to_bytes(8, "big")


def decode_partition_meta(raw: bytes) -> tuple[PartitionInfo, tuple[int, int] | None, bool]:
    """(bounds, last time run, whether the value holds the run): :func:`encode_partition_meta`'s inverse.

    Older stores wrote 16 bytes (no byte count: 0) or 24 (no time run: the caller reads the time index).
    """
    assert len(raw) in (16, 24, 40), len(raw)
    info = PartitionInfo(int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:16], "big"),
                         int.from_bytes(raw[16:24], "big"))
    if len(raw) == 40:
        return info, (int.from_bytes(raw[24:32], "big"), int.from_bytes(raw[32:40], "big")), True
    return info, None, False


# ------------------------------------------------------------------------------------ record times


def check_time(time_ms: int, what: str = "timestamp_ms") -> int:
    if type(time_ms) is not int or not 0 <= time_ms < _TIME:
        raise SchemaMismatch(what, "int milliseconds in [0, 2**63)", repr(time_ms))
    return time_ms


def time_key(name: str, p: bytes, first: int) -> bytes:
    """The ``_meta`` key of the time run starting at depot offset ``first`` of partition ``p``."""
    return _DEPOT_TIME + name.encode() + b"\x00" + p + first.to_bytes(8, "big")


def _run_at(reader: Reader, name: str, p: bytes, offset: int) -> tuple[int, int, int] | None:
    """(first offset, time, max-so-far time) of the run holding ``offset``; None: no run at or before it."""
    lo = time_key(name, p, 0)
    for k, v in reader.scan(META, lo, time_key(name, p, offset) + b"\x00", reverse=True):
        return int.from_bytes(k[-8:], "big"), int.from_bytes(v[:8], "big"), int.from_bytes(v[8:16], "big")
    return None


def last_time(reader: Reader, name: str, partition: int, end: int) -> tuple[int, int] | None:
    """(time, max-so-far time) of the partition's last run (records below ``end``); None: no run yet."""
    if end == 0:
        return None
    run = _run_at(reader, name, check_partition(partition), end - 1)
    return None if run is None else (run[1], run[2])


def time_run(name: str, p: bytes, first: int, time_ms: int, last: tuple[int, int] | None
             ) -> tuple[tuple[bytes, bytes] | None, tuple[int, int]]:
    """The ``_meta`` put recording that the records from ``first`` on have ``time_ms`` (None: the last run's
    time already), and the partition's last run afterwards (time, max-so-far time).

    ``last`` is the partition's last run before (:func:`read_partition_meta`).
    The caller puts the pair in the entry it builds (the leader decides; replicas copy).
    """
    check_time(time_ms)
    if last is not None and last[0] == time_ms:
        return None, last
    most = time_ms if last is None else max(last[1], time_ms)
    return (time_key(name, p, first), time_ms.to_bytes(8, "big") + most.to_bytes(8, "big")), (time_ms, most)


def times_below(reader: Reader, name: str, p: bytes, new_start: int) -> tuple[bytes, bytes] | None:
    """The ``_meta`` key range of time runs no record at or after ``new_start`` needs (a trim deletes it)."""
    run = _run_at(reader, name, p, new_start)
    if run is None or run[0] == 0:
        return None
    return time_key(name, p, 0), time_key(name, p, run[0])


def record_time(reader: Reader, name: str, partition: int, offset: int) -> int | None:
    """The time (ms) of the record at ``offset`` (which the caller knows exists); None: stored without one."""
    run = _run_at(reader, name, check_partition(partition), check_offset(offset, "offset"))
    return None if run is None else run[1]


def time_runs(reader: Reader, name: str, partition: int, start: int, stop: int) -> list[tuple[int, int]]:
    """Runs ``(first offset, time ms)`` covering ``[start, stop)``, the first at ``start``; -1: no time."""
    p = check_partition(partition)
    if stop <= start:
        return []
    run = _run_at(reader, name, p, check_offset(start, "start"))
    out = [(start, -1 if run is None else run[1])]
    for k, v in reader.scan(META, time_key(name, p, start + 1), time_key(name, p, stop)):
        out.append((int.from_bytes(k[-8:], "big"), int.from_bytes(v[:8], "big")))
    return out


def offset_for_time(reader: Reader, name: str, partition: int, time_ms: int) -> int | None:
    """The first offset of ``partition`` whose max-so-far time is ``>= time_ms``; None when no record has one.

    A binary search over offsets (the max-so-far time never decreases with the
    offset), one index seek per step: about 2 log2(records) seeks, done once per
    query plan or retention check, never per record.
    """
    check_time(time_ms, "time_ms")
    info = read_partition_info(reader, name, partition)
    p = check_partition(partition)
    lo, hi = info.start, info.end  # the answer is in [lo, hi]; hi == end means none
    while lo < hi:
        mid = (lo + hi) // 2
        run = _run_at(reader, name, p, mid)
        if run is not None and run[2] >= time_ms:
            hi = max(run[0], lo)  # every record of the run has this max-so-far time
        else:
            lo = mid + 1
    return lo if lo < info.end else None
