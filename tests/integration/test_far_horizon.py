"""Far-horizon catchup and replog retention with real processes: ZooKeeper, a conductor, three worker nodes."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from conductor.client import Cluster
from conductor.devcluster import DevCluster
from replog.log import Log
from tests.integration.cluster_helpers import (
    converged,
    deploy,
    group_status,
    groups_of,
    replica_state,
    wait_for,
)
from tests.integration.hooked_worker import hooked

SESSION_TIMEOUT = 4.0
SEGMENT = 256 * 1024


@pytest.fixture
def dc(tmp_path: Path) -> Iterator[DevCluster]:
    # Every node damages the first chunk it sends in a far-horizon transfer (only leaders send any).
    cluster = DevCluster(tmp_path / "cluster", nodes=3, conductors=1, session_timeout=SESSION_TIMEOUT,
                         log_level="INFO", worker=hooked("--damage-chunks", "1"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _metric(text: str, name: str, labels: str) -> float:
    """The value of ``name`` for group 0 with ``labels`` in a Prometheus text exposition."""
    for line in text.splitlines():
        if line.startswith(name + "{") and labels in line and 'group="0"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for {labels} not exported")


def replog_bytes(dc: DevCluster, node: str, module: str, group: int) -> int:
    d = dc.node_dir(node) / module / str(group) / "replog"
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file()) if d.exists() else 0


def test_stopped_follower_catches_up_by_far_horizon(dc: DevCluster) -> None:
    opts = {"replication.max.near.sync.message.lag": "100", "replication.max.time.lag.millis": "1500",
            "replog.segment.bytes": str(SEGMENT)}
    groups = deploy(dc, "Clicks", tasks=2, threads=1, options=opts)
    st = groups[0]
    follower = next(r for r in st.replicas if r != st.leader)
    dc.nodes[follower].kill()

    total = 200_000
    with Cluster.connect(dc.hosts) as cluster:
        depot = cluster.depot("Clicks", "*clicks")
        batch = 200  # one replog entry per request: 1,000 entries, ten times the near-horizon lag
        for i in range(0, total, batch):
            depot.append_many([{"user": f"u{j % 97}", "id": f"r{j}"} for j in range(i, i + batch)], ack="applied")

    wait_for(lambda: group_status(dc, st.leader, "Clicks", 0).log_start > 0, 10,
             "the leader's retention to delete replog segments the stopped follower needs")

    dc.start_node(follower)
    dc.wait_nodes([follower])
    wait_for(lambda: converged(dc, "Clicks"), 120, "the restarted follower to catch up and rejoin the ISR")
    # (the transfer's thread reports after the replica rejoined: it closes and deletes the retired store first)
    wait_for(lambda: ": installed after" in dc.nodes[follower].log_path.read_text(errors="replace"), 30,
             "the far-horizon transfer's report")
    log_text = dc.nodes[follower].log_path.read_text(errors="replace")
    assert "installed a checkpoint up to offset" in log_text, "caught up without far horizon"
    assert "arrived damaged" in log_text, "the corrupted chunk was not detected"
    assert "far-horizon catchup from" in log_text and ": installed after" in log_text
    metrics_at = (dc.node_dir(follower) / "node.metrics").read_text()
    with urllib.request.urlopen(f"http://{metrics_at}/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    label = f'module="Clicks",node="{follower}"'
    assert _metric(metrics, "millrace_far_horizon_installs_total", label) >= 1
    assert _metric(metrics, "millrace_far_horizon_refetched_files_total", label) >= 1
    assert _metric(metrics, "millrace_far_horizon_bytes_total", label) > 0

    # No checkpoint outlives its transfer on the leader (the follower released it).
    wait_for(lambda: not any((dc.node_dir(st.leader) / "checkpoints").iterdir()), 10,
             "the leader to release the transfer's checkpoint")

    states = {}
    groups_now = groups_of(dc, "Clicks")
    dc.stop()
    for r in groups_now[0].replicas:
        states[r] = replica_state(dc.root, r, "Clicks", 0)
    lead = states[st.leader]
    for r, s in states.items():
        assert s["applied"] == lead["applied"] == lead["log_end"] - 1, r
        assert s["depots"] == lead["depots"], f"{r}'s depot records differ from the leader's"
    ids = {rec["id"] for rows in lead["depots"].values() for _off, rec in rows}
    assert len(ids) == total
    with Log.open(dc.node_dir(follower) / "Clicks" / "0" / "replog") as lg:
        assert lg.start_offset > 0, "the follower replayed from offset 0 instead of installing a checkpoint"


def test_replog_of_a_busy_group_stays_bounded(dc: DevCluster) -> None:
    opts = {"replication.max.near.sync.message.lag": "50", "replog.segment.bytes": str(SEGMENT)}
    groups = deploy(dc, "Clicks", tasks=1, threads=1, options=opts)
    st = groups[0]
    peak = {r: 0 for r in st.replicas}
    # Whatever was written: the window (50 entries of ~10 KB), what arrives between two retention
    # checks (one per second, ~3 MB here) and the active segment.
    bound = 24 * SEGMENT
    appended = 0
    deadline = time.monotonic() + 120
    with Cluster.connect(dc.hosts) as cluster:
        depot = cluster.depot("Clicks", "*clicks")
        n = 0
        while appended < 6 * bound:  # six times the bound: without retention the replog would hold it all
            assert time.monotonic() < deadline, f"only {appended} bytes appended in 120 s"
            recs = [{"user": f"u{j % 31}", "id": f"r{j}", "pad": "x" * 80} for j in range(n, n + 100)]
            depot.append_many(recs, ack="applied")
            n += len(recs)
            appended += sum(len(r["pad"]) + 20 for r in recs)
            if n % 5_000 == 0:
                for r in st.replicas:
                    peak[r] = max(peak[r], replog_bytes(dc, r, "Clicks", 0))
    for r in st.replicas:
        peak[r] = max(peak[r], replog_bytes(dc, r, "Clicks", 0))
    assert all(p <= bound for p in peak.values()), f"replog peaks {peak} above {bound} after {appended} bytes"
