"""A code update under load: how long does the writer wait while a module switches versions?

    python -m bench.lifecycle [--quick] [--dir PATH]

One :class:`~conductor.devcluster.DevCluster` (ZooKeeper, a conductor, three
worker processes on 127.0.0.1), the module ``mr_life`` of
:mod:`bench.lifecycle_app` deployed at version ``v1`` with replication factor
3 (4 tasks in 2 task groups). One writer appends one record at a time with
``ack="applied"`` (so the time between two acknowledgements is one append's
latency) throughout:

* ``steady``: for a while before the update; ``steady_p99_ms`` is the p99 of
  the gaps between acknowledgements;
* ``update``: ``conductor update Life --module mr_life.app:Life --code v2.zip``
  runs as its own process (as an operator runs it) and switches the module to
  ``v2`` (new topology code and a new PState); ``update_max_ack_gap_ms`` is the
  largest gap between acknowledgements from its first step (comparing the
  versions) until every group reported the switch, plus half a second. The
  seconds before, while the CLI process imports its libraries (niced, still on
  the same two cores), are shown apart (``cli_start_max_gap_ms``): an
  operator's CLI runs on another machine. The CLI's steps are timestamped, so
  the table says in which step the largest gap fell.

The same run's floors:

* ``steady_window_max_p50_ms`` is the largest gap of a steady stretch with
  as many appends as the update window, median over every such stretch: what a
  window with no update in it scores on this machine
  (``gap_vs_steady_window_max_p50`` near 1 means no pause the noise hides);
* ``noop_update_max_gap_ms``: before the update, the same CLI is run once to
  "update" to the version already running. It does all of the operator's own
  work (import both versions, compare them, read ZooKeeper) and stops before
  the cluster does anything, so its largest gap over the same kind of window
  is what the operator's process alone costs the writer on this shared
  machine (``gap_vs_noop_update``: what the workers' side of the update adds).

Then :mod:`bench.reassign` (a scale from replication factor 1 to 3 under a
writer) runs on its own cluster; its ``rf1_to_rf3_s``,
``reassign_copy_mb_per_s`` (the throttled copies' rate), ``ratio_copy_vs_plain_grpc``
(the copy path unthrottled against a plain gRPC stream of the same files) and
``writer_p99_during_reassign_vs_steady`` join the last line with this box's floors for it,
``writer_p99_beside_plain_copy_vs_steady`` and ``box_floor_during_vs_steady`` (all its figures
under ``reassign``).

Goal: ``update_max_ack_gap_ms <= 2 x steady_p99_ms`` (Rama pauses processing
2-30 s per update). Every acknowledged record is checked to be counted by
exactly one version. Prints a table and, as the last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import reassign
from bench.floor import percentile
from bench.lifecycle_app import MODULE, REF, Writer, artifact
from bench.unwind import unwind_on
from conductor.client import Cluster
from conductor.controller import Conductor
from conductor.devcluster import DevCluster
from conductor.metastore.module_spec import ModuleSpec
from conductor.shipping import deploy_code
from conductor.status import wait_serving

GOAL_RATIO = 2.0
#: bench.reassign's figures this benchmark's last line carries at its top level (the rest under "reassign")
REASSIGN_FIGURES = ("rf1_to_rf3_s", "reassign_copy_mb_per_s", "ratio_copy_vs_plain_grpc",
                    "writer_p99_during_reassign_vs_steady", "writer_p99_beside_plain_copy_vs_steady",
                    "box_floor_during_vs_steady")
#: after the CLI returns, the writer runs this much longer inside the measured window
TAIL_S = 0.5


def deploy(hosts: str) -> None:
    c = Conductor(hosts, "bench-lifecycle")
    c.ms.start()
    try:
        spec = ModuleSpec(name=MODULE, module_ref=REF, tasks=4, threads=2, workers=3, replication_factor=3)
        deploy_code(c, spec, artifact("v1"))
        st = wait_serving(c.ms, MODULE, timeout_s=60)
        assert st["serving"] == len(st["groups"]), st
    finally:
        c.ms.close()


def window_max_gap(writer: Writer, steps: list[tuple[float, str]]) -> tuple[float, str, dict[str, float]]:
    """The largest gap between acknowledgements from the CLI's first step until TAIL_S after its last, the step
    it fell in, and the largest gap of each step."""
    started, ended = steps[1][0], steps[-1][0]
    window = [(a, b) for a, b in zip(writer.acks, writer.acks[1:], strict=False)
              if started <= b.at <= ended + TAIL_S]
    worst = max(window, key=lambda p: p[1].at - p[0].at)
    by_step: dict[str, float] = {}
    for a, b in window:
        step = step_at(steps, a.at)[:40]
        by_step[step] = max(by_step.get(step, 0.0), (b.at - a.at) * 1000)
    return (worst[1].at - worst[0].at) * 1000, step_at(steps, worst[0].at), by_step


def run_update(hosts: str, wheel: Path) -> list[tuple[float, str]]:
    """`conductor update` as its own process; each line it prints, with when it was printed."""
    env = {**os.environ, "COLUMNS": "200"}
    # niced: on this shared 2-core machine the operator's CLI would otherwise take CPU from the cluster's
    # processes while it starts (about 3 s of imports and checks), which a separate machine would not
    proc = subprocess.Popen(["nice", "-n", "19", sys.executable, "-m", "conductor.cli", "update", MODULE, "--module", REF, "--code",
                             str(wheel), "--zk", hosts], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    steps = [(time.monotonic(), "start")]
    assert proc.stdout is not None
    for line in proc.stdout:
        steps.append((time.monotonic(), line.strip()))
    if proc.wait() != 0:
        raise RuntimeError("conductor update failed:\n" + "\n".join(s for _t, s in steps))
    return steps


def step_at(steps: list[tuple[float, str]], t: float) -> str:
    """The CLI step running at time ``t``."""
    current = steps[0][1]
    for at, what in steps:
        if at > t:
            break
        current = what
    return current


def stretch_maxima(gaps: list[float], n: int) -> list[float]:
    """The largest gap of every stretch of ``n`` consecutive gaps, sorted: the same run's floor for a window of
    ``n`` appends (no update in it, only the machine's own noise)."""
    if not gaps:
        return [float("nan")]
    n = max(1, min(n, len(gaps)))
    return sorted(max(gaps[i:i + n]) for i in range(len(gaps) - n + 1))


def measure(root: Path, steady_s: float) -> dict[str, Any]:
    dc = DevCluster(root / "cluster", nodes=3, session_timeout=6.0)
    dc.start()
    try:
        deploy(dc.hosts)
        wheel, running = root / "v2.zip", root / "v1.zip"
        wheel.write_bytes(artifact("v2").data)
        running.write_bytes(artifact("v1").data)
        with Cluster.connect(dc.hosts, timeout_s=30) as client:
            writer = Writer(client.depot(MODULE, "*events")).start()
            time.sleep(1.0)  # warm up
            steady_from = time.monotonic()
            time.sleep(steady_s)
            steady_to = time.monotonic()
            noop = run_update(dc.hosts, running)  # the floor: the operator's work alone (see the docstring)
            time.sleep(TAIL_S + 0.5)
            spawned = time.monotonic()
            steps = run_update(dc.hosts, wheel)
            # the update starts acting at the CLI's first step; before it the CLI process only starts (imports)
            started, ended = steps[1][0], steps[-1][0]
            time.sleep(TAIL_S + 0.5)
            writer.stop()
        steady_gaps = writer.gaps_ms(steady_from, steady_to)
        steady = sorted(steady_gaps)
        cli_start = writer.gaps_ms(spawned, started)
        noop_gap, _step, _by = window_max_gap(writer, noop)
        gap, worst_step, by_step = window_max_gap(writer, steps)
        window_appends = len([a for a in writer.acks if started <= a.at <= ended + TAIL_S])
        weights = Counter(a.value for a in writer.acks)
        expected: Counter[str] = Counter()
        for a in writer.acks:
            expected[a.record["key"]] += a.value
        with Cluster.connect(dc.hosts, timeout_s=30) as client:
            counts = client.pstate(MODULE, "$$counts")
            exact = all(counts.select_one(k) == n for k, n in expected.items())
        stretch_max = stretch_maxima(steady_gaps, window_appends)
        return {
            "steady_window_max_p50_ms": percentile(stretch_max, 50),
            "steady_window_max_p90_ms": percentile(stretch_max, 90),
            "steady_appends": len(steady), "steady_p50_ms": percentile(steady, 50),
            "steady_p99_ms": percentile(steady, 99), "steady_max_ms": steady[-1] if steady else float("nan"),
            "cli_start_s": started - spawned, "cli_start_max_gap_ms": max(cli_start, default=float("nan")),
            "update_s": ended - started, "update_appends": window_appends,
            "update_max_ack_gap_ms": gap, "worst_gap_step": worst_step, "noop_update_max_gap_ms": noop_gap,
            "v1_records": weights.get(1, 0), "v2_records": weights.get(10, 0),
            "failed_appends": len(writer.errors), "counted_once": exact,
            "steps": [(round((t - spawned) * 1000), s) for t, s in steps],
            "max_gap_ms_by_step": {k: round(v, 1) for k, v in by_step.items()},
        }
    finally:
        dc.stop()


def main() -> None:
    unwind_on()  # a kill stops the processes this starts (bench.unwind)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short steady phase (the run stays near a minute)")
    ap.add_argument("--dir", type=Path, default=None, help="where the cluster lives (default: a temp dir)")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-lifecycle-"))
    try:
        r = measure(root, steady_s=5.0 if args.quick else 20.0)
        moved = reassign.measure(root / "reassign", args.quick)  # issue 27: a scale under the same kind of writer
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    console = Console()
    gaps = r.pop("max_gap_ms_by_step")
    for at, what in r.pop("steps"):
        worst = gaps.get(what[:40])
        console.print(f"[dim]{at:>6} ms  {what}[/dim]" + (f"  (largest gap {worst} ms)" if worst else ""))
    table = Table(title="conductor update under an ack=applied writer (RF=3, 2 task groups)")
    for col in ("phase", "appends", "p50 ms", "p99 ms", "max gap ms", "note"):
        table.add_column(col, justify="left" if col in ("phase", "note") else "right")
    table.add_row("steady", str(r["steady_appends"]), f"{r['steady_p50_ms']:.1f}", f"{r['steady_p99_ms']:.1f}",
                  f"{r['steady_max_ms']:.1f}", f"a stretch of {r['update_appends']} appends: max gap "
                  f"{r['steady_window_max_p50_ms']:.1f} ms (median), {r['steady_window_max_p90_ms']:.1f} (p90)")
    table.add_row("no-op update", "", "", "", f"{r['noop_update_max_gap_ms']:.1f}",
                  "the same CLI to the running version: the operator's own work, no cluster change")
    table.add_row("CLI starts", "", "", "", f"{r['cli_start_max_gap_ms']:.1f}",
                  f"{r['cli_start_s']:.1f} s of imports in the operator's process (not measured below)")
    table.add_row("update", str(r["update_appends"]), "", "", f"{r['update_max_ack_gap_ms']:.1f}",
                  f"{r['update_s']:.1f} s; worst during: {r['worst_gap_step'][:60]}")
    console.print(table)
    ratio = r["update_max_ack_gap_ms"] / r["steady_p99_ms"]
    console.print(f"records by v1 {r['v1_records']}, by v2 {r['v2_records']}, failed {r['failed_appends']}, "
                  f"each counted by exactly one version: {r['counted_once']}")
    out = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}
    # context on a shared machine: the largest gap of the steady phase, which no update caused
    gap = r["update_max_ack_gap_ms"]
    out.update({"gap_vs_steady_p99": round(ratio, 3), "gap_vs_steady_max": round(gap / r["steady_max_ms"], 3),
                "gap_vs_steady_window_max_p50": round(gap / r["steady_window_max_p50_ms"], 3),
                "gap_vs_noop_update": round(gap / r["noop_update_max_gap_ms"], 3),
                "goal_ratio": GOAL_RATIO, "goal_met": ratio <= GOAL_RATIO})
    console.print(f"reassignment RF 1 -> 3: {moved['rf1_to_rf3_s']} s, copies {moved['reassign_copy_mb_per_s']} MB/s "
                  f"(throttled); copy path {moved['copy_path_mb_per_s']} MB/s unthrottled vs plain gRPC "
                  f"{moved['plain_grpc_mb_per_s']} MB/s, writer p99 x"
                  f"{moved['writer_p99_during_reassign_vs_steady']} of steady (this box's floor: x"
                  f"{moved['box_floor_during_vs_steady']}, bench.reassign)")
    out.update({k: moved[k] for k in REASSIGN_FIGURES})
    out["reassign"] = moved
    print(json.dumps(out))


if __name__ == "__main__":
    main()
