"""A depot's partitions in a task group's store: the record keys, the partition bounds in ``_meta``, reads.

Depot records live in their own column family, keyed by partition (u32) and offset (u64), big-endian, so
one partition's records are one contiguous, ordered range; ``_meta`` holds each partition's
``[start, end)`` and the bytes ever appended to it (what retention by size measures, :mod:`pstate.retention`). Writes go through ``ChangeSetBuilder`` (pstate.store); this module has the layout and
the reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pstate.engine import unpack
from pstate.errors import SchemaMismatch, rocks_errors
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
_U32 = 1 << 32
_U64 = 1 << 64


def depot_cf(name: str) -> str:
    return "depot:" + name


@dataclass(frozen=True)
class PartitionInfo:
    """Offsets held by one depot partition: records ``start <= offset < end``.

    ``appended_bytes`` counts the bytes of every record ever appended (0 for partitions written before it was
    kept); a trim leaves it as it is, so bytes between two offsets are a difference of two counts.
    """

    start: int
    end: int
    appended_bytes: int = 0

    def encode(self) -> bytes:
        """The ``_meta`` value (24 bytes, big-endian; stores written before the byte count hold 16)."""
        return self.start.to_bytes(8, "big") + self.end.to_bytes(8, "big") + self.appended_bytes.to_bytes(8, "big")


def check_partition(partition: int) -> bytes:
    if type(partition) is not int or not 0 <= partition < _U32:
        raise SchemaMismatch("partition", "int in [0, 2**32)", repr(partition))
    return partition.to_bytes(4, "big")


def check_offset(offset: int, what: str) -> int:
    if type(offset) is not int or not 0 <= offset < _U64:
        raise SchemaMismatch(what, "int in [0, 2**64)", repr(offset))
    return offset


class DepotView:
    """Reads of one depot's per-partition logs (key = partition u32 + offset u64, big-endian)."""

    def __init__(self, store: TaskGroupStore, name: str, reader: Reader) -> None:
        self._store = store
        self.name = name
        self._reader = reader
        self._cf = depot_cf(name)

    def partition_info(self, partition: int) -> PartitionInfo:
        return read_partition_info(self._reader, self.name, partition)

    def read(self, partition: int, start: int, end: int | None = None,
             max_bytes: int = 1 << 20) -> list[tuple[int, Any]]:
        """Records ``start <= offset < end`` as (offset, record), stopping once ``max_bytes`` are read.

        At least one record is returned if any is in range, so a record larger
        than ``max_bytes`` never stalls a reader.
        """
        p = check_partition(partition)
        check_offset(start, "start")
        hi = p + (check_offset(end, "end").to_bytes(8, "big") if end is not None else b"\xff" * 8)
        out: list[tuple[int, Any]] = []
        total = 0
        for k, v in self._reader.scan(self._cf, p + start.to_bytes(8, "big"), hi):
            out.append((int.from_bytes(k[4:], "big"), unpack(v)))
            total += len(v)
            if total >= max_bytes:
                break
        return out

    def read_raw(self, partition: int, start: int, end: int | None = None,
                 max_bytes: int = 1 << 20) -> tuple[int, int, list[bytes]]:
        """Like :meth:`read` but the records as stored (msgpack bytes): ``(first, next, records)``.

        Serving reads over the network needs no decoding here; the reader decodes
        once, at the far end.
        """
        p = check_partition(partition)
        check_offset(start, "start")
        if end is not None:
            check_offset(end, "end")
        if isinstance(self._reader, DbReader) and not self.compacted(partition):
            # Offsets are dense in [info.start, info.end): the count says which records came back.
            info = self.partition_info(partition)
            first = max(start, info.start)
            stop = info.end if end is None else min(end, info.end)
            if stop <= first:
                return start, start, []
            lo = p + first.to_bytes(8, "big")
            got = self._reader.values(self._cf, lo, p + stop.to_bytes(8, "big"), stop - first, max_bytes)
            # Trims only ever remove a prefix: if `first` is still there, the values started at it.
            if (got and (len(got) == stop - first or sum(map(len, got)) >= max_bytes)
                    and self._reader.get(self._cf, lo) is not None):
                return first, first + len(got), got
            # A trim ran between the reads (or the records are not what the partition info says): read by key.
        hi = p + (end.to_bytes(8, "big") if end is not None else b"\xff" * 8)
        out: list[bytes] = []
        first_key = last_key = b""
        total = 0
        with rocks_errors("read", self._store.path):
            for k, v in self._reader.scan(self._cf, p + start.to_bytes(8, "big"), hi):
                if not out:
                    first_key = k
                last_key = k
                out.append(v)
                total += len(v)
                if total >= max_bytes:
                    break
        if not out:
            return start, start, out
        first = int.from_bytes(first_key[4:], "big")
        nxt = int.from_bytes(last_key[4:], "big") + 1
        assert nxt - first == len(out), f"depot {self.name}[{partition}] offsets are not dense in [{first}, {nxt})"
        return first, nxt, out

    def compacted(self, partition: int) -> bool:
        """Key compaction ran on the partition (pstate.compaction): its offsets may have gaps."""
        return self._reader.get(META, COMPACTION_CURSOR + self.name.encode() + b"\x00"
                                + check_partition(partition)) is not None

    def read_sparse(self, partition: int, start: int, end: int | None = None,
                    max_bytes: int = 1 << 20) -> tuple[list[int], list[bytes], int]:
        """Records of a partition that may have gaps (key compaction): ``(offsets, records, next)``, records as
        stored; ``next`` is where to read on (past the gap after the last record when the read reached ``end``
        or the partition's end)."""
        p = check_partition(partition)
        check_offset(start, "start")
        info = self.partition_info(partition)
        stop = info.end if end is None else min(check_offset(end, "end"), info.end)
        offsets: list[int] = []
        out: list[bytes] = []
        total = 0
        with rocks_errors("read", self._store.path):
            for k, v in self._reader.scan(self._cf, p + start.to_bytes(8, "big"), p + stop.to_bytes(8, "big")):
                offsets.append(int.from_bytes(k[4:], "big"))
                out.append(v)
                total += len(v)
                if total >= max_bytes:
                    return offsets, out, offsets[-1] + 1
        return offsets, out, max(start, stop)


def depot_meta_key(name: str, p: bytes) -> bytes:
    return _DEPOT_META + name.encode() + b"\x00" + p


def read_partition_info(reader: Reader, name: str, partition: int) -> PartitionInfo:
    raw = reader.get(META, depot_meta_key(name, check_partition(partition)))
    if raw is None:
        return PartitionInfo(0, 0)
    return PartitionInfo(int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:16], "big"),
                         int.from_bytes(raw[16:24], "big"))
