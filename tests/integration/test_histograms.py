"""The workers' latency histograms, sizes and failure counters, the client's call histogram and the conductor's
charts of them count exactly the appends a test makes (issue 29)."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conductor.client import ClientMetrics, Cluster
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.worker.metrics import HISTOGRAMS
from tests.integration.cluster_helpers import converged, deploy, wait_for

MODULE = "Clicks"
APPLIED, APPENDED = 50, 20

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as reply:
        text: str = reply.read().decode()
        return text


def _parse(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def scrape_workers(dc: DevCluster) -> tuple[dict[str, Samples], dict[str, str]]:
    """Every worker's samples, at the metrics address its znode advertises (as the conductor finds it)."""
    ms = Metastore(dc.hosts)
    ms.start()
    try:
        addresses = {n: info.metrics for n in ms.nodes.live() if (info := ms.nodes.get(n)) is not None}
    finally:
        ms.close()
    assert len(addresses) == 3 and all(addresses.values()), addresses
    texts = {n: _get(f"http://{a}/metrics") for n, a in addresses.items()}
    return {n: _parse(t) for n, t in texts.items()}, texts


def total(scrapes: dict[str, Samples], name: str, **match: str) -> float:
    """The sum of ``name`` over every worker and label set that includes ``match``."""
    return sum(v for samples in scrapes.values() for (n, labels), v in samples.items()
               if n == name and all((k, val) in labels for k, val in match.items()))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevCluster, str]]:
    mp = pytest.MonkeyPatch()
    mp.setenv("MILLRACE_UI_SCRAPE_INTERVAL", "0.5")  # the conductor's charts get points within seconds
    port = _free_port()
    dc = DevCluster(tmp_path_factory.mktemp("histograms") / "cluster", nodes=3, session_timeout=4.0,
                    balance_interval=0, ui_port=port)
    dc.start()
    try:
        deploy(dc, MODULE, tasks=4, threads=2)
        yield dc, f"http://127.0.0.1:{port}"
    finally:
        dc.stop()
        mp.undo()


def test_histograms_sizes_and_failures_count_the_appends_made(cluster: tuple[DevCluster, str], tmp_path: Path) -> None:
    dc, base = cluster
    before, _ = scrape_workers(dc)
    client_metrics = ClientMetrics()
    with Cluster.connect(dc.hosts, metrics=client_metrics) as c:
        depot = c.depot(MODULE, "*clicks")
        for i in range(APPLIED):
            depot.append({"user": f"u{i % 7}", "id": f"a{i}"}, ack="applied")
        for i in range(APPENDED):
            depot.append({"user": f"u{i % 7}", "id": f"b{i}"}, ack="append")
    wait_for(lambda: converged(dc, MODULE), 30, "replicas to converge")
    after, texts = wait_for(lambda: (s := scrape_workers(dc)) and
                            total(s[0], "millrace_apply_duration_seconds_count", role="follower")
                            >= total(before, "millrace_apply_duration_seconds_count", role="follower")
                            + 2 * (APPLIED + APPENDED) and s, 20, "followers to apply every entry")
    (tmp_path / "worker-metrics.json").write_text(json.dumps(texts))

    def grown(name: str, **match: str) -> float:
        return total(after, name, **match) - total(before, name, **match)

    # Every client append is one replog entry, answered once at its ack level by its group's leader.
    assert grown("millrace_append_to_ack_seconds_count", ack="applied") == APPLIED
    assert grown("millrace_append_to_ack_seconds_count", ack="append") == APPENDED
    assert grown("millrace_append_to_ack_seconds_bucket", ack="applied", le="+Inf") == APPLIED
    assert grown("millrace_append_to_ack_seconds_sum", ack="applied") > 0
    assert grown("millrace_appends_total") >= APPLIED + APPENDED  # (the topologies' hops entries too)
    # ... built and applied by the leader: replicate and apply duration of type client_append
    assert grown("millrace_replicate_duration_seconds_count", role="leader", type="client_append") \
        == APPLIED + APPENDED
    assert grown("millrace_apply_duration_seconds_count", role="leader", type="client_append") == APPLIED + APPENDED
    # ... and applied by both followers of its group, which do not know its type
    assert grown("millrace_apply_duration_seconds_count", role="follower") >= 2 * (APPLIED + APPENDED)
    assert grown("millrace_replog_fsync_seconds_count", role="leader") >= 1
    assert grown("millrace_replog_fsync_seconds_count", role="follower") >= 1
    # ... each followed by the storage marks' fsync (always mode)
    assert grown("millrace_marks_fsync_seconds_count", role="leader") >= 1
    assert grown("millrace_marks_fsync_seconds_count", role="follower") >= 1
    assert grown("millrace_peer_round_trip_seconds_count") >= 1
    assert grown("millrace_replicate_failures_total") == 0
    for error in ("StalledGroup", "Backpressure"):
        assert any(n == "millrace_replicate_failures_total" and ("error", error) in labels
                   for samples in after.values() for n, labels in samples)
    for _key, (name, _help, _labels) in HISTOGRAMS.items():  # (a far-horizon transfer has none to count here)
        assert all(f"# TYPE {name} histogram" in t for t in texts.values()), name
    # Sizes in bytes of every replica: 2 groups x 3 replicas
    for size in ("millrace_replog_bytes", "millrace_pstate_bytes"):
        values = [v for samples in after.values() for (n, labels), v in samples.items()
                  if n == size and ("module", MODULE) in labels]
        assert len(values) == 6, (size, values)
    assert all(v > 0 for samples in after.values() for (n, _l), v in samples.items() if n == "millrace_replog_bytes")
    # The client timed each of its calls once
    client = _parse(generate_latest(client_metrics.registry).decode())
    assert total({"c": client}, "millrace_client_call_seconds_count", method="Append", outcome="ok") \
        == APPLIED + APPENDED

    # The conductor: its own metrics, and charts of the new series from its scrapes
    assert "millrace_conductor_elections_total" in _get(f"{base}/metrics")
    wait_for(lambda: _points(base, "replicate", "replicate_ms", type="client_append") > 0, 30,
             "the conductor to chart the replicate duration")
    # Each chart fills on the conductor's next scrape of the node that records it, so each gets its wait.
    wait_for(lambda: _points(base, "apply", "apply_ms") > 0, 30, "the conductor to chart applies")
    wait_for(lambda: _points(base, "apply", "apply_ms", role="follower", type="replicated") > 0, 30,
             "the conductor to chart the followers' applies of replicated entries")
    wait_for(lambda: _points(base, "replicate_failures", "replicate_failures_per_s") > 0, 30,
             "the conductor to chart the failed replications")
    doc = json.loads(_get(f"{base}/api/modules/{MODULE}/telemetry"))
    assert {"all", "client_append"} <= set(doc["types"])
    page = _get(f"{base}/modules/{MODULE}?role=follower")
    assert 'class=current>followers</a>' in page and "client_append" in page


def _points(base: str, chart: str, series: str, **query: str) -> int:
    """Points of one series of one chart in the conductor's telemetry (``query``: role, type)."""
    doc: dict[str, Any] = json.loads(_get(f"{base}/api/modules/{MODULE}/telemetry?{urlencode(query)}"))
    return sum(len(s["points"]) for c in doc["charts"] if c["id"] == chart for s in c["series"]
               if s["name"] == series)
