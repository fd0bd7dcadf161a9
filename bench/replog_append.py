"""Replog append throughput against raw file writes of the same bytes, in one run.

    python -m bench.replog_append [--quick] [--dir PATH]

What is compared, per entry size (100 B and 1 KiB), 1000 entries per batch:

* ``log``: ``Log.append(epoch, type, payloads)`` with the default ``fsync="batch"``
  (one ``fdatasync`` per batch, before ``append`` returns), segments rolling at
  the default 64 MiB;
* ``raw``: ``os.write(fd, b"".join(payloads))`` plus one ``fdatasync`` per batch
  on a plain file: the floor any log with the same durability has to pay.
* ``follower``: ``Log.append_frames`` of the leader's raw frames (CRC check of
  every frame, then the same write + fdatasync), the replication path.

Both sides get the same pre-built list of payloads, so the ratio shows what
framing, CRC32C and bookkeeping cost.  MB/s counts payload bytes (10**6 bytes),
identical for both sides.  Runs alternate between log, raw and follower, each
after an ``os.sync()`` so writeback left over from earlier runs stays out of the
timed section; rates are medians over the repeats and ``log/raw`` is the median
of per-pair ratios (adjacent runs share the disk's mood, so noise from other
tenants of the disk cancels out).  The follower appends what the leader's
``read(offset, 1 MiB)`` returns, so it pays one fdatasync per ~1 MiB fetch rather
than per 1000-entry batch: with 100 B entries it is faster than the leader.

The last line of output is one JSON object (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from replog.batch import scan_frames
from replog.log import Log

BATCH = 1000
GOAL_ENTRIES_PER_S_100B = 1_000_000
GOAL_RATIO_1KIB = 0.5


def _payloads(size: int) -> list[bytes]:
    """Distinct, incompressible-looking payloads (the log never sees the same object twice in a batch)."""
    seed = os.urandom(size + BATCH)
    return [seed[i : i + size] for i in range(BATCH)]


def _time_log(directory: Path, payloads: list[bytes], batches: int) -> float:
    shutil.rmtree(directory, ignore_errors=True)
    os.sync()  # no leftover writeback from earlier runs inside the timed section
    with Log.open(directory) as log:
        t0 = time.perf_counter()
        for _ in range(batches):
            log.append(1, 1, payloads)
        elapsed = time.perf_counter() - t0
        assert log.end_offset == batches * BATCH
    return elapsed


def _time_raw(path: Path, payloads: list[bytes], batches: int) -> float:
    os.sync()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        for _ in range(batches):
            data = b"".join(payloads)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fdatasync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()


def _time_follower(leader_dir: Path, follower_dir: Path, payloads: list[bytes], batches: int) -> float:
    """Append the leader's frames (read back in ~1 MiB fetches, as a follower would get them)."""
    shutil.rmtree(leader_dir, ignore_errors=True)
    shutil.rmtree(follower_dir, ignore_errors=True)
    with Log.open(leader_dir, fsync="none") as leader:
        for _ in range(batches):
            leader.append(1, 1, payloads)
        fetches = []
        offset = 0
        while offset < leader.end_offset:
            raw = leader.read(offset, 1 << 20)
            fetches.append(raw)
            offset = scan_frames(raw).frames[-1].next_offset
    os.sync()
    with Log.open(follower_dir) as follower:
        t0 = time.perf_counter()
        for raw in fetches:
            follower.append_frames(raw)
        elapsed = time.perf_counter() - t0
        assert follower.end_offset == batches * BATCH
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs (well under a minute)")
    parser.add_argument("--dir", help="directory on the disk to measure (default: a temporary directory)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="millrace-bench-", dir=args.dir))
    repeats = 5 if args.quick else 9
    # Roughly 1 s per measurement in quick mode on a disk with ~0.3 ms fdatasync.
    plan = {100: 600 if args.quick else 2000, 1024: 200 if args.quick else 600}
    console = Console()
    results: dict[int, dict[str, float]] = {}
    try:
        for size, batches in plan.items():
            payloads = _payloads(size)
            entries = batches * BATCH
            mb = entries * size / 1e6
            log_times: list[float] = []
            raw_times: list[float] = []
            follower_times: list[float] = []
            for _ in range(repeats):  # alternate so drift hits every side alike
                log_times.append(_time_log(root / "log", payloads, batches))
                raw_times.append(_time_raw(root / "raw.bin", payloads, batches))
                follower_times.append(_time_follower(root / "leader", root / "follower", payloads, batches))
            follower_t = statistics.median(follower_times)
            log_t = statistics.median(log_times)
            raw_t = statistics.median(raw_times)
            results[size] = {
                "entries_per_s": entries / log_t,
                "mb_per_s": mb / log_t,
                "raw_mb_per_s": mb / raw_t,
                "raw_entries_per_s": entries / raw_t,
                "follower_mb_per_s": mb / follower_t,
                # Median of per-pair ratios: a log run and the raw run right after it share
                # the disk's mood, so drift from other tenants cancels out.
                "ratio": statistics.median(r / lg for r, lg in zip(raw_times, log_times, strict=True)),
                "batches": batches,
            }
    finally:
        shutil.rmtree(root, ignore_errors=True)

    table = Table(
        title=f"replog append, {BATCH} entries/batch, fsync=batch (fdatasync per batch), median of {repeats}"
    )
    for col in ("entry", "log entries/s", "log MB/s", "raw MB/s", "log/raw", "follower MB/s"):
        table.add_column(col, justify="right")
    for size, r in results.items():
        table.add_row(
            f"{size} B",
            f"{r['entries_per_s']:,.0f}",
            f"{r['mb_per_s']:,.1f}",
            f"{r['raw_mb_per_s']:,.1f}",
            f"{r['ratio']:.2f}",
            f"{r['follower_mb_per_s']:,.1f}",
        )
    console.print(table)
    small, big = results[100], results[1024]
    goals = {
        "entries_per_s_100B>=1M": small["entries_per_s"] >= GOAL_ENTRIES_PER_S_100B,
        "ratio_vs_raw_1KiB>=0.5": big["ratio"] >= GOAL_RATIO_1KIB,
    }
    for goal, ok in goals.items():
        console.print(f"goal {goal}: {'met' if ok else 'MISSED'}")
    summary = {
        "bench": "replog_append",
        "quick": args.quick,
        "batch_entries": BATCH,
        "fsync": "batch",
        "entries_per_s_100B": round(small["entries_per_s"]),
        "mb_per_s_100B": round(small["mb_per_s"], 1),
        "raw_mb_per_s_100B": round(small["raw_mb_per_s"], 1),
        "ratio_vs_raw_100B": round(small["ratio"], 3),
        "entries_per_s_1KiB": round(big["entries_per_s"]),
        "mb_per_s_1KiB": round(big["mb_per_s"], 1),
        "raw_mb_per_s": round(big["raw_mb_per_s"], 1),
        "ratio_vs_raw_1KiB": round(big["ratio"], 3),
        "follower_mb_per_s_1KiB": round(big["follower_mb_per_s"], 1),
        "goals_met": all(goals.values()),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
