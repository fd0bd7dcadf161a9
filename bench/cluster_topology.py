"""The topology phase of :mod:`bench.cluster_append`: Timeline's two hops, one post at a time, and their floor.

Timeline (``examples.timeline:Timeline``) is deployed beside the depot's module at ``TIMELINE_GROUPS`` task
groups, RF 3. Posts go one at a time with ``ack="applied"`` (the call returns once every follower's timeline
holds the post), alternating between two kinds of author, so both figures see the same minutes of a shared
machine:

* the **fanout** (``topology_p50_ms``, the issue's figure): authors followed by ``TIMELINE_FOLLOWERS`` users
  each, spread over every group; a post is an entry on the author's group, then one entry on each group that
  holds followers (3 of them besides the author's, replicating at the same time on the same three workers);
* the **chain** (``topology_chain_p50_ms``): an author with a single follower on another group, so a post is
  exactly two replicated entries in series plus two messages (the envelope, and the pull that reports it
  complete), through the same code: the floor of this design for two hops, in the same run.

``python -m bench.cluster_append --only topology`` runs only the sequential reference (``p50_ms``) and this
phase, to iterate quickly. Every delivery is checked in ``$$unread`` afterwards.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.floor import percentile
from conductor.client import Cluster
from conductor.devcluster import DevCluster
from topology.partitioners import task_for_key

#: the topology phase: Timeline at this many task groups, authors with this many followers each
TIMELINE_GROUPS, TIMELINE_AUTHORS, TIMELINE_FOLLOWERS, TIMELINE_USERS = 4, 20, 30, 1_000
#: the chain's author, followed by one user whose task is on another group
CHAIN_AUTHOR = "chain"


def chain_follower(tasks: int, groups: int) -> str:
    """A user whose task is on another group than :data:`CHAIN_AUTHOR`'s (so the post hops once, off-group)."""
    home = task_for_key(CHAIN_AUTHOR, tasks) % groups
    return next(u for u in (f"c{i}" for i in range(1000)) if task_for_key(u, tasks) % groups != home)


def topology_sequential(cluster: Cluster, hosts: str, count: int, warmup: int, pids: list[int],
                        plain_append: Callable[[], Any]) -> dict[str, float]:
    """Fanout and chain posts alternately through Timeline, ``ack="applied"``: p50/p99 ms of each; then the
    workers' CPU per call of each kind and of ``plain_append`` (a sequential depot append), in blocks of
    ``count // 2``; every delivery checked."""
    from bench.topology import TASKS, cpu_seconds, follow_graph
    from bench.topology import deploy as deploy_module  # (Timeline on the same cluster, RF 3)

    deploy_module(hosts, "Timeline", "examples.timeline:Timeline", TIMELINE_GROUPS)
    graph = follow_graph(cluster, 5, TIMELINE_AUTHORS, TIMELINE_FOLLOWERS, TIMELINE_USERS)
    graph[CHAIN_AUTHOR] = [chain_follower(TASKS, TIMELINE_GROUPS)]
    cluster.depot("Timeline", "*follows").append({"author": CHAIN_AUTHOR, "follower": graph[CHAIN_AUTHOR][0]},
                                                 ack="applied")
    posts = cluster.depot("Timeline", "*posts")
    samples: dict[str, list[float]] = {"fanout": [], "chain": []}
    authors = []
    perf = time.perf_counter
    for i in range(warmup + count):
        for kind, author in (("fanout", f"a{i % TIMELINE_AUTHORS}"), ("chain", CHAIN_AUTHOR)):
            t0 = perf()
            posts.append({"author": author, "id": i, "text": "hello"}, ack="applied")
            if i >= warmup:
                samples[kind].append((perf() - t0) * 1000)
            authors.append(author)
    cpu: dict[str, float] = {}
    n = max(50, count // 2)
    for kind, call in (("fanout", lambda i: posts.append({"author": f"a{i % TIMELINE_AUTHORS}", "id": -1 - i,
                                                         "text": "cpu"}, ack="applied")),
                       ("chain", lambda i: posts.append({"author": CHAIN_AUTHOR, "id": -1 - i, "text": "cpu"},
                                                        ack="applied")),
                       ("plain", lambda i: plain_append())):
        c0 = cpu_seconds(pids)
        for i in range(n):
            call(i)
            if kind != "plain":
                authors.append(f"a{i % TIMELINE_AUTHORS}" if kind == "fanout" else CHAIN_AUTHOR)
        cpu[kind] = (cpu_seconds(pids) - c0) / n * 1000
    want = Counter(u for a in authors for u in graph[a])
    unread = cluster.pstate("Timeline", "$$unread")
    got = {u: unread.select_one(u) or 0 for u in want}
    if got != dict(want):
        raise AssertionError(f"topology: {sum(got.values())} deliveries counted, {sum(want.values())} expected")
    fan, chain = sorted(samples["fanout"]), sorted(samples["chain"])
    return {"p50_ms": statistics.median(fan), "p99_ms": percentile(fan, 99),
            "chain_p50_ms": statistics.median(chain), "chain_p99_ms": percentile(chain, 99),
            "cpu_ms": cpu["fanout"], "chain_cpu_ms": cpu["chain"], "plain_cpu_ms": cpu["plain"]}


def topology_figures(seq: dict[str, float], topo: dict[str, float]) -> dict[str, Any]:
    """The phase's keys of the bench's JSON (``seq``: the sequential depot appends of the same run)."""
    return {"topology_p50_ms": round(topo["p50_ms"], 3), "topology_p99_ms": round(topo["p99_ms"], 3),
            "ratio_topology_p50_vs_p50": round(topo["p50_ms"] / seq["p50_ms"], 2),
            "topology_chain_p50_ms": round(topo["chain_p50_ms"], 3),
            "topology_chain_p99_ms": round(topo["chain_p99_ms"], 3),
            "ratio_topology_chain_p50_vs_p50": round(topo["chain_p50_ms"] / seq["p50_ms"], 2),
            "ratio_topology_p50_vs_chain": round(topo["p50_ms"] / topo["chain_p50_ms"], 2),
            # the three workers' CPU (user + system) per sequential call: what 2 cores must run per post
            "topology_worker_cpu_ms": round(topo["cpu_ms"], 2), "topology_chain_worker_cpu_ms":
            round(topo["chain_cpu_ms"], 2), "sequential_worker_cpu_ms": round(topo["plain_cpu_ms"], 2)}


def log_topology(console: Console, topo: dict[str, float]) -> None:
    console.log(f"topology (Timeline, 2 hops to {TIMELINE_FOLLOWERS} followers over {TIMELINE_GROUPS} groups): "
                f"p50 {topo['p50_ms']:.3f} ms, p99 {topo['p99_ms']:.3f} ms; chain (2 hops, 1 follower): "
                f"p50 {topo['chain_p50_ms']:.3f} ms, p99 {topo['chain_p99_ms']:.3f} ms; workers' CPU per call: "
                f"{topo['cpu_ms']:.2f} ms fanout, {topo['chain_cpu_ms']:.2f} chain, {topo['plain_cpu_ms']:.2f} "
                "depot append")


def run_topology_only(args: argparse.Namespace, root: Path, console: Console) -> dict[str, Any]:
    """``--only topology``: the sequential reference and this phase on a fresh RF=3 dev cluster."""
    from bench.cluster_append import Pool, deploy, plain_append, sequential

    t0 = time.monotonic()
    with DevCluster(root / "cluster", nodes=3, conductors=1, session_timeout=4.0) as dc:
        deploy(dc.hosts, args.tasks, args.threads)
        with dc.connect() as cluster:
            seq = sequential(cluster, Pool.build(), args.count, args.warmup)
            console.log(f"sequential: p50 {seq['p50_ms']:.3f} ms, p99 {seq['p99_ms']:.3f} ms")
            topo = topology_sequential(cluster, dc.hosts, max(200, args.count // 4), 50,
                                       [p.pid for p in dc.nodes.values()], plain_append(cluster))
            log_topology(console, topo)
    return {"bench": "cluster_append", "only": "topology", "quick": args.quick,
            "p50_ms": round(seq["p50_ms"], 3), "p99_ms": round(seq["p99_ms"], 3), **topology_figures(seq, topo),
            "seconds": round(time.monotonic() - t0, 1)}
