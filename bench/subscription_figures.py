"""Reactive subscriptions on a real RF=3 cluster: diff lag after ``ack="applied"``, and fan-out to 1,000 subscribers.

Run ``python -m bench.subscription_figures [--quick]``. A :class:`~conductor.devcluster.DevCluster` (ZooKeeper,
a conductor, three workers) runs WordCount (4 tasks, 2 task groups, replication factor 3); the client is this
process.

* ``subscription_lag_p50_ms``: one subscriber on a key; each ``append(ack="applied")`` of a sentence holding
  the key is timed from its return to the arrival of the diff it made (0 when the diff arrived first: the
  leader computes it as the entry applies, before it answers; ``diff_before_ack_fraction`` says how often).
  Goal <= 5 ms.
* ``diffs_per_s_1000_subscribers``: 1,000 subscriptions (1,000 streams) on one key; bursts of sentences hold
  the key; diffs (key changes: one per counted word) delivered to all subscribers, per second from the first
  append to the last diff received. Goal >= 100,000. An applied entry holds many sentences' updates, so one
  event carries many diffs (``fanout.events_per_s`` is the rate of events, the stream messages' unit).
* The peers, measured in the same run against the same leader: ``select_one_p50_ms`` (a point read's round
  trip; the lag's floor is of that order) and ``select_one_per_s`` (one reader polling the key, what a poller
  would see instead of diffs).

Prints a table, then as the LAST line one JSON object with the figures and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.unwind import unwind_on
from conductor.client import Cluster
from conductor.client.subscriptions import Change
from conductor.devcluster import DevCluster
from conductor.testing import deploy

LAG_GOAL_MS = 5.0
FANOUT_GOAL = 100_000


def _lag(cluster: Cluster, n: int) -> list[float]:
    """ms from each applied append's return to its diff's arrival (negative: the diff arrived first)."""
    arrived: dict[int, float] = {}
    cond = threading.Condition()

    def on_change(ch: Change) -> None:
        with cond:
            arrived[ch.value or 0] = time.perf_counter()
            cond.notify_all()

    counts = cluster.pstate("WordCount", "$$counts")
    sub = counts.subscribe("lagword", on_change).wait_ready()
    sentences = cluster.depot("WordCount", "*sentences")
    start = sub.value or 0
    out = []
    for i in range(1, n + 1):
        sentences.append("lagword", ack="applied")
        t_ack = time.perf_counter()
        with cond:
            cond.wait_for(lambda i=i: start + i in arrived, 10)  # type: ignore[misc]
            out.append((arrived[start + i] - t_ack) * 1000)
    sub.close()
    return out


def _select(cluster: Cluster, n: int) -> list[float]:
    counts = cluster.pstate("WordCount", "$$counts")
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        counts.select_one("lagword")
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _fanout(cluster: Cluster, subscribers: int, bursts: int, per_burst: int) -> dict[str, Any]:
    counts = cluster.pstate("WordCount", "$$counts")
    received = [0]
    events = [0]
    last = [0.0]
    lock = threading.Lock()

    def on_change(ch: Change) -> None:  # the client's event loop thread: one at a time
        if ch.kind == "diffs":
            received[0] += len(ch.diffs)
            events[0] += 1
            last[0] = time.perf_counter()

    subs = [counts.subscribe("hot", on_change) for _ in range(subscribers)]
    for s in subs:
        s.wait_ready(120)
    sentences = cluster.depot("WordCount", "*sentences")
    expected = subscribers * bursts * per_burst * 4
    t0 = time.perf_counter()
    for _ in range(bursts):
        sentences.append_many(["hot hot hot hot"] * per_burst, ack="applied")
    deadline = time.monotonic() + 120
    while received[0] < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    with lock:
        elapsed = last[0] - t0
    for s in subs:
        s.close()
    return {"diffs": received[0], "expected": expected, "events": events[0], "seconds": round(elapsed, 3),
            "diffs_per_s": round(received[0] / elapsed) if elapsed > 0 else 0,
            "events_per_s": round(events[0] / elapsed) if elapsed > 0 else 0}


def measure(cluster: Cluster, quick: bool) -> dict[str, Any]:
    """The subscription figures on a cluster running WordCount as "WordCount" (also joined into bench.queries)."""
    n_lag, bursts, per_burst = (200, 20, 50) if quick else (2000, 100, 100)
    cluster.depot("WordCount", "*sentences").append("lagword hot", ack="applied")  # warm the paths
    lag = _lag(cluster, n_lag)
    lag_p50 = max(0.0, statistics.median(lag))
    fan = _fanout(cluster, 1000, bursts, per_burst)
    return {"subscription_lag_p50_ms": round(lag_p50, 3),
            "subscription_lag_p99_ms": round(max(0.0, sorted(lag)[int(len(lag) * 0.99) - 1]), 3),
            "diff_before_ack_fraction": round(sum(1 for x in lag if x < 0) / len(lag), 3),
            "diffs_per_s_1000_subscribers": fan["diffs_per_s"], "fanout": fan}


def main() -> None:
    unwind_on()  # a kill stops the processes this starts (bench.unwind)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer appends and bursts")
    args = ap.parse_args()
    n_lag = 200 if args.quick else 2000
    console = Console(stderr=True)
    root = Path(tempfile.mkdtemp(prefix="bench-subs-"))
    dc = DevCluster(root / "cluster", nodes=3)
    dc.start()
    try:
        deploy(dc, "examples.word_count:WordCount", name="WordCount", tasks=4, threads=2)
        with Cluster.connect(dc.hosts, timeout_s=60) as cluster:
            subs = measure(cluster, args.quick)
            sel = _select(cluster, n_lag)
    finally:
        dc.stop()
        shutil.rmtree(root, ignore_errors=True)
    lag_p50, fan = subs["subscription_lag_p50_ms"], subs["fanout"]
    sel_p50 = statistics.median(sel)
    sel_per_s = 1000 / statistics.mean(sel)
    figures = {
        "bench": "subscription_figures", "quick": args.quick,
        **{k: subs[k] for k in ("subscription_lag_p50_ms", "subscription_lag_p99_ms", "diff_before_ack_fraction")},
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "select_one_p50_ms": round(sel_p50, 3),
        "diffs_per_s_1000_subscribers": fan["diffs_per_s"],
        "fanout": fan,
        "select_one_per_s": round(sel_per_s),
        "ratio_lag_vs_select_one": round(lag_p50 / sel_p50, 3) if sel_p50 else None,
        "ratio_diffs_per_s_vs_polling": round(fan["diffs_per_s"] / sel_per_s, 1),
        "lag_goal_met": lag_p50 <= LAG_GOAL_MS,
        "fanout_goal_met": fan["diffs_per_s"] >= FANOUT_GOAL,
    }
    table = Table(title="reactive subscriptions (RF=3, WordCount, 3 local workers)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("goal", justify="right")
    table.add_row("subscription lag p50 (ms)", f"{lag_p50:.2f}", f"<= {LAG_GOAL_MS}")
    table.add_row("select_one p50 (ms)", f"{sel_p50:.2f}", "")
    table.add_row("diffs/s, 1,000 subscribers", f"{fan['diffs_per_s']:,}", f">= {FANOUT_GOAL:,}")
    table.add_row("select_one/s (one poller)", f"{sel_per_s:,.0f}", "")
    console.print(table)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
