"""Which trimmed depot range to compact, and when: ranges whose trims RocksDB has already flushed.

A trim hides records with a range tombstone; disk space returns when RocksDB compacts the files holding
them (:func:`pstate.retention.compaction_due` says when a partition's trimmed range is worth it). But RocksDB
flushes a memtable that overlaps a range before compacting it, and the trim's own tombstone sits in the
active memtable: compacting right after a trim forced a flush of a small memtable every time, and that
compaction rewrote the live records of the L0 file it made (bench.retention: each compaction read the new
7.7 MB L0 file and the last output and wrote the 7.7 MB still live). So a range is compacted only once its
trims' tombstones have left the active memtable, which this module learns by watching the memtable's entry
count drop (a switch). That costs nothing and wastes nothing: records trimmed while still in the memtable
are dropped by its flush (a flush applies the memtable's own tombstones) and never reach disk, and the
compaction reads only files flushed before their trim.

A writer that stops leaves its last trims in the memtable for good, and a small one fills a memtable
slowly: a range due for longer than :data:`FLUSH_WAIT_S` without a switch is compacted anyway, flush and
all, so disk space still comes back (a ``conductor trim`` of an idle depot) within seconds.

Pure bookkeeping on the caller's clock and readings (the retention driver's thread, bench.retention).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from pstate.depots import read_partition_info
from pstate.engine import Reader
from pstate.retention import compaction_due, live_bytes, read_state

K = TypeVar("K", bound=Hashable)

#: how long a due range waits for its memtable to switch before it is compacted anyway (flushing it)
FLUSH_WAIT_S = 5.0


@dataclass(frozen=True)
class PartitionView:
    """A partition as the caller read it from applied state, before it read its family's memtable."""

    start: int
    #: bytes appended below ``start`` (``RetentionState.start_bytes``)
    start_bytes: int
    #: bytes the partition keeps (``pstate.retention.live_bytes``)
    live_bytes: int

    @classmethod
    def read(cls, reader: Reader, depot: str, partition: int) -> PartitionView:
        """The partition as ``reader`` (applied state) holds it: its meta and retention state, each read once."""
        info, state = read_partition_info(reader, depot, partition), read_state(reader, depot, partition)
        return cls(info.start, state.start_bytes, live_bytes(info, state))


@dataclass(frozen=True)
class DueRange(Generic[K]):
    """Offsets ``[lo, hi)`` of one partition to compact; ``trimmed`` bytes of records in it."""

    partition: K
    lo: int
    hi: int
    hi_bytes: int
    trimmed: int
    #: the range reaches into trims still in the active memtable (a flush first): :data:`FLUSH_WAIT_S` passed
    flushes: bool


@dataclass
class _Family:
    entries: int
    switched_at: float
    #: memtable switches seen
    generation: int = 0


@dataclass
class _Partition:
    #: compacted below this offset; bytes appended below it
    done: int = 0
    done_bytes: int = 0
    #: (start, start_bytes) at the previous look, and its family's generation then
    seen: tuple[int, int] = (0, 0)
    seen_generation: int = 0
    #: (start, start_bytes) whose trims' tombstones have left the active memtable
    settled: tuple[int, int] = (0, 0)


class TrimmedRanges(Generic[K]):
    """Per column family (a depot of one store), its partitions' compacted and settled trims."""

    def __init__(self, flush_wait_s: float = FLUSH_WAIT_S) -> None:
        self.flush_wait_s = flush_wait_s
        self._families: dict[Hashable, _Family] = {}
        self._partitions: dict[K, _Partition] = {}

    def look(self, family: Hashable, entries: int, now: float,
             partitions: Mapping[K, PartitionView]) -> list[DueRange[K]]:
        """One look at ``family``: its active memtable's entry count, read AFTER its ``partitions`` (keys unique
        across families). Returns the ranges due now (at most one per partition)."""
        assert entries >= 0, entries
        fam = self._families.get(family)
        if fam is None:
            fam = self._families[family] = _Family(entries, now)
        elif entries < fam.entries:
            fam.generation += 1  # the memtable switched since the last look
            fam.switched_at = now
        fam.entries = entries
        due = []
        for key, view in partitions.items():
            p = self._partitions.get(key)
            if p is None:
                p = self._partitions[key] = _Partition(seen_generation=fam.generation)
            elif p.seen_generation < fam.generation:
                # what the previous look read was applied before that look's entry count, so before the switch
                p.settled = max(p.settled, p.seen)
            if entries == 0:  # an empty memtable: every trim applied before this look is flushed
                p.settled = max(p.settled, (view.start, view.start_bytes))
            p.seen, p.seen_generation = (view.start, view.start_bytes), fam.generation
            r = self._due(key, p, view, fam, now)
            if r is not None:
                due.append(r)
        return due

    def _due(self, key: K, p: _Partition, view: PartitionView, fam: _Family,
             now: float) -> DueRange[K] | None:
        start, start_bytes = p.settled
        if start > p.done and compaction_due(start_bytes - p.done_bytes, view.live_bytes):
            return DueRange(key, p.done, start, start_bytes, start_bytes - p.done_bytes, False)
        if (view.start > p.done and now - fam.switched_at >= self.flush_wait_s
                and compaction_due(view.start_bytes - p.done_bytes, view.live_bytes)):
            return DueRange(key, p.done, view.start, view.start_bytes, view.start_bytes - p.done_bytes, True)
        return None

    def compacted(self, r: DueRange[K]) -> None:
        """``r`` was compacted: the partition's next range starts at its end."""
        p = self._partitions[r.partition]
        assert r.hi > p.done, (r, p)
        p.done, p.done_bytes = r.hi, r.hi_bytes
        if r.flushes:
            p.settled = max(p.settled, (r.hi, r.hi_bytes))

    def forget(self, keep: Callable[[Hashable], bool]) -> None:
        """Drop the families and partitions whose keys ``keep`` refuses (a destroyed module's)."""
        self._families = {k: v for k, v in self._families.items() if keep(k)}
        self._partitions = {k: v for k, v in self._partitions.items() if keep(k)}
