"""One ``replication.fsync=always`` flush: the storage marks synced after the replog (serial) or beside it.

    python -m bench.marks_fsync [--quick] [--procs N] [--rounds N] [--flushes N] [--dir PATH]

Each flush appends one ~100 B entry to a replog and makes it acknowledgeable as a replica's task thread does
(``conductor.worker.durability.LogDurability.written``, issue 32):

* ``serial`` (the rule before issue 32): the replog's ``fdatasync``, then the marks' write and ``fdatasync``;
* ``beside`` (the rule now): the marks written first, their ``fdatasync`` on a pool thread while the replog's
  runs, the flush done once both returned (replog.eligibility's unsure storage makes that safe).

``--procs`` processes (default 3: the three replicas of a group on one box, as the cluster benchmarks run) flush
at once, each in its own directory. Rounds alternate serial and beside so both see the same disk; figures are
p50/p99 of every flush of every process, and ``ratio_p50_beside_vs_serial`` the median of the rounds' ratios.

The last line of output is one JSON object (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from conductor.worker.durability import LogDurability
from replog.config import ReplicationConfig
from replog.eligibility import StorageMarks
from replog.log import Log
from replog.marks_file import MarksFile

PAYLOAD = b"x" * 100


def _flushes(directory: str, mode: str, count: int, start: float) -> list[float]:
    """``count`` flushes in ``mode`` in ``directory`` (a fresh one), from ``start`` (time.time()): seconds each."""
    d = Path(directory)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    marks = MarksFile(d / "marks")
    marks.save(StorageMarks(1))
    config = ReplicationConfig()
    took: list[float] = []
    with Log.open(d / "replog", fsync="none") as log:
        durability = LogDurability(log, marks, boot=1)
        while time.time() < start:
            time.sleep(0.001)
        for _ in range(count):
            log.append(1, 0, [PAYLOAD])
            t0 = time.perf_counter()
            if mode == "beside":
                durability.written(config, 0)
            else:
                log.flush()
                assert marks.current is not None
                marks.save(replace(marks.current, acked=log.end_offset - 1))
            took.append(time.perf_counter() - t0)
    marks.close()
    return took


def _round(root: Path, mode: str, procs: int, count: int) -> list[float]:
    start = time.time() + 0.3
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        parts = pool.starmap(_flushes, [(str(root / f"{mode}-{i}"), mode, count, start) for i in range(procs)])
    return [x for part in parts for x in part]


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds of 300 flushes per mode (default 5 of 1,000)")
    ap.add_argument("--procs", type=int, default=3, help="processes flushing at once (default 3)")
    ap.add_argument("--dir", type=Path, default=None, help="where the replogs go (default: a temporary directory)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per mode (3 quick, 5 full)")
    ap.add_argument("--flushes", type=int, default=None, help="flushes per process and round (300 quick, 1,000)")
    args = ap.parse_args()
    rounds = args.rounds or (3 if args.quick else 5)
    count = args.flushes or (300 if args.quick else 1_000)
    root = Path(tempfile.mkdtemp(prefix="marks-fsync-", dir=args.dir))
    try:
        times: dict[str, list[float]] = {"serial": [], "beside": []}
        ratios = []
        for r in range(rounds):
            p50 = {}
            for mode in ("serial", "beside") if r % 2 == 0 else ("beside", "serial"):
                took = _round(root, mode, args.procs, count)
                times[mode] += took
                p50[mode] = _pct(took, 0.5)
            ratios.append(p50["beside"] / p50["serial"])
            print(f"round {r + 1}: serial p50 {p50['serial']:.3f} ms, beside p50 {p50['beside']:.3f} ms")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = {"procs": args.procs, "flushes_per_mode": rounds * count * args.procs}
    for mode, xs in times.items():
        summary[f"{mode}_p50_ms"] = round(_pct(xs, 0.5), 3)
        summary[f"{mode}_p99_ms"] = round(_pct(xs, 0.99), 3)
    summary["ratio_p50_beside_vs_serial"] = round(statistics.median(ratios), 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
