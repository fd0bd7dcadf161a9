"""Stream topologies on a real cluster: colocated effects, cross-group routing, and a leader failover."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from conductor.client import Cluster
from conductor.devcluster import DevCluster
from tests.integration.cluster_helpers import Appender, deploy, group_status, groups_of, wait_for
from topology.errors import TopologyError

SESSION_TIMEOUT = 4.0


@pytest.fixture
def dc(tmp_path: Path) -> Iterator[DevCluster]:
    cluster = DevCluster(tmp_path / "cluster", nodes=3, session_timeout=SESSION_TIMEOUT)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_word_count_counts_every_word_once_across_task_groups(dc: DevCluster) -> None:
    deploy(dc, "WordCount", tasks=4, threads=2, module_ref="examples.word_count:WordCount")
    text = ["The cat sat on the mat.", "the dog sat", "A cat and a dog!"] * 50
    with Cluster.connect(dc.hosts) as cluster:
        sentences = cluster.depot("WordCount", "*sentences")
        sentences.append_many(text, ack="applied")
        # `random` is sticky in append_many: the call's 150 records are one request to one task (one entry)
        ends = [sentences.partition_info(t)[1] for t in range(4)]
        assert sorted(ends) == [0, 0, 0, len(text)], ends
        expected = Counter(w.strip(".,!").lower() for s in text for w in s.split())
        counts = cluster.pstate("WordCount", "$$counts")
        wait_for(lambda: all(counts.select_one(w) == n for w, n in expected.items()), 30,
                 "every word's count on the task group that owns it")
        scanned = dict(kv for t in range(4) for kv in counts.scan(t))
        assert scanned == dict(expected)
    app = subprocess.run([sys.executable, "-m", "examples.query_app", "--zk", dc.hosts, "cat", "zebra", "--top", "2"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "cat: 100" in app and "zebra: 0" in app and "the" in app and "150" in app


def test_failing_topology_refuses_the_append_with_a_typed_error(dc: DevCluster) -> None:
    deploy(dc, "Audit", tasks=4, threads=2, module_ref="examples.audit:Audit")
    with Cluster.connect(dc.hosts) as cluster:
        events = cluster.depot("Audit", "*events")
        with pytest.raises(TopologyError, match="KeyError"):
            events.append({"user": "ann"}, ack="applied")  # no "id": the topology raises
        info = [events.partition_status(t) for t in range(4)]
        assert sum(s.end for s in info) == 0, "a refused append must not be stored"
        assert events.append({"user": "ann", "id": "ok"}, ack="applied") == 0


def test_stream_topology_under_leader_failover_loses_no_acknowledged_effect(dc: DevCluster) -> None:
    groups = deploy(dc, "Audit", tasks=4, threads=2, module_ref="examples.audit:Audit")
    victim = groups[0].leader
    assert victim is not None
    with Cluster.connect(dc.hosts, timeout_s=30) as cluster:
        events = cluster.depot("Audit", "*events")
        appender = Appender(events, window=32, prefix="e", users=29).start()
        try:
            wait_for(lambda: appender.count() > 300, 30, "appends to flow")
            dc.nodes[victim].kill()
            wait_for(lambda: groups_of(dc, "Audit")[0].leader not in (None, victim), SESSION_TIMEOUT + 2,
                     "a new leader")
            n = appender.count()
            wait_for(lambda: appender.count() > n + 300, 30, "appends after the failover")
            dc.start_node(victim)
            dc.wait_nodes([victim])
            time.sleep(1.0)
        finally:
            appender.stop()
        stored: list[dict] = []
        for t in range(4):
            start, end = events.partition_info(t)
            stored += events.read(t, start, end, max_bytes=1 << 30)
        stored_ids = Counter(r["id"] for r in stored)
        seen = cluster.pstate("Audit", "$$seen")
        visits = cluster.pstate("Audit", "$$visits")

        def all_effects() -> bool:
            return sum(len(seen.scan(t)) for t in range(4)) == len(stored_ids)

        wait_for(all_effects, 60, "every stored event's effect on every task group")
        seen_ids = {k for t in range(4) for k, _v in seen.scan(t)}
        acked_ids = {r["id"] for r in appender.acked}
        assert acked_ids <= seen_ids, f"acknowledged events missing from $$seen: {sorted(acked_ids - seen_ids)[:5]}"
        assert seen_ids == set(stored_ids), "$$seen must hold exactly the stored events (idempotent effect)"
        # visits are colocated with the event, in the same replog entry: exact, even across the failover
        per_user = Counter(r["user"] for r in stored)
        assert {k: v for t in range(4) for k, v in visits.scan(t)} == dict(per_user)
        for g in (0, 1):
            leader = groups_of(dc, "Audit")[g].leader
            assert leader is not None and group_status(dc, leader, "Audit", g).role == "leader"


def test_word_count_on_dedicated_task_threads_survives_a_worker_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--task-threads 0``: every replica on a task thread of its own, through a worker kill and restart."""
    monkeypatch.setenv("MILLRACE_TASK_THREADS", "0")
    dc = DevCluster(tmp_path / "cluster", nodes=3, session_timeout=SESSION_TIMEOUT).start()
    try:
        deploy(dc, "WordCount", tasks=4, threads=2, module_ref="examples.word_count:WordCount")
        with Cluster.connect(dc.hosts, timeout_s=30) as cluster:
            sentences = cluster.depot("WordCount", "*sentences")
            sentences.append_many(["red fox", "blue fox"] * 20, ack="applied")
            victim = groups_of(dc, "WordCount")[0].leader
            assert victim is not None
            dc.nodes[victim].kill()
            wait_for(lambda: groups_of(dc, "WordCount")[0].leader not in (None, victim), SESSION_TIMEOUT + 5,
                     "a new leader")
            sentences.append_many(["red hen"] * 10, ack="applied")
            dc.start_node(victim)
            dc.wait_nodes([victim])
            sentences.append_many(["blue hen"] * 10, ack="applied")
            counts = cluster.pstate("WordCount", "$$counts")
            assert {w: counts.select_one(w) for w in ("red", "blue", "fox", "hen")} == \
                {"red": 30, "blue": 30, "fox": 40, "hen": 20}
        assert "a task thread per replica" in dc.nodes[victim].log_path.read_text()
    finally:
        dc.stop()
