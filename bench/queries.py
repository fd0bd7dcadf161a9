"""Queries benchmark: point reads, a query topology, and a paged scan against raw RocksDB iteration.

    python -m bench.queries [--quick] [--dir PATH]

One :class:`~conductor.devcluster.DevCluster` (ZooKeeper, a conductor, three workers), RF=3, two
deployments of ``examples.word_count:WordCount`` (16 tasks, 2 task groups):

* ``WordCount``, fed a Zipf-like corpus (a 2,000-word vocabulary): ``select_one`` of a word (p50), and
  ``cluster.query("WordCount", "top_words")``: a query topology on every task, each worker keeping its
  tasks' ten best, the client the ten best of those (p50; goal <= 3x ``select_one``). The two are timed
  call for call in turn (a select, a query, ...), so a machine shared with other work loads both alike.
* ``Keys`` (:class:`Keys`), loaded with N keys through microbatch commits: a paged scan of every task
  (``PState.scan_pages(None)``), keys per second, against a raw rocksdict iteration of the same keys and
  values (bytes mode, the same stored bytes) measured in the same run (goal >= 0.5x): :data:`ROUNDS` rounds
  of one raw iteration then one scan (the cluster idle meanwhile), the best of each (``scan_keys_per_s_first``:
  the first scan, cold).

The subscription figures of issue 31 (``subscription_lag_p50_ms``, ``diffs_per_s_1000_subscribers``) come
from the subscription benchmark (:func:`bench.subscription_figures.measure`, on the same cluster).
Prints a table, then as the LAST line one JSON object with the figures and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import rocksdict
from rich.console import Console
from rich.table import Table

from bench import subscription_figures
from bench.topology import corpus, deploy
from bench.unwind import unwind_on
from conductor.client import Cluster
from conductor.devcluster import DevCluster
from conductor.wire import millrace_pb2 as pb
from pstate import Map
from pstate.keys import encode_key
from topology import Module
from topology.partitioners import task_for_key

MODULE_REF = "examples.word_count:WordCount"
GOAL_QUERY_VS_SELECT = 3.0
GOAL_SCAN_VS_RAW = 0.5
#: changes per microbatch commit of the loader
LOAD_BATCH = 20_000
#: rounds of (raw iteration, scan), the best of each kept
ROUNDS = 3


class Keys(Module):
    """Many keys in one map PState, for the scan figures (loaded by :func:`load_counts`)."""

    def define(self, m):
        m.pstate("$$counts", Map(str, int))


class Keys1M(Keys):
    """:class:`Keys` deployed a second time (a module's name is its class's)."""


def key_name(i: int) -> str:
    return f"k{i:08d}"


def load_counts(cluster: Cluster, module: str, n: int, batch: int = LOAD_BATCH) -> None:
    """``$$counts`` of ``module`` gets keys ``k00000000``... with value ``i``: one microbatch commit per group and
    ``batch`` keys (fast: no stream topology, no hops)."""
    info = cluster.module_info(module)
    pack = msgpack.Packer(use_bin_type=True).pack
    by_group: dict[int, list[pb.BatchChange]] = {g: [] for g in range(info.groups)}
    batch_ids = dict.fromkeys(by_group, 0)

    def flush(g: int) -> None:
        batch_ids[g] += 1
        req = pb.CommitBatchRequest(module=module, group=g, topology="load-counts", batch_id=batch_ids[g],
                                    changes=by_group[g])
        cluster.call_group(module, g, "CommitBatch", req).result(timeout=300)
        by_group[g] = []

    for i in range(n):
        k = key_name(i)
        task = task_for_key(k, info.tasks)
        g = task % info.groups
        by_group[g].append(pb.BatchChange(target="$$counts", key=pack(k), op="set", value=pack(i), task=task))
        if len(by_group[g]) >= batch:
            flush(g)
    for g, rest in by_group.items():
        if rest:
            flush(g)


def p50_ms(fn: Callable[[], Any], n: int) -> float:
    return p50s_ms([fn], n)[0]


def p50s_ms(fns: list[Callable[[], Any]], n: int) -> list[float]:
    """The p50 of each of ``fns`` over ``n`` calls, called in turn (one of each, then again)."""
    for fn in fns:
        fn()  # warm: connections, code, caches
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(n):
        for fn, ts in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) * 1000 for ts in times]


def scan_rate(cluster: Cluster, module: str, page_size: int) -> tuple[float, int]:
    """(keys/s, keys) of a paged scan of every task of ``$$counts``."""
    counts = cluster.pstate(module, "$$counts")
    t0 = time.perf_counter()
    n = sum(len(page.items) for page in counts.scan_pages(None, page_size=page_size))
    return n / (time.perf_counter() - t0), n


def raw_db(n: int, tmp: Path) -> rocksdict.Rdict:
    """A RocksDB of the same n keys and values, as stored, flushed (bytes mode)."""
    db = rocksdict.Rdict(str(tmp / "raw"), rocksdict.Options(raw_mode=True))
    pack = msgpack.Packer(use_bin_type=True).pack
    wb = rocksdict.WriteBatch(raw_mode=True)
    for i in range(n):
        wb.put(b"\x02" + encode_key(key_name(i)), pack(i))
        if i % 50_000 == 49_999:
            db.write(wb)
            wb = rocksdict.WriteBatch(raw_mode=True)
    db.write(wb)
    db.flush()
    return db


def raw_rate(db: rocksdict.Rdict) -> float:
    """Keys/s of one raw rocksdict iteration of ``db``."""
    t0 = time.perf_counter()
    seen = sum(1 for _ in db.items())
    return seen / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    unwind_on()  # a kill stops the processes this starts (bench.unwind)
    p = argparse.ArgumentParser(prog="python -m bench.queries", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer keys and calls (a few minutes on 2 cores)")
    p.add_argument("--dir", type=Path, default=None, help="cluster directory (default: a temporary one)")
    args = p.parse_args(argv)
    n_keys, n_calls, n_text = (200_000, 100, 5_000) if args.quick else (1_000_000, 300, 20_000)
    console = Console()
    root = args.dir or Path(tempfile.mkdtemp(prefix="millrace-bench-queries-"))
    tmp = Path(tempfile.mkdtemp(prefix="millrace-bench-raw-"))
    dc = DevCluster(root / "cluster", nodes=3, session_timeout=10.0).start()
    try:
        deploy(dc.hosts, "WordCount", MODULE_REF, 2)
        deploy(dc.hosts, "Keys", "bench.queries:Keys", 2)
        with Cluster.connect(dc.hosts, timeout_s=120) as cluster:
            cluster.depot("WordCount", "*sentences").append_many(corpus(n_text, seed=3), ack="applied")
            rng = random.Random(5)
            words = [f"w{rng.randrange(2_000)}" for _ in range(n_calls + 1)]
            counts = cluster.pstate("WordCount", "$$counts")
            it = iter(words)
            select_ms, query_ms = p50s_ms([lambda: counts.select_one(next(it)),
                                           lambda: cluster.query("WordCount", "top_words", timeout_s=30)], n_calls)
            load0 = time.perf_counter()
            load_counts(cluster, "Keys", n_keys)
            load_s = time.perf_counter() - load0
            db = raw_db(n_keys, tmp)
            raws, rates = [], []
            for _ in range(ROUNDS):  # in turn, the cluster idle meanwhile: both see the machine as it is
                raws.append(raw_rate(db))
                rate, scanned = scan_rate(cluster, "Keys", 10_000)
                assert scanned == n_keys, (scanned, n_keys)
                rates.append(rate)
            db.close()
            raw, rate = max(raws), max(rates)
            subs = subscription_figures.measure(cluster, args.quick)
    finally:
        dc.stop()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()[0]
    table = Table(title="queries (RF=3, 3 workers, 16 tasks, 2 task groups)", title_justify="left")
    for col in ("figure", "value", "goal"):
        table.add_column(col)
    table.add_row("select_one p50, ms", f"{select_ms:.2f}", "")
    table.add_row("query topology top 10 of every task, p50 ms", f"{query_ms:.2f}",
                  f"<= {GOAL_QUERY_VS_SELECT}x select_one ({query_ms / select_ms:.2f}x)")
    table.add_row(f"paged scan of {n_keys:,} keys, keys/s", f"{rate:,.0f}", "")
    table.add_row("raw rocksdict iteration, keys/s", f"{raw:,.0f}",
                  f"scan >= {GOAL_SCAN_VS_RAW}x raw ({rate / raw:.2f}x)")
    table.add_row("load (microbatch commits), keys/s", f"{n_keys / load_s:,.0f}", "")
    table.add_row("subscription lag after append(ack=applied), p50 ms", f"{subs['subscription_lag_p50_ms']:.2f}",
                  "<= 5")
    table.add_row("diffs/s to 1,000 subscribers of one key", f"{subs['diffs_per_s_1000_subscribers']:,}",
                  ">= 100,000")
    table.add_row("load average (1 min) at the end", f"{load:.2f}", "")
    console.print(table)
    print(json.dumps({
        "bench": "queries", "quick": args.quick, "keys": n_keys, "loadavg_1m": round(load, 2),
        "select_one_p50_ms": round(select_ms, 3), "query_topology_p50_ms": round(query_ms, 3),
        "query_vs_select_one": round(query_ms / select_ms, 3), "goal_query_vs_select_one": GOAL_QUERY_VS_SELECT,
        "scan_keys_per_s": round(rate), "raw_rocksdb_keys_per_s": round(raw), "scan_keys_per_s_first": round(rates[0]),
        "scan_vs_raw": round(rate / raw, 3), "goal_scan_vs_raw": GOAL_SCAN_VS_RAW,
        "subscription_lag_p50_ms": subs["subscription_lag_p50_ms"], "goal_subscription_lag_p50_ms": 5,
        "diffs_per_s_1000_subscribers": subs["diffs_per_s_1000_subscribers"],
        "goal_diffs_per_s_1000_subscribers": 100_000,
        "ratio_query_topology_vs_select_one": round(query_ms / select_ms, 3),
    }))


if __name__ == "__main__":
    main()
