"""Where a Spark job over a depot spends its wall time, phase by phase, beside the same job over the API's ceiling.

    python -m bench.spark_timeline [--quick] [--records N] [--runs K] [--marks DIR]

The cluster, the records, the Spark session (local[2]) and the job are
``bench.microbatch``'s (200,000 records with ``--quick``); the Delta table is
not built. With :mod:`topology.spark.timeline`'s marks on, both jobs are warmed
up, then run alternately ``--runs`` times (8), and each job's marks (planner,
Python workers) are lined up against its start and end in this process:

* ``to_plan``: the job's start to ``partitions()`` (Spark's analysis, the data source's creation);
* ``plan``: ``partitions()`` (the depot's: ZooKeeper, ``PartitionInfo`` from each leader);
* ``to_read``: the plan's end to the first task's ``read`` (Spark plans the stage and starts its tasks);
* ``stagger``: between the first and the last task's ``read``;
* ``first_batch``: a task's ``read`` to Spark asking for its second batch (median over tasks; the
  depot's stream open, the node's first reply, its decoding);
* ``read``: the first task's ``read`` to the last one's end (the Python workers' share of the stage);
* ``tail``: the last read's end to the job's end (Spark finishing the stage, the shuffle, the second stage);
* for the depot only: ``plan_leaders`` (the part of ``plan`` that reads the module and its leaders from
  ZooKeeper; the rest asks the leaders for the offsets), ``first_reply`` (a task's ``read`` to its first
  reply, median over tasks) and ``decode`` (the time a task spends turning its replies into Arrow, summed,
  median over tasks).

It prints the phases' medians in ms and, as its last line, one JSON object with them and
``depot_vs_ceiling`` (the ceiling's median job time over the depot's, the ratio ``bench.microbatch``
reports as rows/s), and each job's median CPU seconds by process (``cpu_s_depot``, ``cpu_s_ceiling``:
:mod:`bench.cpu_split`). Run it on a quiet box: on a loaded one every phase stretches.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.cpu_split import CpuSplit
from bench.microbatch import DEPOT, MODULE, append_records, deploy, depot_df, job
from bench.python_ceiling import NAME as CEILING
from bench.python_ceiling import CeilingSource
from bench.unwind import unwind_on
from conductor.devcluster import DevCluster
from topology.spark import timeline
from topology.spark.timeline import Mark

#: the phases of every job, in order (module docstring)
PHASES = ("job", "to_plan", "plan", "to_read", "stagger", "first_batch", "read", "tail")
#: the depot's own phases
DEPOT_PHASES = ("plan_leaders", "first_reply", "decode")


def _tasks(marks: Sequence[Mark]) -> list[list[Mark]]:
    """The marks of each task's read, from ``read_start`` to ``read_end`` (a Python worker reads one at a time)."""
    by_pid: dict[int, list[Mark]] = defaultdict(list)
    for m in marks:
        by_pid[m.pid].append(m)
    out: list[list[Mark]] = []
    for ms in by_pid.values():
        current: list[Mark] | None = None
        for m in ms:
            if m.event == "read_start":
                current = [m]
            elif current is not None:
                current.append(m)
                if m.event == "read_end":
                    out.append(current)
                    current = None
    return sorted(out, key=lambda t: t[0].at)


def phases(marks: Sequence[Mark], start: float, end: float) -> dict[str, float]:
    """One job's phases in ms (module docstring), from the marks written between its `start` and `end`."""
    within = [m for m in marks if start <= m.at <= end]
    plan_start = min(m.at for m in within if m.event == "plan_start")
    plan_end = max(m.at for m in within if m.event == "plan_end")
    tasks = _tasks(within)
    if not tasks:
        raise ValueError(f"no task read between {start} and {end}: are the marks on?")
    first, last_end = tasks[0][0].at, max(t[-1].at for t in tasks)

    def first_at(task: list[Mark], event: str, skip: int = 0) -> float | None:
        found = [m.at for m in task if m.event == event]
        return found[skip] if len(found) > skip else None

    batches = [(at - t[0].at) for t in tasks if (at := first_at(t, "taken")) is not None]
    out = {"job": end - start, "to_plan": plan_start - start, "plan": plan_end - plan_start,
           "to_read": first - plan_end, "stagger": tasks[-1][0].at - first,
           "first_batch": statistics.median(batches) if batches else 0.0, "read": last_end - first,
           "tail": end - last_end}
    leaders = [m.at for m in within if m.event == "plan_leaders"]
    if leaders:
        out["plan_leaders"] = max(leaders) - plan_start
    replies = [(at - t[0].at) for t in tasks if (at := first_at(t, "reply")) is not None]
    if replies:
        out["first_reply"] = statistics.median(replies)
        out["decode"] = statistics.median(_decode_s(t) for t in tasks)
    return {k: round(v * 1000, 2) for k, v in out.items()}


def _decode_s(task: list[Mark]) -> float:
    """Seconds from each reply's arrival to its batch being built, summed over the task."""
    total, arrived = 0.0, None
    for m in task:
        if m.event == "reply":
            arrived = m.at
        elif m.event == "decoded" and arrived is not None:
            total += m.at - arrived
            arrived = None
    return total


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}


def timed_rounds(jobs: dict[str, Callable[[], Any]], runs: int, split: CpuSplit, console: Console
                 ) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[dict[str, float]]]]:
    """(start, end) wall-clock times of each job's runs, the jobs alternating, and their CPU seconds by process
    class (:mod:`bench.cpu_split`)."""
    spans: dict[str, list[tuple[float, float]]] = {k: [] for k in jobs}
    cpu: dict[str, list[dict[str, float]]] = {k: [] for k in jobs}
    for i in range(runs):
        for k, fn in jobs.items():
            t0 = time.time()
            cpu[k].append(split.measure(fn)[1])
            spans[k].append((t0, time.time()))
        console.log(f"run {i + 1}/{runs}: " + ", ".join(f"{k} {v[-1][1] - v[-1][0]:.3f}s" for k, v in spans.items()))
    return spans, cpu


def run(args: argparse.Namespace, root: Path, console: Console
        ) -> tuple[dict[str, list[dict[str, float]]], dict[str, list[dict[str, float]]]]:
    """Each job's phases and CPU seconds by process class, run by run."""
    from topology.spark import register
    from topology.spark.session import spark_session

    marks_dir = Path(args.marks) if args.marks else root / "marks"
    timeline.start(marks_dir)  # before Spark's JVM starts: it and its Python workers inherit it
    with DevCluster(root / "cluster", nodes=3, session_timeout=6.0) as dc:
        deploy(dc.hosts, args.tasks, args.threads)
        console.log(f"appending {args.records:,} records to {MODULE}/{DEPOT}")
        append_records(dc.hosts, args.records)
        spark = spark_session("bench-spark-timeline", warehouse=root / "warehouse", cores=2)
        try:
            register(spark)
            spark.dataSource.register(CeilingSource)
            jobs: dict[str, Callable[[], Any]] = {
                "depot": lambda: job(depot_df(spark, dc.hosts)),
                "ceiling": lambda: job(spark.read.format(CEILING).option("records", str(args.records))
                                       .option("partitions", str(args.threads)).load()),
            }
            for _ in range(3):  # untimed: Python workers, the ceiling's batches, the JIT (bench.microbatch)
                for fn in jobs.values():
                    fn()
            split = CpuSplit(lambda: [p.pid for p in dc.nodes.values()])
            spans, cpu = timed_rounds(jobs, args.runs, split, console)
        finally:
            spark.stop()
    if args.marks:
        Path(args.marks, "jobs.json").write_text(json.dumps(spans))
    marks = timeline.read_marks(marks_dir)
    return {k: [phases(marks, s, e) for s, e in v] for k, v in spans.items()}, cpu


def main(argv: list[str] | None = None) -> None:
    unwind_on()  # a kill stops the processes this starts (bench.unwind)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200,000 records instead of 1,000,000")
    ap.add_argument("--records", type=int, default=None)
    ap.add_argument("--runs", type=int, default=8, help="timed runs per source")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2, help="task groups")
    ap.add_argument("--marks", default=None,
                    help="keep the raw marks in this folder (with jobs.json: each job's start and end)")
    args = ap.parse_args(argv)
    args.records = args.records or (200_000 if args.quick else 1_000_000)
    console = Console()
    root = Path(tempfile.mkdtemp(prefix="millrace-spark-timeline-"))
    try:
        rows, cpu = run(args, root, console)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: medians(v) for k, v in rows.items()}
    cpu_med = {k: medians(v) for k, v in cpu.items() if v and v[0]}
    table = Table(title=f"Spark local[2] groupBy job over {args.records:,} records: phases, median ms "
                        f"of {args.runs} runs")
    for col in ("phase", "millrace.depot", "API ceiling", "depot - ceiling"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for p in (*PHASES, *DEPOT_PHASES):
        d, c = med["depot"].get(p), med["ceiling"].get(p)
        table.add_row(p, "-" if d is None else f"{d:.1f}", "-" if c is None else f"{c:.1f}",
                      "-" if d is None or c is None else f"{d - c:+.1f}")
    console.print(table)
    print(json.dumps({"bench": "spark_timeline", "quick": bool(args.quick), "records": args.records,
                      "runs": args.runs, "depot_ms": med["depot"], "ceiling_ms": med["ceiling"],
                      **{f"cpu_s_{k}": v for k, v in cpu_med.items()},
                      "depot_vs_ceiling": round(med["ceiling"]["job"] / med["depot"]["job"], 3)}))


if __name__ == "__main__":
    main()
