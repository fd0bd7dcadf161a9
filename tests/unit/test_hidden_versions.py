"""The flush for scans (pstate/hidden_versions.py): a store whose whole-PState scans stepped over as many old
versions as a flush costs is flushed, atomically, and its scans then read one version per key."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path as FsPath
from types import SimpleNamespace
from typing import Any

from conductor.wire import millrace_pb2 as pb
from conductor.worker.query_service import QueryService
from pstate import Map, Set, TaskGroupStore
from pstate.engine import top_key
from pstate.hidden_versions import HiddenVersions
from topology import Module
from topology.combiners import top_n
from topology.query import QueryRun, run_calls

MEMTABLE = "rocksdb.num-entries-active-mem-table"


def test_the_debt_is_what_scans_stepped_over_and_a_flush_clears_it() -> None:
    h = HiddenVersions(flush_cost=100)
    assert not h.scanned("a", entries=60, keys=10) and h.debt == 50
    assert not h.scanned("a", entries=10, keys=20) and h.debt == 0  # fewer entries: flushed meanwhile
    assert not h.scanned("a", entries=70, keys=10) and not h.scanned("b", entries=5, keys=10)  # (never negative)
    assert h.scanned("a", entries=80, keys=10)  # 60 + 70 >= 100: due, once
    assert not h.scanned("a", entries=900, keys=10)  # already asked for
    h.flushed()
    assert h.debt == 0 and not h.scanned("a", entries=50, keys=10)


class Counts(Module):
    def define(self, m):
        m.pstate("$$counts", Map(str, int))

        @m.query("top", every_task=True, combine=top_n(3, key=1))
        def top(q):
            return q.scan("$$counts")

        @m.query("part", every_task=True, combine=top_n(3, key=1))
        def part(q):
            return q.scan("$$counts", "w00", "w10")


def _overwrite(store: TaskGroupStore, rounds: int) -> None:
    """20 keys, each overwritten ``rounds`` times, one entry per round (as a counting topology does): key
    ``w07`` holds ``offset * 100 + 7``."""
    for _ in range(rounds):
        offset = store.applied_offset + 1
        b = store.changes()
        for i in range(20):
            b.set("$$counts", f"w{i:02d}", offset * 100 + i)
        store.apply(offset, b.changeset())


def test_whole_scans_flush_once_the_versions_cost_a_flush(tmp_path: FsPath) -> None:
    store = TaskGroupStore(tmp_path / "s", {"$$counts": Map(str, int), "$$tags": Set(str)})
    try:
        store.hidden_versions = HiddenVersions(flush_cost=1000)
        _overwrite(store, 30)  # 600 entries in the memtable, 20 live keys: a scan steps over 580
        cf = store._cfs["pstate:$$counts"]
        assert cf.property_int_value(MEMTABLE) == 600
        definition = Counts.build()

        def query(name: str = "top", best: int = 19) -> QueryRun:
            run = QueryRun(definition, store, 4, 1, 0, name, time.monotonic() + 5, 5)
            result, _ = run_calls(run, [(t, name, []) for t in range(4)])
            assert result == [(f"w{i:02d}", store.applied_offset * 100 + i) for i in (best, best - 1, best - 2)]
            return run

        assert not query().flush_due  # 580 stepped over
        assert query().flush_due  # 1,160: a flush is due
        assert not query().flush_due  # (asked for once)
        store.flush_for_scans()
        assert cf.property_int_value(MEMTABLE) == 0 and store.hidden_versions.debt == 0
        assert not query().flush_due
        assert store.select_one("$$counts", "w07") == 2907  # the newest versions were kept
        # a scan of part of the PState says nothing (the memtable's other keys may be anywhere)
        _overwrite(store, 60)
        assert not any(query("part", 9).flush_due for _ in range(5)) and store.hidden_versions.debt == 0
        assert not store.scanned_whole("$$tags", 0)  # not a map: never counted
    finally:
        store.close()


class _Modules:
    """What QueryService uses of LocalModules: one module's leader of group 0, on ``store``."""

    def __init__(self, store: TaskGroupStore) -> None:
        spec = SimpleNamespace(tasks=4, threads=1, module_ref="tests.unit.test_hidden_versions:Counts",
                               version="path:", group_of=lambda t: 0)
        replica = SimpleNamespace(code=None, current=lambda: store)
        self.rt = SimpleNamespace(spec=spec)
        self.lead = SimpleNamespace(spec=spec, store=replica, host=SimpleNamespace(name="w1"))

    def get(self, module: str) -> Any:
        return self.rt

    def leader(self, module: str, group: int) -> Any:
        return self.lead


def test_a_streamed_scan_of_the_whole_pstate_counts_and_the_flush_runs_on_a_query_thread(tmp_path: FsPath) -> None:
    store = TaskGroupStore(tmp_path / "s", {"$$counts": Map(str, int)})
    service = QueryService(_Modules(store), lambda host: contextlib.nullcontext())  # type: ignore[arg-type]
    try:
        store.hidden_versions = HiddenVersions(flush_cost=1000)
        _overwrite(store, 30)  # a scan steps over 580

        def scan(request: pb.ScanRequest) -> None:
            page, after = service._page_reader(request), request.after or None  # (as scan_stream starts)
            while (reply := page(after)).after:  # (pages of 7: a walk of three)
                after = reply.after

        scan(pb.ScanRequest(module="m", pstate="$$counts", all_tasks=True, limit=7, packed=True, start=b"\xa3w05"))
        scan(pb.ScanRequest(module="m", pstate="$$counts", all_tasks=True, limit=7, after=top_key(str, "w03")))
        assert store.hidden_versions.debt == 0  # part of the PState: nothing reported
        scan(pb.ScanRequest(module="m", pstate="$$counts", all_tasks=True, limit=7, packed=True))
        assert store.hidden_versions.debt == 580
        scan(pb.ScanRequest(module="m", pstate="$$counts", task=1, limit=7))  # one task's keys: the whole range read
        service._pool.shutdown(wait=True)  # (the flush was handed to a query thread)
        assert store._cfs["pstate:$$counts"].property_int_value(MEMTABLE) == 0 and store.hidden_versions.debt == 0
    finally:
        store.close()
