"""Where the CPU of a batched ``append_many`` goes: µs per record per process and per kind of thread, RF=3.

    python -m bench.batched_cpu [--quick] [--rounds N] [--seconds S]

Issue 32 asks for 500,000 records/s from ``Depot.append_many`` on a two-core box:
at most 4 µs of CPU per record for the client and the three workers together
(2 cores / 500k). ``bench.cluster_append`` gives the records/s, which on a shared
machine depends on whoever else runs; CPU time per record depends much less on it,
so this benchmark counts it: ``/proc/<pid>/stat`` and ``/proc/<pid>/task/*/stat``
(user + system time) of the client and each worker over ``--seconds`` of the same
workload as ``cluster_append``'s ``batched`` phase (10,000 records of 100 bytes per
call, two calling threads, ``ack="applied"``, on one dev cluster), split into:

* ``event_loop``: a worker's main thread (gRPC handlers, replication links);
* ``rocksdb``: RocksDB's background threads (memtable flushes, compactions);
* ``other``: every other thread (task threads: building, logging, applying;
  gRPC's and the retention driver's);
* ``system``: the part of each process's time spent in the kernel (sockets,
  file writes and fsyncs, context switches).

Each round's figures stand alone (a later round's RocksDB holds more and flushes
more). The ratio is against the budget of the goal, measured the same way:
``ratio_us_vs_budget`` = total µs per record / 4.0 (<= 1.0 is the goal's CPU).
Prints a table and, as the last line, one JSON object (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.cluster_append import Pool, batched_client, deploy
from bench.unwind import unwind_on
from conductor.devcluster import DevCluster

#: µs of CPU per record that 500,000 records/s leaves on two cores
BUDGET_US = 2 / 500_000 * 1e6
TICK = os.sysconf("SC_CLK_TCK")


def proc_times(pid: int) -> tuple[float, float]:
    """(user, system) seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def thread_times(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of ``pid``, by kind: event_loop, rocksdb or other."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        kind = "event_loop" if int(tid) == pid else "rocksdb" if comm.startswith("rocksdb") else "other"
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return out


def per_record(before: dict[str, float], after: dict[str, float], records: int) -> dict[str, float]:
    """µs per record of each key's growth from ``before`` to ``after`` (a key missing before counts from 0)."""
    return {k: round((after[k] - before.get(k, 0.0)) / records * 1e6, 3) for k in sorted(after)}


def snapshot(pids: dict[str, int]) -> dict[str, float]:
    """Every figure one round compares: per process user+system and system, per kind of worker thread."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        user, system = proc_times(pid)
        out[name] = user + system
        out[f"{name}.system"] = system
        if name != "client":
            for kind, t in thread_times(pid).items():
                out[f"workers.{kind}"] = out.get(f"workers.{kind}", 0.0) + t
    return out


def measure(root: Path, seconds: float, rounds: int, batch: int, threads: int, console: Console) -> list[dict[str, Any]]:
    pool = Pool.build()
    worker = ("-m", "conductor.worker", "--metrics-detail", "on")
    out = []
    with DevCluster(root / "cluster", nodes=3, conductors=1, session_timeout=4.0, worker=worker) as dc:
        deploy(dc.hosts, 6, 3)
        pids = {nid: p.pid for nid, p in sorted(dc.nodes.items())} | {"client": os.getpid()}
        with dc.connect() as cluster:
            batched_client(cluster, pool, min(2.0, seconds), batch, threads)  # warm-up: connections, first flushes
            for r in range(rounds):
                load = os.getloadavg()[0]
                before = snapshot(pids)
                t0 = time.monotonic()
                bat = batched_client(cluster, pool, seconds, batch, threads)
                elapsed = time.monotonic() - t0
                us = per_record(before, snapshot(pids), max(1, bat["acked"]))
                workers = round(sum(us[n] for n in pids if n != "client"), 3)
                row = {"round": r, "records_per_s": round(bat["acked"] / elapsed), "load": round(load, 2),
                       "us_workers": workers, "us_client": us["client"], "us_total": round(workers + us["client"], 3),
                       "us": us, "errors": bat["errors"][:3]}
                console.log(f"round {r}: {row['records_per_s']:,} records/s, {row['us_total']} µs/record "
                            f"(workers {workers}, client {us['client']}), load {load:.1f}")
                out.append(row)
    return out


def main(argv: list[str] | None = None) -> None:
    unwind_on()  # a kill stops the processes this starts (bench.unwind)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds of 6 s")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--batch", type=int, default=10_000, help="records per append_many call")
    ap.add_argument("--batch-threads", type=int, default=2)
    ap.add_argument("--dir", help="parent of the working directory (default: the system temp dir)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 4)
    seconds = args.seconds or (6.0 if args.quick else 15.0)
    console = Console(width=None if os.isatty(1) else 132)
    root = Path(tempfile.mkdtemp(prefix="millrace-batched-cpu-", dir=args.dir))
    try:
        rows = measure(root, seconds, rounds, args.batch, args.batch_threads, console)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    table = Table(title=f"append_many x{args.batch}, RF=3: CPU µs per record (budget {BUDGET_US:.1f} for 500k/s)")
    keys = sorted({k for row in rows for k in row["us"]})
    table.add_column("figure")
    for row in rows:
        table.add_column(f"round {row['round']}", justify="right")
    for k in ["records_per_s", "load", "us_total", "us_workers", "us_client"]:
        table.add_row(k, *(str(row[k]) for row in rows))
    for k in keys:
        table.add_row(k, *(str(row["us"].get(k, "-")) for row in rows))
    console.print(table)
    best = min(rows, key=lambda row: row["us_total"])
    print(json.dumps({"us_per_record_total": best["us_total"], "us_per_record_workers": best["us_workers"],
                      "us_per_record_client": best["us_client"], "records_per_s": best["records_per_s"],
                      "budget_us": BUDGET_US, "ratio_us_vs_budget": round(best["us_total"] / BUDGET_US, 3),
                      "rounds": rows}))


if __name__ == "__main__":
    main()
