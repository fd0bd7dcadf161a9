"""A worker's side of depot retention: when its leaders check, and giving trimmed disk space back.

One thread per worker (:class:`RetentionDriver`). Every ``depot.retention.check.interval.ms`` it posts a
:class:`RetentionCheck` to each local leader whose depots have a bound or compaction (read from the live
spec at each check, so ``conductor set-option`` applies at the next one), and sooner when a partition is
over its size bound (looked at every tick: a fast writer must not overshoot by an interval's writes), at
most one in flight per group. The check's reads run here, not on the task thread that serves the writers'
appends: this thread decides each bounded partition's mark and trim from the leader's applied state
(:func:`topology.entries.retention.plan_retention_check`) and posts them; the leader's task thread writes them
into one bounded entry (a mark per partition, the due trims, and at most ``CHECK_COMPACTION_LIMIT`` records of
key compaction, which it still reads itself), unless a partition moved since (the next check plans it again),
and every replica applies the same range deletes.

A range delete hides records at once but frees no disk until RocksDB compacts the files holding them, which
with a steady writer may take long (the deleted keys are below every new one). So the thread also watches
the start offset of every partition of every replica it hosts (leaders and followers) and, when one moved,
compacts the trimmed key range of that depot's column family once it holds as many bytes as the partition
keeps (:func:`pstate.retention.compaction_due`: the files of a bounded depot stay within about twice its
bytes, and each compaction rewrites about what was trimmed since the last one), and once the trims' range
tombstones have left the active memtable (:mod:`pstate.trimmed_ranges`: no compaction forces a flush, and
records trimmed before their flush never reach disk; after a few seconds without a switch, anyway): one range
per tick (bounded background I/O, off the task threads), most trimmed first.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from conductor.metastore.depot_options import CHECK_COMPACTION_LIMIT, CHECK_INTERVAL_MS
from conductor.wire import millrace_pb2 as pb
from conductor.worker.hosted import HostedReplica
from conductor.worker.pending_entry import PendingEntry
from conductor.worker.runtime import LocalModules, ModuleRuntime
from pstate import TaskGroupStore
from pstate.depot_batches import key_span
from pstate.depots import depot_cf
from pstate.retention import RetentionPolicy, partition_size
from pstate.trimmed_ranges import DueRange, PartitionView, TrimmedRanges
from replog.messages import Ack
from topology.entries.requests import RetentionCheck
from topology.entries.retention import plan_retention_check

log = logging.getLogger("millrace.node")

#: how often the thread looks at its leaders' partitions (a few ``_meta`` reads each) and for trimmed ranges to
#: compact (one range per tick)
TICK_S = 0.05


def depot_partitions(rec: HostedReplica | None) -> list[pb.DepotPartitionSize]:
    """GroupStatus's depot partitions of a replica hosted here (none while it is not open)."""
    if rec is None or rec.store is None:
        return []
    return [pb.DepotPartitionSize(depot=d, task=t, start=s.start, end=s.end, records=s.records, bytes=s.bytes)
            for d, t, s in rec.store.depot_sizes()]


def over_bound(reader: Any, policies: dict[str, RetentionPolicy], tasks: list[int]) -> bool:
    """A partition holds more bytes than its bound: check now, not at the next interval (a fast writer
    would otherwise overshoot by what it writes in one interval)."""
    return any(partition_size(reader, d, t).bytes > p.retention_bytes
               for d, p in policies.items() if p.retention_bytes for t in tasks)


def policy(settings: dict[str, int]) -> RetentionPolicy:
    """A depot's policy from its settings (``ModuleSpec.depot_settings``)."""
    return RetentionPolicy(settings["retention_ms"], settings["retention_bytes"], bool(settings["compaction"]),
                           settings["delete_retention_ms"])


class RetentionDriver:
    """See the module docstring."""

    def __init__(self, modules: LocalModules) -> None:
        self.modules = modules
        self._stopped = threading.Event()
        self._next_check: dict[tuple[str, int], float] = {}
        self._in_flight: set[tuple[str, int]] = set()
        #: what each hosted depot partition trimmed, compacted and flushed: keyed (module, group, depot, task),
        #: families (module, group, depot)
        self._trimmed: TrimmedRanges[tuple[str, int, str, int]] = TrimmedRanges()
        #: trimmed ranges compacted, bytes of live SST files seen to go (metrics)
        self.ranges_compacted = 0
        self._thread = threading.Thread(target=self._run, name="depot-retention", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(TICK_S):
            runtimes = self.modules.runtimes()
            live = {rt.spec.name for rt in runtimes}
            # a destroyed module's keys go with it
            self._next_check = {k: v for k, v in self._next_check.items() if k[0] in live}
            self._trimmed.forget(lambda key, names=live: key[0] in names)  # type: ignore[misc]
            for rt in runtimes:
                try:
                    self._checks(rt)
                    self._compact_one(rt)
                except Exception:  # a closed store (a replica restarting) and the like: next tick
                    log.debug("module %s: retention tick failed; trying again", rt.spec.name, exc_info=True)

    # ------------------------------------------------------------------ leaders: retention checks

    def _checks(self, rt: ModuleRuntime) -> None:
        spec = rt.spec
        now = time.monotonic()
        for rec in list(rt.hosted.values()):
            host, store = rec.host, rec.store
            key = (spec.name, rec.group)
            if host is None or store is None or not host.replica.is_leader or key in self._in_flight:
                continue
            policies = {d: p for d in store.current().depots if (p := policy(spec.depot_settings(d))).bounded
                        or p.compaction}
            tasks = spec.tasks_of(rec.group)
            if not policies or (now < self._next_check.get(key, 0.0)
                                and not over_bound(store.current().applied_reader(), policies, tasks)):
                continue
            self._next_check[key] = now + spec.option(CHECK_INTERVAL_MS) / 1000
            current = store.current()
            request = plan_retention_check(current.applied_reader(), current.depots, int(time.time() * 1000), tasks,
                                           policies, CHECK_COMPACTION_LIMIT)
            if request is not None:
                self._post(rec, key, request)

    def _post(self, rec: HostedReplica, key: tuple[str, int], request: RetentionCheck) -> None:
        host = rec.host
        assert host is not None
        self._in_flight.add(key)

        def done(_offset: int, _result: Any, error: Exception | None) -> None:
            self._in_flight.discard(key)
            if error is not None:
                log.info("%s: a retention check was not appended (%s); next interval", host.name, error)
        host.post(PendingEntry(request, 0, Ack.NONE, done))

    # ------------------------------------------------------------------ every replica: disk space back

    def _compact_one(self, rt: ModuleRuntime) -> None:
        """Compact the largest trimmed range due (:mod:`pstate.trimmed_ranges`) of any replica of ``rt`` hosted
        here."""
        now = time.monotonic()
        best: tuple[DueRange[tuple[str, int, str, int]], TaskGroupStore, str] | None = None
        for rec in list(rt.hosted.values()):
            if rec.store is None or not rec.store.created:  # (not created yet: empty, and not created for this)
                continue
            store = rec.store.current()
            reader = store.applied_reader()
            for depot in store.depots:
                views = {}
                for task in rt.spec.tasks_of(rec.group):
                    views[(rt.spec.name, rec.group, depot, task)] = PartitionView.read(reader, depot, task)
                # (the partitions first, then the memtable: pstate.trimmed_ranges.TrimmedRanges.look)
                entries = store.memtable_entries(depot_cf(depot))
                for r in self._trimmed.look((rt.spec.name, rec.group, depot), entries, now, views):
                    if best is None or r.trimmed > best[0].trimmed:
                        best = (r, store, depot)
        if best is None:
            return
        r, store, depot = best
        task = r.partition[3]
        store.compact_range(depot_cf(depot), *key_span(task, r.lo, r.hi))
        self._trimmed.compacted(r)
        self.ranges_compacted += 1
