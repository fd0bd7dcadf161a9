"""Hops between task groups on a real RF=3 cluster: the fanout module (examples/timeline.py).

Covers issue 14's "Done when": every post reaches every follower exactly once,
also with the leader of a source group and of a destination group killed
during the run; an ``applied`` post returns only once every follower's
timeline holds it, with the topology's ack value; a record a microbatch
appends runs through the depot's stream topology; a poison record's hops land
in the dead-letter depot (counted in ``conductor status`` and the metrics)
while later records are processed.
"""

from __future__ import annotations

import random
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from conductor.cli_views import module_view
from conductor.client import Cluster
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.status import module_status
from pstate import P
from tests.integration.cluster_helpers import Appender, deploy, groups_of, wait_for
from topology import task_for_key
from topology.module import DEAD_LETTERS
from topology.spark.microbatch import commit_batch, route_changes

MODULE, REF, TASKS, GROUPS = "Timeline", "examples.timeline:Timeline", 8, 4
SESSION_TIMEOUT = 4.0
AUTHORS = [f"a{i}" for i in range(6)]


def follow_graph(seed: int = 1) -> dict[str, list[str]]:
    """Each author followed by 20 of 60 users: followers spread over every task group."""
    rng = random.Random(seed)
    users = [f"u{j}" for j in range(60)]
    return {a: sorted(rng.sample(users, 20)) for a in AUTHORS}


def follow_all(cluster: Cluster, graph: dict[str, list[str]]) -> None:
    follows = [{"author": a, "follower": f} for a, fs in graph.items() for f in fs]
    cluster.depot(MODULE, "*follows").append_many(follows, ack="applied")


def stored_posts(cluster: Cluster) -> list[dict[str, Any]]:
    posts = cluster.depot(MODULE, "*posts")
    out = []
    for t in range(TASKS):
        start, end = posts.partition_info(t)
        out += posts.read(t, start, end, max_bytes=1 << 30)
    return out


@pytest.fixture(scope="module")
def timeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevCluster, Cluster, dict[str, list[str]]]]:
    dc = DevCluster(tmp_path_factory.mktemp("timeline") / "cluster", nodes=3, session_timeout=SESSION_TIMEOUT)
    dc.start()
    try:
        deploy(dc, MODULE, tasks=TASKS, threads=GROUPS, module_ref=REF)
        with Cluster.connect(dc.hosts, timeout_s=30) as cluster:
            graph = follow_graph()
            follow_all(cluster, graph)
            yield dc, cluster, graph
    finally:
        dc.stop()


def test_an_applied_post_returns_once_every_follower_holds_it_with_its_ack_value(timeline: Any) -> None:
    _dc, cluster, graph = timeline
    posts, timelines = cluster.depot(MODULE, "*posts"), cluster.pstate(MODULE, "$$timelines")
    spread = {task_for_key(f, TASKS) % GROUPS for fs in graph.values() for f in fs}
    assert spread == set(range(GROUPS)), "followers must live on every task group"
    for i in range(12):
        author = AUTHORS[i % len(AUTHORS)]
        _offset, acks = posts.append_with_acks({"author": author, "id": i, "text": "hello"})
        assert acks == {"fanout": len(graph[author])}  # the topology's return value: followers reached
        # no waiting: `applied` covered the hops to every follower's task group
        missing = [f for f in graph[author] if timelines.select_one(f, P.key(i)) != author]
        assert not missing, f"post {i} returned before reaching {missing}"


def test_a_record_a_microbatch_appends_runs_through_the_stream_topology(timeline: Any) -> None:
    _dc, cluster, graph = timeline
    info = cluster.module_info(MODULE)
    definition = cluster._module(MODULE).definition
    post = {"author": "a1", "id": 500, "text": "imported"}
    rows = [{"target": "*posts", "key": None, "op": "append", "value": post}]
    changes = route_changes(definition, "import", info.tasks, info.groups, rows)
    assert commit_batch(cluster, MODULE, "import", 1, changes) == {g: False for g in range(GROUPS)}
    timelines = cluster.pstate(MODULE, "$$timelines")
    # the commit's applied reply covered the hops its record caused
    assert all(timelines.select_one(f, P.key(500)) == "a1" for f in graph["a1"])
    assert commit_batch(cluster, MODULE, "import", 1, changes) == {g: True for g in range(GROUPS)}  # a replay
    assert sum(p["id"] == 500 for p in stored_posts(cluster)) == 1


def test_a_poison_record_is_dead_lettered_while_later_records_are_processed(timeline: Any) -> None:
    dc, cluster, graph = timeline
    posts, timelines = cluster.depot(MODULE, "*posts"), cluster.pstate(MODULE, "$$timelines")
    t0 = time.monotonic()
    # the fanout accepts it; each delivery fails (a timeline is keyed by int post ids), is retried, dead-lettered
    posts.append({"author": "a2", "id": "not-an-int", "text": "poison"})
    assert time.monotonic() - t0 > 1.0, "the poison hops were retried with backoff before being dead-lettered"
    posts.append({"author": "a2", "id": 900, "text": "after"})
    assert all(timelines.select_one(f, P.key(900)) == "a2" for f in graph["a2"])
    dead = cluster.depot(MODULE, DEAD_LETTERS)
    letters = []
    for t in range(TASKS):
        start, end = dead.partition_info(t)
        letters += dead.read(t, start, end)
    assert sorted(d["key"] for d in letters) == graph["a2"]
    assert all(d["hop"] == "deliver" and "SchemaMismatch" in d["error"] and d["args"][0] == "not-an-int"
               and d["attempts"] == 4 for d in letters)
    with Metastore(dc.hosts) as ms:
        st = module_status(ms, MODULE)
    assert sum(g["replica"]["dead_letters"] for g in st["groups"]) == len(graph["a2"])
    console = Console(width=200, record=True)
    console.print(module_view(st))
    assert "hop message(s) failed their retries and are in *dead_letters" in console.export_text()
    metrics_address = (dc.node_dir("n1") / "node.metrics").read_text()
    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5).read().decode()
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith("millrace_dead_letters_total{") and f'module="{MODULE}"' in line)
    assert counted == len(graph["a2"])  # n1 hosts a replica of every group (RF=3 on 3 nodes)


def test_every_post_reaches_every_follower_exactly_once_through_source_and_destination_failovers(
        tmp_path: Path) -> None:
    dc = DevCluster(tmp_path / "cluster", nodes=3, session_timeout=SESSION_TIMEOUT)
    dc.start()
    try:
        deploy(dc, MODULE, tasks=TASKS, threads=GROUPS, module_ref=REF)
        graph = follow_graph(seed=2)
        source = task_for_key("a0", TASKS) % GROUPS  # a0's posts start there
        destination = next(task_for_key(f, TASKS) % GROUPS for f in graph["a0"]
                           if task_for_key(f, TASKS) % GROUPS != source)
        with Cluster.connect(dc.hosts, timeout_s=30) as cluster:
            follow_all(cluster, graph)
            posts = cluster.depot(MODULE, "*posts")
            appender = Appender(posts, window=16, make=lambda n: {"author": AUTHORS[n % 6], "id": n, "text": "x"})
            appender.start()
            try:
                for g in (source, destination):
                    wait_for(lambda n=appender.count(): appender.count() > n + 100, 60, "posts to flow")
                    victim = groups_of(dc, MODULE)[g].leader
                    assert victim is not None
                    dc.nodes[victim].kill()
                    wait_for(lambda g=g, v=victim: groups_of(dc, MODULE)[g].leader not in (None, v),
                             SESSION_TIMEOUT + 5, f"a new leader of group {g}")
                    wait_for(lambda n=appender.count(): appender.count() > n + 100, 60, "posts after the failover")
                    dc.start_node(victim)
                    dc.wait_nodes([victim])
            finally:
                appender.stop()
            stored = stored_posts(cluster)
            ids = Counter(p["id"] for p in stored)
            acked = {r["id"] for r in appender.acked}
            assert acked <= set(ids), f"acknowledged posts not stored: {sorted(acked - set(ids))[:5]}"
            want_unread = Counter(f for p in stored for f in graph[p["author"]])
            unread = cluster.pstate(MODULE, "$$unread")

            def delivered() -> dict[str, int]:
                return {f: unread.select_one(f) or 0 for fs in graph.values() for f in fs}

            wait_for(lambda: delivered() == dict(want_unread), 60, "every stored post delivered once")
            timelines = cluster.pstate(MODULE, "$$timelines")
            for f in want_unread:
                want = {p["id"] for p in stored if f in graph[p["author"]]}
                got = {k for k, _v in timelines.select(f, P.all())}
                assert got == want, f"{f}: {len(want - got)} post(s) missing, {len(got - want)} unexpected"
            assert appender.count() > 400
    finally:
        dc.stop()
