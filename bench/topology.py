"""Stream topologies as dataflow on a real RF=3 cluster: does work follow the hops, not the number of groups?

    python -m bench.topology [--quick] [--dir PATH]

One :class:`~conductor.devcluster.DevCluster` (ZooKeeper, a conductor, three
worker processes on 127.0.0.1), every module with replication factor 3, every
append ``ack="applied"`` (it returns once the record's whole tree of hops is
applied on every group it reached):

* ``wordcount`` at 2 and at 8 task groups: ``examples.word_count:WordCount``
  deployed twice on the same cluster (16 tasks each, ``--threads 2`` and
  ``--threads 8``) and fed the same sentences with ``append_many`` (1,000 per
  call, 4 calls in flight; the depot is ``random``, so each call is one entry on one group, and its
  words hop to the groups that own them). ``records_per_s`` is wall clock; ``worker_cpu_s_per_100k``
  is the CPU time (user + system, from ``/proc/<pid>/stat``) of the three
  worker processes over the run, per 100,000 sentences: all the work of the
  cluster, leaders and followers. Under broadcast every group ran every
  sentence; with hops a word costs one message to the group that owns it,
  so ``cpu_ratio_g8_vs_g2`` should stay near 1 (goal <= 1.3). The counts are
  checked against the words appended.
* ``fanout``: ``examples.timeline:Timeline`` at 8 task groups, 50 authors each
  followed by 100 of 5,000 users (so every post reaches every group); posts
  appended 50 per ``append_many`` call, 4 calls in flight.
  ``fanout_deliveries_per_s`` = posts x 100 / wall time (goal >= 50,000);
  every delivery is checked in ``$$unread`` afterwards.
  ``fanout_worker_cpu_us_per_delivery``: the workers' CPU over the run per
  delivery (on a shared machine, the figure that load disturbs least).
* ``topology_p50_ms``: one ``Depot.append(sentence, ack="applied")`` at a time
  through WordCount (2 groups; ``topology_p50_ms_g8`` at 8 groups), p50 and
  p99 of the call.

* ``idle_worker_cpu_s_per_s``: the workers' CPU while nothing is appended
  (every replica's ticks and heartbeats), measured first: part of every
  figure above (``fanout_idle_cpu_us_per_delivery`` is its share of the fanout's).
* the design's floor, in the same run, once the cluster is stopped
  (:mod:`bench.dataflow_floor`): the data path alone in one process (entries
  built, applied on three replicas' stores, envelopes handed over directly),
  as CPU per delivery, with the Timeline handler and with a no-op one;
  ``floor_deliveries_per_s`` = 2 cores / that CPU, the most the cluster
  could reach with no transport, replication or idle cost at all; and
  WordCount's CPU per sentence at 2 and 8 groups (``floor_cpu_ratio_g8_vs_g2``).

Prints a table and, as the last line, one JSON object (docs/performance.md).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import dataflow_floor
from bench.unwind import unwind_on
from conductor.client import Cluster
from conductor.controller import Conductor
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.metastore.module_spec import ModuleSpec
from conductor.status import module_status, wait_serving

TASKS = 16
GOAL_CPU_RATIO = 1.3
GOAL_FANOUT_PER_S = 50_000
FOLLOWERS = 100
AUTHORS = 50
USERS = 5_000
IN_FLIGHT = 4
#: the machine the goals are stated for: the floor's deliveries/s is CORES / its CPU per delivery
CORES = 2


def corpus(n: int, seed: int) -> list[str]:
    """``n`` sentences of 6 to 14 lowercase words from a 2,000-word vocabulary, Zipf-like (as text is).

    Lowercase without punctuation, so WordCount's tokenizer is ``str.split``
    and the bench can check every count without importing the module.
    """
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(2_000)]
    weights = [1 / (i + 1) for i in range(len(vocabulary))]
    return [" ".join(rng.choices(vocabulary, weights, k=rng.randint(6, 14))) for _ in range(n)]


def deploy(hosts: str, name: str, module_ref: str, threads: int) -> None:
    c = Conductor(hosts, "bench")
    c.ms.start()
    try:
        c.deploy(ModuleSpec(name=name, module_ref=module_ref, tasks=TASKS, threads=threads, workers=3,
                            replication_factor=3, options={}))
    finally:
        c.ms.close()
    with Metastore(hosts) as ms:
        wait_serving(ms, name, timeout_s=60)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of the processes so far (fields 14 and 15 of /proc/<pid>/stat, in clock ticks)."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def idle_cpu(pids: list[int], seconds: float) -> float:
    """Worker CPU seconds per second while nothing is appended (ticks, heartbeats, keepalives of every replica)."""
    time.sleep(1.0)  # deploys settle
    c0, t0 = cpu_seconds(pids), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pids) - c0) / (time.monotonic() - t0)


def in_flight(calls: list[Callable[[], Any]]) -> float:
    """Run the calls IN_FLIGHT at a time; returns the wall time."""
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT) as pool:
        for f in [pool.submit(c) for c in calls]:
            f.result()
    return time.monotonic() - t0


def log_entries(hosts: str, module: str) -> int:
    """Replog entries of every task group of ``module`` so far (each is one replication round on 3 replicas)."""
    with Metastore(hosts) as ms:
        return sum(row["replica"]["log_end"] for row in module_status(ms, module)["groups"])


def wordcount(cluster: Cluster, hosts: str, module: str, text: list[str], pids: list[int]) -> dict[str, float]:
    depot = cluster.depot(module, "*sentences")
    chunks = [text[i:i + 1000] for i in range(0, len(text), 1000)]
    entries0 = log_entries(hosts, module)
    cpu0 = cpu_seconds(pids)
    wall = in_flight([functools.partial(depot.append_many, c, ack="applied") for c in chunks])
    cpu = cpu_seconds(pids) - cpu0
    entries = log_entries(hosts, module) - entries0
    return {"records_per_s": len(text) / wall, "worker_cpu_s_per_100k": cpu / len(text) * 100_000, "wall_s": wall,
            "entries_per_1k": entries / len(text) * 1000}


def check_counts(cluster: Cluster, module: str, appended: list[list[str]]) -> None:
    """Every word's count equals its occurrences in everything appended (exactly once per hop)."""
    expected = Counter(w for text in appended for s in text for w in s.split())
    counts = cluster.pstate(module, "$$counts")
    got = dict(kv for t in range(TASKS) for kv in counts.scan(t))
    if got != dict(expected):
        wrong = [w for w in expected if got.get(w) != expected[w]]
        raise AssertionError(f"{module}: {len(wrong)} count(s) differ, e.g. {wrong[:3]}: "
                             f"{[(got.get(w), expected[w]) for w in wrong[:3]]}")


def follow_graph(cluster: Cluster, seed: int, authors: int, followers: int, users: int) -> dict[str, list[str]]:
    """Timeline's follows, appended: ``authors`` authors (``a0``...) each followed by ``followers`` of ``users``
    users (``u0``...), drawn with ``seed``; author -> followers."""
    rng = random.Random(seed)
    everyone = [f"u{i}" for i in range(users)]
    graph = {f"a{i}": rng.sample(everyone, followers) for i in range(authors)}
    cluster.depot("Timeline", "*follows").append_many(
        [{"author": a, "follower": f} for a, fs in graph.items() for f in fs], ack="applied")
    return graph


def fanout(cluster: Cluster, hosts: str, posts_n: int, pids: list[int]) -> dict[str, float]:
    graph = follow_graph(cluster, 3, AUTHORS, FOLLOWERS, USERS)
    posts = cluster.depot("Timeline", "*posts")
    warm = [{"author": f"a{i % AUTHORS}", "id": -1 - i, "text": "warm"} for i in range(200)]
    posts.append_many(warm, ack="applied")
    batch = [{"author": f"a{i % AUTHORS}", "id": i, "text": "hello"} for i in range(posts_n)]
    chunks = [batch[i:i + 50] for i in range(0, len(batch), 50)]
    entries0 = log_entries(hosts, "Timeline")
    cpu0 = cpu_seconds(pids)
    wall = in_flight([functools.partial(posts.append_many, c, ack="applied") for c in chunks])
    cpu = cpu_seconds(pids) - cpu0
    entries = log_entries(hosts, "Timeline") - entries0
    unread = cluster.pstate("Timeline", "$$unread")
    posts_of = Counter(p["author"] for p in warm + batch)
    want = Counter(u for a, fs in graph.items() for u in fs for _ in range(posts_of[a]))
    delivered = {u: unread.select_one(u) or 0 for u in want}
    if delivered != dict(want):
        raise AssertionError(f"fanout: {sum(delivered.values())} deliveries counted, {sum(want.values())} expected")
    return {"deliveries_per_s": posts_n * FOLLOWERS / wall, "posts_per_s": posts_n / wall, "wall_s": wall,
            "cpu_us_per_delivery": cpu / (posts_n * FOLLOWERS) * 1e6, "entries_per_call": entries / len(chunks)}


def latency(cluster: Cluster, module: str, text: list[str]) -> dict[str, float]:
    depot = cluster.depot(module, "*sentences")
    samples = []
    for s in text:
        t0 = time.perf_counter()
        depot.append(s, ack="applied")
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return {"p50_ms": statistics.median(samples), "p99_ms": samples[int(len(samples) * 0.99) - 1]}


def main(argv: list[str] | None = None) -> None:
    unwind_on()  # a kill stops the processes this starts (bench.unwind)
    p = argparse.ArgumentParser(prog="python -m bench.topology", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer records (under five minutes on 2 cores)")
    p.add_argument("--dir", type=Path, default=None, help="cluster directory (default: a temporary one)")
    args = p.parse_args(argv)
    n_text, n_posts, n_lat = (20_000, 1_000, 200) if args.quick else (100_000, 5_000, 1_000)
    console = Console()
    root = args.dir or Path(tempfile.mkdtemp(prefix="millrace-bench-topology-"))
    dc = DevCluster(root / "cluster", nodes=3, session_timeout=10.0).start()
    try:
        for name, ref, threads in (("WordCount2", "bench.modules:WordCount2", 2),
                                   ("WordCount8", "bench.modules:WordCount8", 8),
                                   ("Timeline", "examples.timeline:Timeline", 8)):
            deploy(dc.hosts, name, ref, threads)
        pids = [proc.pid for proc in dc.nodes.values()]
        idle = idle_cpu(pids, 5.0)
        text = corpus(n_text, seed=11)
        with Cluster.connect(dc.hosts, timeout_s=120) as cluster:
            wc: dict[int, dict[str, float]] = {}
            warm = corpus(2_000, seed=5)
            for g in (2, 8):
                cluster.depot(f"WordCount{g}", "*sentences").append_many(warm, ack="applied")
            for g in (2, 8):  # interleaved twice: neither gets a warmer machine
                wc[g] = wordcount(cluster, dc.hosts, f"WordCount{g}", text, pids)
            for g in (2, 8):
                again = wordcount(cluster, dc.hosts, f"WordCount{g}", text, pids)
                wc[g] = {k: (wc[g][k] + again[k]) / 2 for k in wc[g]}
                check_counts(cluster, f"WordCount{g}", [warm, text, text])
            fan = fanout(cluster, dc.hosts, n_posts, pids)
            lat2 = latency(cluster, "WordCount2", corpus(n_lat, seed=17))
            lat8 = latency(cluster, "WordCount8", corpus(n_lat, seed=19))
    finally:
        dc.stop()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    floor = dataflow_floor.measure(n_posts, text[:n_text // 4])  # the cluster is gone: the machine is ours
    floor_per_s = CORES * 1e6 / floor["fanout_us"]

    ratio = wc[8]["worker_cpu_s_per_100k"] / wc[2]["worker_cpu_s_per_100k"]
    table = Table(title="stream topologies as dataflow (RF=3, 3 workers, ack=applied)", title_justify="left")
    for col in ("workload", "figure", "value", "goal"):
        table.add_column(col)
    for g in (2, 8):
        table.add_row(f"wordcount, {g} groups", "sentences/s", f"{wc[g]['records_per_s']:,.0f}", "")
        table.add_row("", "worker CPU s per 100k", f"{wc[g]['worker_cpu_s_per_100k']:.1f}", "")
        table.add_row("", "entries per 1k", f"{wc[g]['entries_per_1k']:.1f}", "")
    table.add_row("wordcount", "CPU ratio 8 vs 2 groups", f"{ratio:.2f}", f"<= {GOAL_CPU_RATIO}")
    table.add_row(f"fanout, {FOLLOWERS} followers", "deliveries/s", f"{fan['deliveries_per_s']:,.0f}",
                  f">= {GOAL_FANOUT_PER_S:,}")
    table.add_row("", "posts/s", f"{fan['posts_per_s']:,.0f}", "")
    table.add_row("", "CPU us per delivery", f"{fan['cpu_us_per_delivery']:.1f}", "")
    table.add_row("", "entries per 50 posts", f"{fan['entries_per_call']:.1f}", "")
    table.add_row("", "of it idle cluster, us", f"{idle * fan['wall_s'] / (n_posts * FOLLOWERS) * 1e6:.1f}", "")
    table.add_row("idle cluster", "worker CPU s per s", f"{idle:.3f}", "")
    table.add_row("floor, one process", "CPU us per delivery", f"{floor['fanout_us']:.1f}",
                  f"<= {CORES * 1e6 / GOAL_FANOUT_PER_S:.0f}")
    table.add_row("", f"deliveries/s on {CORES} cores", f"{floor_per_s:,.0f}", f">= {GOAL_FANOUT_PER_S:,}")
    table.add_row("", "same, no-op handler", f"{floor['fanout_noop_us']:.1f}", "")
    table.add_row("", "us per sentence, g2 / g8",
                  f"{floor['wordcount_us_g2']:.1f} / {floor['wordcount_us_g8']:.1f}", "")
    table.add_row("one applied append", "p50 / p99 ms, 2 groups", f"{lat2['p50_ms']:.1f} / {lat2['p99_ms']:.1f}", "")
    table.add_row("", "p50 / p99 ms, 8 groups", f"{lat8['p50_ms']:.1f} / {lat8['p99_ms']:.1f}", "")
    console.print(table)
    print(json.dumps({
        "bench": "topology", "quick": args.quick, "tasks": TASKS,
        "wordcount_records_per_s_g2": round(wc[2]["records_per_s"]),
        "wordcount_records_per_s_g8": round(wc[8]["records_per_s"]),
        "worker_cpu_s_per_100k_g2": round(wc[2]["worker_cpu_s_per_100k"], 2),
        "worker_cpu_s_per_100k_g8": round(wc[8]["worker_cpu_s_per_100k"], 2),
        "wordcount_entries_per_1k_g2": round(wc[2]["entries_per_1k"], 1),
        "wordcount_entries_per_1k_g8": round(wc[8]["entries_per_1k"], 1),
        "cpu_ratio_g8_vs_g2": round(ratio, 3), "goal_cpu_ratio_g8_vs_g2": GOAL_CPU_RATIO,
        "fanout_deliveries_per_s": round(fan["deliveries_per_s"]), "goal_fanout_deliveries_per_s": GOAL_FANOUT_PER_S,
        "fanout_posts_per_s": round(fan["posts_per_s"]),
        "fanout_worker_cpu_us_per_delivery": round(fan["cpu_us_per_delivery"], 1),
        "fanout_entries_per_call": round(fan["entries_per_call"], 1),
        "idle_worker_cpu_s_per_s": round(idle, 3),
        "fanout_idle_cpu_us_per_delivery": round(idle * fan["wall_s"] / (n_posts * FOLLOWERS) * 1e6, 1),
        "floor_cpu_us_per_delivery": round(floor["fanout_us"], 1),
        "floor_cpu_us_per_delivery_noop_handler": round(floor["fanout_noop_us"], 1),
        "floor_deliveries_per_s": round(floor_per_s), "fanout_vs_floor": round(fan["deliveries_per_s"] / floor_per_s, 3),
        "floor_cpu_us_per_sentence_g2": round(floor["wordcount_us_g2"], 1),
        "floor_cpu_us_per_sentence_g8": round(floor["wordcount_us_g8"], 1),
        "floor_cpu_ratio_g8_vs_g2": round(floor["wordcount_us_g8"] / floor["wordcount_us_g2"], 3),
        "topology_p50_ms": round(lat2["p50_ms"], 2), "topology_p99_ms": round(lat2["p99_ms"], 2),
        "topology_p50_ms_g8": round(lat8["p50_ms"], 2), "topology_p99_ms_g8": round(lat8["p99_ms"], 2),
    }))


if __name__ == "__main__":
    main()
