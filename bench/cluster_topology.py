"""``python -m bench.cluster_append --only topology``: the sequential and topology phases alone, to iterate quickly.

The same cluster, module and workloads as the full bench (:mod:`bench.cluster_append`): Clicks at RF=3,
sequential ``ack="applied"`` appends for the ``p50_ms`` reference, then Timeline's two hops one post at a time
(``topology_p50_ms``) and their ratio; no throughput phases, no peer. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from conductor.devcluster import DevCluster


def run_topology_only(args: argparse.Namespace, root: Path, console: Console) -> dict[str, Any]:
    """The sequential reference and the topology phase on a fresh RF=3 dev cluster: their figures and ratio."""
    from bench.cluster_append import TIMELINE_FOLLOWERS, TIMELINE_GROUPS, Pool, deploy, sequential, topology_sequential

    t0 = time.monotonic()
    with DevCluster(root / "cluster", nodes=3, conductors=1, session_timeout=4.0,
                    worker=("-m", "conductor.worker")) as dc:
        deploy(dc.hosts, args.tasks, args.threads)
        with dc.connect() as cluster:
            seq = sequential(cluster, Pool.build(), args.count, args.warmup)
            console.log(f"sequential: p50 {seq['p50_ms']:.3f} ms, p99 {seq['p99_ms']:.3f} ms")
            topo = topology_sequential(cluster, dc.hosts, max(200, args.count // 4), 50)
            console.log(f"topology (Timeline, 2 hops to {TIMELINE_FOLLOWERS} followers over {TIMELINE_GROUPS} "
                        f"groups): p50 {topo['p50_ms']:.3f} ms, p99 {topo['p99_ms']:.3f} ms")
    return {"bench": "cluster_append", "only": "topology", "quick": args.quick,
            "p50_ms": round(seq["p50_ms"], 3), "p99_ms": round(seq["p99_ms"], 3),
            "topology_p50_ms": round(topo["p50_ms"], 3), "topology_p99_ms": round(topo["p99_ms"], 3),
            "ratio_topology_p50_vs_p50": round(topo["p50_ms"] / seq["p50_ms"], 2),
            "seconds": round(time.monotonic() - t0, 1)}
