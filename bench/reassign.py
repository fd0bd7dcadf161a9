"""A reassignment under load: replication factor 1 -> 3 while an ``ack="applied"`` writer appends (issue 27).

    python -m bench.reassign [--quick] [--dir PATH]      (bench.lifecycle runs it too and reports its figures)

One :class:`~conductor.devcluster.DevCluster` (three workers) and the module of
:mod:`bench.lifecycle_app` at ``v1``, deployed with replication factor 1 and
filled with incompressible records (``--quick``: about 24 MB, else 96 MB) so
the two replicas the scale adds copy the leader's store by far horizon
(``replication.max.near.sync.message.lag`` is lowered so that they do). Then:

* ``steady``: one writer appends one record at a time; ``steady_p99_ms`` is the
  p99 of the gaps between its acknowledgements (at RF 1; ``rf3_after_p99_ms``,
  the same after the scale, shows what RF 3 itself costs an append);
* the reassignment: a plan to replication factor 3 (what `conductor scale
  --replicationFactor 3` stores), timed until the conductor deleted it
  (``rf1_to_rf3_s``), with the copy throttle at its default
  (``reassignment.copy.bytes.per.second``, 64 MiB/s);
  ``writer_p99_during_reassign_vs_steady`` is the writer's p99 during it over
  the steady one (goal <= 2.0);
* ``reassign_copy_mb_per_s``: the far-horizon copies' bytes over their
  seconds, from the workers' logs (each copy's own line: round, MB, seconds);
* the peer, same run: the same bytes (the files of an added replica's store,
  after the cluster stopped) through a plain gRPC file stream
  (:func:`bench.catchup.grpc_copy`: raw 2 MiB messages, fsync per file, no
  manifest, no checksum, no install); ``ratio_copy_vs_plain_grpc`` (goal >= 0.8).

Prints a table and, as the last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.catchup import ServerProcess, grpc_copy
from bench.floor import percentile
from bench.lifecycle_app import MODULE, REF, Writer, artifact
from conductor.client import Cluster
from conductor.controller import Conductor
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.metastore.module_spec import MAX_NEAR_SYNC_MESSAGE_LAG, ModuleSpec
from conductor.plan_builder import scale_plan
from conductor.shipping import deploy_code
from conductor.status import wait_serving

GOAL_P99_RATIO = 2.0
GOAL_COPY_RATIO = 0.8
COPY_LINE = re.compile(r"far-horizon catchup from \w+: installed after \d+ round\(s\), ([\d.]+) MB in ([\d.]+) s")
PAD_BYTES = 2000  #: random bytes (hex: twice as many characters) per filler record
#: filler records per request (one replog entry per group each): enough entries for a far-horizon copy
FILL_BATCH = 20
#: the near-horizon window: a replica further behind copies the leader's store
NEAR_LAG = 100


def deploy_rf1(hosts: str) -> None:
    c = Conductor(hosts, "bench-reassign")
    c.ms.start()
    try:
        spec = ModuleSpec(name=MODULE, module_ref=REF, tasks=4, threads=2, workers=1, replication_factor=1,
                          options={MAX_NEAR_SYNC_MESSAGE_LAG: str(NEAR_LAG)})
        deploy_code(c, spec, artifact("v1"))
        wait_serving(c.ms, MODULE, timeout_s=60)
    finally:
        c.ms.close()


def fill(client: Cluster, megabytes: int) -> int:
    """Incompressible filler records, in batches; how many."""
    depot = client.depot(MODULE, "*events")
    n, per_batch = 0, FILL_BATCH
    while n * PAD_BYTES < megabytes * 1e6:
        depot.append_many([{"key": f"fill{(n + i) % 50}", "i": -1, "pad": os.urandom(PAD_BYTES).hex()}
                           for i in range(per_batch)])
        n += per_batch
    return n


def copies(logs: Path) -> list[tuple[float, float]]:
    """(MB, seconds) of every far-horizon copy the workers' logs report installed."""
    return [(float(mb), float(s)) for p in logs.glob("node-*.log") for mb, s in COPY_LINE.findall(p.read_text())]


def plain_grpc_mb_per_s(store: Path, work: Path) -> tuple[float, float]:
    """(MB, MB/s) of a store's files (flattened into one folder) through the plain gRPC file stream."""
    flat = work / "flat"
    flat.mkdir(parents=True)
    for i, f in enumerate(sorted(p for p in store.rglob("*") if p.is_file() and not p.is_symlink())):
        os.link(f, flat / f"{i:05d}-{f.name}")
    mb = sum(p.stat().st_size for p in flat.iterdir()) / 1e6
    server = ServerProcess("raw", flat, work / "shelf")
    try:
        os.sync()
        seconds = grpc_copy(server.address, work / "copy")
    finally:
        server.stop()
    return mb, mb / seconds


def measure(root: Path, quick: bool) -> dict[str, Any]:
    steady_s, megabytes = (4.0, 24) if quick else (15.0, 96)
    dc = DevCluster(root / "cluster", nodes=3, session_timeout=6.0, balance_interval=0)
    dc.start()
    try:
        deploy_rf1(dc.hosts)
        with Cluster.connect(dc.hosts, timeout_s=30) as client:
            filled = fill(client, megabytes)
            writer = Writer(client.depot(MODULE, "*events")).start()
            time.sleep(1.0)
            steady_from = time.monotonic()
            time.sleep(steady_s)
            steady_to = time.monotonic()
            with Metastore(dc.hosts) as ms:
                ms.plans.create(MODULE, scale_plan(ms, MODULE, replication_factor=3))
                while ms.plans.get(MODULE) is not None:
                    time.sleep(0.05)
                done = time.monotonic()
                groups = {g: st for g, (st, _v) in ms.groups.all(MODULE).items()}
            time.sleep(steady_s)  # the writer at RF 3 (context: the append path itself now waits for followers)
            after_to = time.monotonic()
            writer.stop()
        steady = sorted(writer.gaps_ms(steady_from, steady_to))
        during = sorted(writer.gaps_ms(steady_to, done))
        after = sorted(writer.gaps_ms(done + 0.5, after_to))
        copied = copies(dc.root / "logs")
        added = next(r for r in groups[0].replicas if r != groups[0].leader)
    finally:
        dc.stop()
    mb, grpc_rate = plain_grpc_mb_per_s(dc.node_dir(added) / MODULE / "0" / "state", root / "grpc")
    copy_mb, copy_s = sum(m for m, _ in copied), sum(s for _, s in copied)
    copy_rate = copy_mb / copy_s if copy_s else float("nan")
    p99_steady, p99_during = percentile(steady, 99), percentile(during, 99)
    return {
        "filler_records": filled, "rf1_to_rf3_s": round(done - steady_to, 2), "far_horizon_copies": len(copied),
        "reassign_copy_mb": round(copy_mb, 1), "reassign_copy_mb_per_s": round(copy_rate, 1),
        "plain_grpc_mb": round(mb, 1), "plain_grpc_mb_per_s": round(grpc_rate, 1),
        "ratio_copy_vs_plain_grpc": round(copy_rate / grpc_rate, 3),
        "steady_p99_ms": round(p99_steady, 2), "reassign_p99_ms": round(p99_during, 2),
        "rf3_after_p99_ms": round(percentile(after, 99), 2),
        "reassign_appends": len(during), "failed_appends": len(writer.errors),
        "writer_p99_during_reassign_vs_steady": round(p99_during / p99_steady, 3),
        "goal_met": p99_during / p99_steady <= GOAL_P99_RATIO and copy_rate / grpc_rate >= GOAL_COPY_RATIO,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 24 MB store and a short steady phase")
    ap.add_argument("--dir", type=Path, default=None, help="where the cluster lives (default: a temp dir)")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-reassign-"))
    try:
        r = measure(root, args.quick)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    Console().print(f"RF 1 -> 3 in {r['rf1_to_rf3_s']} s; {r['far_horizon_copies']} far-horizon copies, "
                    f"{r['reassign_copy_mb']} MB at {r['reassign_copy_mb_per_s']} MB/s (plain gRPC: "
                    f"{r['plain_grpc_mb_per_s']} MB/s); writer p99 {r['steady_p99_ms']} ms steady, "
                    f"{r['reassign_p99_ms']} ms during; {r['failed_appends']} failed appends")
    print(json.dumps(r))


if __name__ == "__main__":
    main()
