"""``bench.cluster_append``'s figures for ``replication.fsync=interval``: sequential ``ack="applied"`` appends on a
fresh RF=3 dev cluster whose module acknowledges from the page cache (docs/replication.md, "Durability modes").

Kept apart from ``bench/cluster_append.py`` (one reason to change each): that bench's ``main`` calls
:func:`measure_interval` after its own cluster is stopped and before JetStream runs, and sets the result beside
JetStream's default (page cache, fsync every 2 minutes), the contract this mode is comparable with: both
acknowledge once every replica holds the write in memory. The figures are only reported when every replica's
storage marks say it acknowledged from the page cache (``volatile``), so they never silently measure ``always``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from replog.marks_file import MarksFile

MODULE = "Clicks"  # bench.cluster_append's module
#: the option values this figure runs with (flush.ms: the default)
FSYNC, FLUSH_MS = "interval", "100"


def _all_volatile(dc: DevCluster, groups: int) -> bool:
    """Every replica of every group wrote ``volatile`` marks: the mode took effect on every ISR member."""
    for node in dc.nodes:
        for g in range(groups):
            marks = MarksFile(dc.node_dir(node) / MODULE / str(g) / "marks").load()
            if marks is None or not marks.volatile:
                return False
    return True


def measure_interval(args: argparse.Namespace, root: Path, console: Console) -> dict[str, Any]:
    """Sequential p50/p99 (``args.count`` appends after ``args.warmup``) with ``replication.fsync=interval``,
    set live right after the deploy (as an operator would); ``interval_verified`` says every replica ran it."""
    from bench.cluster_append import Pool, deploy, sequential  # (that module imports this one)

    pool = Pool.build()
    with DevCluster(root / "cluster-interval", nodes=3, conductors=1, session_timeout=4.0) as dc:
        deploy(dc.hosts, args.tasks, args.threads)
        with Metastore(dc.hosts) as ms:
            ms.modules.set_option(MODULE, "replication.fsync", FSYNC)
            ms.modules.set_option(MODULE, "replication.flush.ms", FLUSH_MS)
        with dc.connect() as cluster:
            seq = sequential(cluster, pool, args.count, args.warmup)
        verified = _all_volatile(dc, args.threads)
    console.log(f"sequential, replication.fsync=interval: p50 {seq['p50_ms']:.3f} ms, p99 {seq['p99_ms']:.3f} ms"
                f"{'' if verified else ' (NOT every replica acknowledged from the page cache)'}")
    return {"p50_interval_ms": round(seq["p50_ms"], 3), "p99_interval_ms": round(seq["p99_ms"], 3),
            "interval_flush_ms": int(FLUSH_MS), "interval_verified": verified}


def interval_ratios(interval: dict[str, Any], js: dict[str, Any]) -> dict[str, Any]:
    """The interval figures with their ratio to JetStream's default (page cache) p50 of the same run."""
    js_p50 = js.get("jetstream_p50_ms")
    ratio = interval["p50_interval_ms"] / js_p50 if js_p50 and interval.get("interval_verified") else None
    return {**interval, "ratio_p50_interval_vs_jetstream_default": None if ratio is None else round(ratio, 3)}
