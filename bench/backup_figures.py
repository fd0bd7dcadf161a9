"""``conductor backup``'s throughput against ``cp`` of the same files, in one run on a real cluster.

    python -m bench.backup_figures [--quick] [--mb N] [--rounds N]

A dev cluster (ZooKeeper, a conductor, one worker: a backup reads only each
group's leader) runs ``examples.clicks:Clicks`` (4 tasks, 2 task groups);
``--mb`` megabytes (192 ``--quick``, 256 full) of incompressible 4 KiB records
are appended to ``*raw``, and one untimed backup flushes the memtables (from
then on the stores' files are what a checkpoint holds). Each round, after an
``os.sync()``:

* ``backup`` (the figure under test): :func:`conductor.backups.take.take_backup`
  into an empty folder, the production path end to end. The worker runs on
  this machine, so it sees the folder: each leader's ``BackupToFolder`` round
  (RocksDB checkpoint, each file copied in by the kernel, read back against
  its CRC32C, fsynced, renamed), then the manifest. MB/s are the checkpoint
  files' bytes over its wall time.
* ``stream`` (the fallback, a diagnostic): the same with ``leader_copies=False``,
  every file streamed to this process in 2 MiB chunks (``BackupCheckpoint``),
  checked as it arrives, fsynced and renamed here.
* ``cp`` (the floor): ``cp -r`` of the leaders' store directories (the same
  files, read where the backup reads them) into an empty folder, then ``sync``.

Rates and the ratio are medians over ``--rounds`` (3 quick, 5 full). A last
incremental backup into a used folder, after a few more appends, reports how
much it copied (``incremental_copied_mb``: only new files); one before it, with nothing new, times what a
backup costs besides copying (``backup_fixed_ms``: a checkpoint per group, the calls, the manifest). The load
(``os.getloadavg``) is printed with the figures: the machine is shared.

Prints a table, then as the LAST line one JSON object (``backup_mb_per_s``,
``ratio_backup_vs_cp``; the goal of issue 28 is a ratio >= 0.7).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.unwind import unwind_on
from conductor.backups.take import take_backup
from conductor.client import Cluster
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.testing import deploy

MODULE = "Clicks"
RECORD_BYTES = 4096
#: ``--quick``'s data: a backup has a fixed cost cp has not (a checkpoint per group, the calls, the manifest:
#: ``backup_fixed_ms``, 40-130 ms here), so a throughput measured over 48 MB (0.07 s of cp) was mostly that
#: cost; 192 MB still runs in seconds
QUICK_MB = 192
BATCH = 100


def _fill(dc: DevCluster, megabytes: int) -> None:
    """Append ``megabytes`` of random 4 KiB records to ``*raw`` (random: SST files as large as the data)."""
    with Cluster.connect(dc.hosts) as cluster:
        raw = cluster.depot(MODULE, "*raw")
        n = megabytes * 10**6 // RECORD_BYTES
        for i in range(0, n, BATCH):
            raw.append_many([{"n": j, "blob": os.urandom(RECORD_BYTES)} for j in range(i, min(n, i + BATCH))])


def _leader_stores(dc: DevCluster, ms: Metastore) -> list[Path]:
    return [(dc.node_dir(st.leader or "") / MODULE / str(g) / "state").resolve()
            for g, (st, _v) in sorted(ms.groups.all(MODULE).items())]


def _cp(stores: list[Path], dest: Path) -> float:
    os.sync()
    started = time.perf_counter()
    for i, store in enumerate(stores):
        subprocess.run(["cp", "-r", str(store), str(dest / str(i))], check=True)
    subprocess.run(["sync", "-f", str(dest)], check=True)
    return time.perf_counter() - started


def measure(megabytes: int, rounds: int, root: Path) -> dict[str, Any]:
    """Start a cluster under ``root``, fill it, time backups and ``cp`` (see the module docstring)."""
    dc = DevCluster(root / "cluster", nodes=1, conductors=1, log_level="WARNING")
    dc.start()
    try:
        deploy(dc, "examples.clicks:Clicks", name=MODULE, tasks=4, threads=2, replication_factor=1)
        _fill(dc, megabytes)
        backup_rates, cp_rates, ratios, stream_rates = [], [], [], []
        with Metastore(dc.hosts) as ms:
            stores = _leader_stores(dc, ms)
            # untimed: its checkpoint flushes the memtables, so the stores' files are the checkpoints' files
            take_backup(ms, MODULE, root / "warm-up")
            for r in range(rounds):
                os.sync()
                result = take_backup(ms, MODULE, root / f"backup-{r}")
                mb = result.manifest.total_bytes() / 1e6
                b_rate = mb / result.seconds
                assert result.leader_copied, "the leaders on this machine did not copy into the folder themselves"
                os.sync()
                streamed = take_backup(ms, MODULE, root / f"stream-{r}", leader_copies=False)
                stream_rates.append(streamed.manifest.total_bytes() / 1e6 / streamed.seconds)
                dest = root / f"cp-{r}"
                dest.mkdir()
                c_rate = sum(p.stat().st_size for s in stores for p in s.rglob("*") if p.is_file()) / 1e6 \
                    / _cp(stores, dest)
                backup_rates.append(b_rate)
                cp_rates.append(c_rate)
                ratios.append(b_rate / c_rate)
                print(f"round {r + 1}: backup {mb:.1f} MB at {b_rate:.1f} MB/s, cp {c_rate:.1f} MB/s, "
                      f"ratio {b_rate / c_rate:.2f} (streamed: {stream_rates[-1]:.1f} MB/s)", flush=True)
                shutil.rmtree(dest)
            # a backup with nothing new to copy: its checkpoints, calls and manifest (cp has none of these)
            fixed = take_backup(ms, MODULE, root / f"backup-{rounds - 1}")
            assert fixed.copied_bytes == 0, fixed.copied_bytes
            _fill(dc, max(1, megabytes // 16))
            again = take_backup(ms, MODULE, root / f"backup-{rounds - 1}")
        return {
            "backup_mb": round(mb, 1),
            "backup_mb_per_s": round(statistics.median(backup_rates), 1),
            "cp_mb_per_s": round(statistics.median(cp_rates), 1),
            "ratio_backup_vs_cp": round(statistics.median(ratios), 3),
            "stream_mb_per_s": round(statistics.median(stream_rates), 1),
            "backup_fixed_ms": round(fixed.seconds * 1000, 1),
            "incremental_copied_mb": round(again.copied_bytes / 1e6, 2),
            "incremental_of_mb": round(again.manifest.total_bytes() / 1e6, 1),
        }
    finally:
        dc.stop()


def main(argv: list[str] | None = None) -> None:
    unwind_on()  # a kill stops the processes this starts (bench.unwind)
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_MB} MB, 3 rounds (about a minute)")
    ap.add_argument("--mb", type=int, default=None, help="data appended before the backups (256 full, 48 quick)")
    ap.add_argument("--rounds", type=int, default=None, help="backups and cp runs; medians are reported")
    args = ap.parse_args(argv)
    megabytes = args.mb or (QUICK_MB if args.quick else 256)
    rounds = args.rounds or (3 if args.quick else 5)
    with tempfile.TemporaryDirectory(prefix="millrace-bench-backup-") as tmp:
        figures = measure(megabytes, rounds, Path(tmp))
    load = os.getloadavg()
    print(f"backup {figures['backup_mb_per_s']} MB/s, cp {figures['cp_mb_per_s']} MB/s, ratio "
          f"{figures['ratio_backup_vs_cp']} (goal >= 0.7); incremental backup copied "
          f"{figures['incremental_copied_mb']} of {figures['incremental_of_mb']} MB; load {load[0]:.1f}")
    print(json.dumps({"bench": "backup_figures", "quick": args.quick, **figures,
                      "load_1m": round(load[0], 2)}), flush=True)


if __name__ == "__main__":
    main()
