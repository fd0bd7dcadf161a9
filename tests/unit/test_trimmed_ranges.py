"""Which trimmed ranges the retention driver compacts, and when (pstate.trimmed_ranges): the rule alone, then on
a real RocksDB store, where a range whose trims were flushed compacts without flushing the memtable."""

from __future__ import annotations

import os
from typing import Any

from pstate.depot_batches import key_span
from pstate.depots import depot_cf
from pstate.retention import MIN_COMPACTION_BYTES, trim
from pstate.store import TaskGroupStore
from pstate.trimmed_ranges import FLUSH_WAIT_S, PartitionView, TrimmedRanges
from tests.unit.depot_store import Applier, D

MB = 1 << 20


def view(start: int, start_bytes: int, live: int = MB) -> dict[str, PartitionView]:
    return {"p": PartitionView(start, start_bytes, live)}


def test_a_trim_still_in_the_memtable_waits_for_a_switch() -> None:
    t: TrimmedRanges[str] = TrimmedRanges()
    assert t.look("f", 10, 0.0, view(0, 0)) == []
    # trimmed 2 MB (due by size), but its tombstone is in the active memtable: not yet
    assert t.look("f", 20, 0.05, view(100, 2 * MB)) == []
    assert t.look("f", 30, 0.10, view(100, 2 * MB)) == []
    # the memtable switched (fewer entries): what the previous look saw is flushed
    [r] = t.look("f", 3, 0.15, view(100, 2 * MB))
    assert (r.partition, r.lo, r.hi, r.trimmed, r.flushes) == ("p", 0, 100, 2 * MB, False)
    t.compacted(r)
    assert t.look("f", 5, 0.20, view(100, 2 * MB)) == []  # nothing new


def test_only_the_trims_seen_before_the_switch_are_settled() -> None:
    t: TrimmedRanges[str] = TrimmedRanges()
    t.look("f", 10, 0.0, view(0, 0))
    t.look("f", 20, 0.05, view(100, 2 * MB))
    # a switch, and a later trim read in the same look: that one may be in the new memtable
    [r] = t.look("f", 1, 0.10, view(300, 6 * MB))
    assert (r.lo, r.hi, r.flushes) == (0, 100, False)
    t.compacted(r)
    assert t.look("f", 9, 0.15, view(300, 6 * MB)) == []
    [r] = t.look("f", 2, 0.20, view(300, 6 * MB))  # the next switch settles it
    assert (r.lo, r.hi, r.trimmed, r.flushes) == (100, 300, 4 * MB, False)


def test_a_range_due_too_long_without_a_switch_is_compacted_anyway() -> None:
    t: TrimmedRanges[str] = TrimmedRanges()
    t.look("f", 10, 0.0, view(0, 0))
    assert t.look("f", 11, FLUSH_WAIT_S - 0.1, view(50, 2 * MB)) == []
    [r] = t.look("f", 12, FLUSH_WAIT_S, view(50, 2 * MB))
    assert (r.lo, r.hi, r.flushes) == (0, 50, True)
    t.compacted(r)
    assert t.look("f", 13, FLUSH_WAIT_S + 0.05, view(50, 2 * MB)) == []


def test_an_empty_memtable_holds_no_trim_and_small_ranges_wait() -> None:
    t: TrimmedRanges[str] = TrimmedRanges()
    [r] = t.look("f", 0, 0.0, view(40, 2 * MB))
    assert (r.lo, r.hi, r.flushes) == (0, 40, False)
    t.compacted(r)
    # less trimmed than the partition keeps (or than MIN_COMPACTION_BYTES): not worth a compaction yet
    assert t.look("f", 0, 1.0, view(60, 2 * MB + MIN_COMPACTION_BYTES // 2)) == []
    assert t.look("f", 0, 2.0, view(60, 3 * MB, live=4 * MB)) == []


def test_partitions_are_settled_by_their_own_family() -> None:
    t: TrimmedRanges[tuple[str, int]] = TrimmedRanges()
    a = {("a", 0): PartitionView(0, 0, MB)}
    b = {("b", 0): PartitionView(0, 0, MB)}
    t.look("fa", 10, 0.0, a)
    t.look("fb", 10, 0.0, b)
    a = {("a", 0): PartitionView(10, 2 * MB, MB)}
    b = {("b", 0): PartitionView(10, 2 * MB, MB)}
    t.look("fa", 20, 0.05, a)
    t.look("fb", 20, 0.05, b)
    assert [r.partition for r in t.look("fa", 1, 0.1, a)] == [("a", 0)]
    assert t.look("fb", 30, 0.1, b) == []
    t.forget(lambda key: key[0] != "a")  # type: ignore[index]
    assert t.look("fb", 1, 0.15, b) != []  # (its own state kept)


def _fill(run: Applier, n: int) -> None:
    """``n`` appends of 100 records of 1 KB that do not compress (RocksDB compresses its files)."""
    for _ in range(n):
        run(lambda b: b.depot_append(D, 0, [os.urandom(500).hex() for _ in range(100)]))


def _look(t: TrimmedRanges[int], store: TaskGroupStore, now: float) -> list[Any]:
    return t.look(D, store.memtable_entries(depot_cf(D)), now, {0: PartitionView.read(store.applied_reader(), D, 0)})


def test_on_rocksdb_a_settled_range_compacts_without_flushing_the_memtable(tmp_path: Any) -> None:
    with TaskGroupStore(tmp_path / "s", {}, [D]) as store:
        run = Applier(store)
        t: TrimmedRanges[int] = TrimmedRanges()
        _fill(run, 40)  # 4 MB, flushed below
        store.flush()
        assert _look(t, store, 0.0) == []  # (an empty memtable; nothing trimmed)
        end = store.depot(D).partition_info(0).end
        run(lambda b: trim(b, D, 0, end - 100, store.applied_reader()))
        _fill(run, 1)
        assert _look(t, store, 0.1) == []  # the trim's tombstone is in the active memtable
        store.flush()  # the memtable switches (and flushes)
        _fill(run, 1)
        [r] = _look(t, store, 0.2)
        assert (r.lo, r.hi, r.flushes) == (0, end - 100, False)
        before, in_memtable = store.live_sst_bytes(), store.memtable_entries(depot_cf(D))
        assert in_memtable > 0 and before > 3 * MB
        store.compact_range(depot_cf(D), *key_span(0, r.lo, r.hi))
        t.compacted(r)
        assert store.memtable_entries(depot_cf(D)) == in_memtable, "the compaction flushed the memtable"
        assert store.live_sst_bytes() < MB, store.live_sst_bytes()
        info = store.depot(D).partition_info(0)
        assert len(store.depot(D).read(0, info.start, max_bytes=1 << 30)) == info.end - info.start == 300


def test_on_rocksdb_a_range_with_its_trim_in_the_memtable_flushes_it_first(tmp_path: Any) -> None:
    """Why the rule exists: RocksDB flushes a memtable whose tombstone overlaps the range it compacts."""
    with TaskGroupStore(tmp_path / "s", {}, [D]) as store:
        run = Applier(store)
        _fill(run, 20)
        store.flush()
        end = store.depot(D).partition_info(0).end
        run(lambda b: trim(b, D, 0, end - 100, store.applied_reader()))
        assert store.memtable_entries(depot_cf(D)) > 0
        store.compact_range(depot_cf(D), *key_span(0, 0, end - 100))
        assert store.memtable_entries(depot_cf(D)) == 0
