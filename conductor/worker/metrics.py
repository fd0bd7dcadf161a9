"""Prometheus metrics of a worker node, read from the replicas at scrape time.

A collector (not counters bumped on the hot path) keeps the task threads free
of metrics work: each scrape reads the replicas' current state and counters.
Labels are `module` and `group`, so a dashboard can line up the three replicas
of a group and spot the one that lags. The latency histograms are the replicas'
own (:mod:`conductor.worker.timings`: weighted, lock-free observations on the
task thread), exported here as Prometheus histograms; the sizes in bytes are
read at scrape time (replog segments, RocksDB live SST files).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from conductor.worker.depot_metrics import DepotCollector
from conductor.worker.replica_faults import KINDS as FAULT_KINDS
from conductor.worker.replica_status import replica_status

log = logging.getLogger("millrace.node")

ROLES = ("leader", "follower", "unattached")

#: each histogram of conductor.worker.timings: Prometheus name, help, the names of its own labels
HISTOGRAMS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "append_to_ack": ("millrace_append_to_ack_seconds", "client append: request reached the worker -> answered at "
                      "its ack level (leaders)", ("ack",)),
    "replicate": ("millrace_replicate_duration_seconds", "replog entry: built by the leader -> applied by the "
                  "leader, per entry type", ("role", "type")),
    "apply": ("millrace_apply_duration_seconds", "replog entry applied to RocksDB (a drain's apply time split "
              "evenly over its entries), per role and entry type", ("role", "type")),
    "fsync": ("millrace_replog_fsync_seconds", "replog fsync (one per drain: group commit)", ("role",)),
    "marks_fsync": ("millrace_marks_fsync_seconds", "the wait for the storage marks' fsync after the replog's "
                    "returned (the two run side by side; replication.fsync=always)", ("role",)),
    "peer_round_trip": ("millrace_peer_round_trip_seconds", "leader: entries sent to a follower -> its ack "
                        "covering them", ()),
    "far_horizon_rate": ("millrace_far_horizon_transfer_bytes_per_second", "far-horizon transfer rate, "
                         "bytes/s over a whole transfer (followers)", ()),
}


class ReplicaCollector(Collector):
    """Exports every hosted replica's role, epoch, offsets, ISR size, lag and counters."""

    def __init__(self, node_id: str, replicas: Callable[[], Iterable[Any]]) -> None:
        self.node_id = node_id
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        labels = ["node", "module", "group"]
        role = GaugeMetricFamily("millrace_replica_role", "1 for the replica's current role", labels=[*labels, "role"])
        epoch = GaugeMetricFamily("millrace_replica_epoch", "leader epoch the replica is in", labels=labels)
        log_end = GaugeMetricFamily("millrace_replog_end_offset", "next offset the replog will write", labels=labels)
        log_start = GaugeMetricFamily("millrace_replog_start_offset", "first offset the replog holds", labels=labels)
        applied = GaugeMetricFamily("millrace_applied_offset", "last replog offset applied to RocksDB", labels=labels)
        isr = GaugeMetricFamily("millrace_isr_size", "in-sync replicas (leaders only)", labels=labels)
        stalled = GaugeMetricFamily("millrace_group_stalled", "1 while the ISR is below min-ISR (leaders)", labels=labels)
        lag = GaugeMetricFamily("millrace_follower_lag_entries", "entries a follower lacks (leaders report)",
                                labels=[*labels, "follower"])
        appends = CounterMetricFamily("millrace_appends", "client entries answered", labels=labels)
        entries = CounterMetricFamily("millrace_entries_applied", "replog entries applied", labels=labels)
        flushes = CounterMetricFamily("millrace_replog_flushes", "replog fsyncs (one per drain: group commit)",
                                      labels=labels)
        installs = CounterMetricFamily("millrace_far_horizon_installs", "far-horizon checkpoints installed",
                                       labels=labels)
        copied = CounterMetricFamily("millrace_far_horizon_bytes", "bytes copied by far-horizon catchup",
                                     labels=labels)
        refetched = CounterMetricFamily("millrace_far_horizon_refetched_files",
                                        "checkpoint files that arrived damaged and were fetched again", labels=labels)
        retained = CounterMetricFamily("millrace_replog_deleted_bytes", "replog bytes deleted by retention",
                                       labels=labels)
        dead = CounterMetricFamily("millrace_dead_letters", "records and hop messages moved to *dead_letters",
                                   labels=labels)
        in_flight = GaugeMetricFamily("millrace_hop_envelopes_in_flight",
                                      "hop envelopes sent and not yet complete (leaders)", labels=labels)
        waiting = GaugeMetricFamily("millrace_appends_waiting_for_hops",
                                    "applied appends answered once their hops are (leaders)", labels=labels)
        failed = GaugeMetricFamily("millrace_replica_failed", "1 while the replica is stopped by a fault and "
                                   "restarting (kind: corrupt, disk_full, internal)", labels=[*labels, "kind"])
        restarts = CounterMetricFamily("millrace_replica_restarts", "times the replica restarted itself after a fault",
                                       labels=labels)
        quarantined = CounterMetricFamily("millrace_replica_quarantines", "times damaged replica data was moved "
                                          "aside to rebuild the replica from an intact one", labels=labels)
        failures = CounterMetricFamily("millrace_replicate_failures", "client entries that could not reach min-ISR "
                                       "in time (error=StalledGroup) or were refused or timed out waiting for room "
                                       "(error=Backpressure); leaders", labels=[*labels, "error"])
        log_bytes = GaugeMetricFamily("millrace_replog_bytes", "bytes of the replog's segment files", labels=labels)
        pstate_bytes = GaugeMetricFamily("millrace_pstate_bytes", "bytes of the replica's RocksDB live SST files "
                                         "(PStates and depots; memtables count once flushed)", labels=labels)
        histograms = {key: HistogramMetricFamily(name, help_, labels=[*labels, *own])
                      for key, (name, help_, own) in HISTOGRAMS.items()}
        dropped = CounterMetricFamily("millrace_inbox_dropped_peer_messages", "peer messages dropped because the "
                                      "replica's inbox was full (the protocols resend them)", labels=labels)
        for host in self.replicas():
            s = replica_status(host)
            lv = [self.node_id, host.module, str(host.group)]
            for r in ROLES:
                role.add_metric([*lv, r], 1.0 if s["role"] == r else 0.0)
            epoch.add_metric(lv, s["epoch"])
            log_end.add_metric(lv, s["log_end"])
            log_start.add_metric(lv, s["log_start"])
            applied.add_metric(lv, s["applied"])
            if s["role"] == "leader":
                isr.add_metric(lv, len(s["isr"]))
                stalled.add_metric(lv, 1.0 if s["stalled"] else 0.0)
                for follower, held in s["followers"].items():
                    lag.add_metric([*lv, follower], max(0, s["log_end"] - 1 - held))
            appends.add_metric(lv, host.stats["appends"])
            entries.add_metric(lv, host.stats["entries_applied"])
            flushes.add_metric(lv, host.stats["flushes"])
            installs.add_metric(lv, host.stats["far_horizon_installs"])
            copied.add_metric(lv, host.stats["far_horizon_bytes"])
            refetched.add_metric(lv, host.stats["far_horizon_refetched_files"])
            retained.add_metric(lv, host.stats["replog_deleted_bytes"])
            dropped.add_metric(lv, host.inbox.dropped)
            failures.add_metric([*lv, "StalledGroup"], host.stats["replicate_failures_stalled"])
            failures.add_metric([*lv, "Backpressure"], host.stats["replicate_failures_backpressure"])
            log_bytes.add_metric(lv, host.log.size_bytes())
            sst = _live_sst_bytes(host)
            if sst is not None:
                pstate_bytes.add_metric(lv, sst)
            if host.timings is not None:
                for key, own, buckets in host.timings.items():
                    counts, total = buckets.cumulative()
                    histograms[key].add_metric([*lv, *own], counts, total)
            fault = s.get("fault")
            for kind in FAULT_KINDS:
                failed.add_metric([*lv, kind], 1.0 if s.get("failed") and fault is not None and fault.kind == kind else 0.0)
            restarts.add_metric(lv, fault.restarts if fault is not None else 0)
            quarantined.add_metric(lv, fault.quarantined if fault is not None else 0)
            flow = s.get("dataflow")
            if flow is not None:
                dead.add_metric(lv, flow["dead_letters"])
                if s["role"] == "leader":
                    in_flight.add_metric(lv, flow["envelopes_in_flight"])
                    waiting.add_metric(lv, flow["appends_waiting_for_hops"])
        yield from (role, epoch, log_end, log_start, applied, isr, stalled, lag, appends, entries, flushes,
                    installs, copied, refetched, retained, dropped, dead, in_flight, waiting, failed, restarts, quarantined,
                    failures, log_bytes, pstate_bytes, *histograms.values())


def _live_sst_bytes(host: Any) -> int | None:
    """The replica's RocksDB live SST bytes, None while its store is closed (a restart, a far-horizon install)."""
    try:
        return int(host.store.current().live_sst_bytes()) if host.store.created else 0  # (not created: no files)
    except Exception:
        log.debug("%s: no PState size (its store is closing)", host.name, exc_info=True)
        return None


def node_registry(node_id: str, replicas: Callable[[], Iterable[Any]]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(ReplicaCollector(node_id, replicas))
    registry.register(DepotCollector(node_id, replicas))
    return registry
