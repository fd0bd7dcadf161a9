"""The replicas' latency histograms: weighted observations, entry types, export, and the charts made of them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from conductor.ui.telemetry import Telemetry, parse_metrics
from conductor.worker.metrics import HISTOGRAMS, ReplicaCollector
from conductor.worker.pending_entry import PendingEntry
from conductor.worker.timings import UNKNOWN_TYPE, Buckets, ReplicaTimings, measure_reply, replica_counters
from replog.errors import Backpressure, StalledGroup
from replog.messages import Ack, ReplicateAck
from topology.entries.requests import DepotAppend, InboundHops, OutboxTrim


def test_a_weighted_observation_counts_n_entries_in_one_bucket() -> None:
    b = Buckets((0.001, 0.01))
    b.observe(0.0005, 3)
    b.observe(0.005)
    b.observe(5.0)
    counts, total = b.cumulative()
    assert counts == [("0.001", 3.0), ("0.01", 4.0), ("+Inf", 5.0)]
    assert abs(total - (0.0015 + 0.005 + 5.0)) < 1e-9


def test_replicate_and_apply_durations_go_to_the_type_each_entry_was_built_as() -> None:
    t = ReplicaTimings()
    t.built(10, [DepotAppend([]), DepotAppend([]), InboundHops(0)], created=1.0)
    t.built(13, [OutboxTrim()], created=1.5)
    t.applied("leader", 10, 11, started=2.0, now=2.2)  # part of the first run
    t.applied("leader", 12, 14, started=3.0, now=3.3)  # the rest, the trim and one entry built by nobody here
    h = t.histograms
    assert sum(h[("replicate", ("leader", "client_append"))].counts) == 2
    assert abs(h[("replicate", ("leader", "client_append"))].sum - 2 * 1.2) < 1e-9
    assert sum(h[("replicate", ("leader", "inbound_hops"))].counts) == 1
    assert sum(h[("replicate", ("leader", "trim"))].counts) == 1
    assert sum(h[("apply", ("leader", UNKNOWN_TYPE))].counts) == 1
    assert abs(h[("apply", ("leader", "client_append"))].sum - 0.2) < 1e-9  # 0.1 s each
    t.built(15, [DepotAppend([])], created=4.0)
    t.applied("follower", 15, 15, started=5.0, now=5.1)  # leadership lost: what it built is forgotten
    assert sum(h[("apply", ("follower", UNKNOWN_TYPE))].counts) == 1
    assert sum(h[("replicate", ("leader", "client_append"))].counts) == 2


def test_replies_time_acks_per_level_and_count_replicate_failures() -> None:
    t, stats = ReplicaTimings(), replica_counters()
    group = [PendingEntry(DepotAppend([]), 0, Ack.APPLIED, lambda *_: None, received=1.0) for _ in range(3)]
    measure_reply(stats, t, None, group)
    assert sum(t.histograms[("append_to_ack", ("applied",))].counts) == 3
    measure_reply(stats, t, StalledGroup("M/0", ["n1"], 2), group)
    measure_reply(stats, t, Backpressure("M/0", "full"), group[:1])
    assert stats["replicate_failures_stalled"] == 3 and stats["replicate_failures_backpressure"] == 1
    t.peer_sent("n2", 20, 1.0)
    t.peer_sent("n2", 30, 1.5)  # the oldest unacknowledged send is the one timed
    t.peer_acked(ReplicateAck("n2", "n1", 1, 18, 19), 1.7)
    t.peer_acked(ReplicateAck("n2", "n1", 1, 19, 20), 2.0)
    assert t.histograms[("peer_round_trip", ())].sum == 1.0
    t.transferred(50_000_000, 2.0)  # a far-horizon transfer: 25 MB/s
    rate = t.histograms[("far_horizon_rate", ())]
    assert rate.sum == 25e6 and rate.cumulative()[0][3] == ("2.5e+07", 1.0)


def test_the_collector_exports_histograms_and_the_conductor_charts_their_interval_means(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # (the host below is a stand-in whose status is given whole: the collector reads it through replica_status)
    monkeypatch.setattr("conductor.worker.metrics.replica_status", lambda h: h.status())
    t = ReplicaTimings()
    stats = replica_counters()
    store = SimpleNamespace(created=True, current=lambda: SimpleNamespace(live_sst_bytes=lambda: 4096))
    host = SimpleNamespace(module="M", group=0, name="M/0", stats=stats, timings=t, store=store,
                           log=SimpleNamespace(size_bytes=lambda: 1234), inbox=SimpleNamespace(dropped=0),
                           status=lambda: {"role": "leader", "epoch": 1, "log_end": 5, "log_start": 0, "applied": 4,
                                           "isr": ["n1"], "stalled": False, "followers": {}, "fault": None,
                                           "failed": False, "dataflow": None})
    registry = CollectorRegistry()
    registry.register(ReplicaCollector("n1", lambda: [host]))
    tel = Telemetry(history_s=60, interval_s=1)
    t.built(0, [DepotAppend([])] * 4, created=0.0)
    t.applied("leader", 0, 3, started=0.01, now=0.02)
    tel.ingest(1000.0, {"n1": parse_metrics(generate_latest(registry).decode())}, {"M": 1})
    t.built(4, [DepotAppend([])], created=1.0)
    t.applied("leader", 4, 4, started=1.002, now=1.004)
    stats["replicate_failures_stalled"] += 4
    text = generate_latest(registry).decode()
    for name, _help, _labels in HISTOGRAMS.values():
        assert f"# TYPE {name} histogram" in text
    assert 'millrace_replicate_duration_seconds_count{group="0",module="M",node="n1",role="leader",' \
           'type="client_append"} 5.0' in text
    assert 'millrace_replog_bytes{group="0",module="M",node="n1"} 1234.0' in text
    assert 'millrace_pstate_bytes{group="0",module="M",node="n1"} 4096.0' in text
    tel.ingest(1002.0, {"n1": parse_metrics(text)}, {"M": 1})
    labels = {"module": "M", "role": "leader"}
    [p] = tel.points("replicate_ms", {**labels, "type": "client_append"})  # only the 5th entry: 4 ms
    assert abs(p.v - 4.0) < 1e-6
    [p] = tel.points("apply_ms", {**labels, "type": "all"})
    assert abs(p.v - 2.0) < 1e-6
    assert [p.v for p in tel.points("replicate_failures_per_s", {"module": "M"})] == [2.0]
    assert tel.entry_types("M") == ["all", "client_append"]
    [replicate] = [c for c in tel.chart_data("M", entry_type="client_append") if c["id"] == "replicate"]
    assert len(replicate["series"][0]["points"]) == 1
