"""What idempotent appends cost the leader: an entry built with a producer sequence vs one without.

Run ``python -m bench.idempotence [--quick]``. On one real store (RocksDB, WAL
off), the leader's work per client append as the task thread does it: build
the entry (``EntryPort.build`` of a ``DepotAppend``, :mod:`topology.entries`: records, and with a producer
the window lookup, the reply recorded, the LRU touch, the expiry check), stage
it, then apply the entries in drains of 64. Three alternating rounds per peer,
each keeping its best; the peer is the same work without a producer. Rates are
per second of this process's CPU time, so that other load on a shared machine
does not decide the ratio. Prints a
table, then as the LAST line one JSON object with the figures and the ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
from rich.console import Console
from rich.table import Table

from conductor.worker.replica_store import ReplicaStore
from pstate import TaskGroupStore
from topology.entries.port import EntryPort
from topology.entries.requests import DepotAppend

DRAIN = 64


def _run(n: int, producers: int, idempotent: bool) -> float:
    """Appends per second for `n` one-record appends from `producers` clients."""
    root = Path(tempfile.mkdtemp(prefix="bench-idem-"))
    rs = ReplicaStore(TaskGroupStore(root / "state", {}, depots=["*log"]))
    port = EntryPort(rs.current, None)
    try:
        record = [msgpack.packb({"user": "u1", "id": "x" * 40}, use_bin_type=True)]
        staged: list[tuple[int, int, bytes]] = []
        t0 = time.process_time()
        for i in range(n):
            producer = (i % producers + 1) if idempotent else 0
            builder, _reply = port.build(DepotAppend([("*log", 0, record)], producer, i // producers + 1))
            assert builder is not None
            staged.append((i, 1, rs.stage(i, builder)))  # entry i at replog offset i
            if len(staged) == DRAIN:
                rs.apply_entries(staged)
                staged = []
        rs.apply_entries(staged)
        return n / (time.process_time() - t0)
    finally:
        rs.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5,000 appends per round instead of 50,000")
    args = ap.parse_args()
    n = 5_000 if args.quick else 50_000
    console = Console(stderr=True)
    rows: dict[str, Any] = {}
    for producers in (1, 100):
        best = {True: 0.0, False: 0.0}
        for _round in range(3):
            for idem in (False, True):
                best[idem] = max(best[idem], _run(n, producers, idem))
        rows[str(producers)] = {"plain_per_s": round(best[False]), "idempotent_per_s": round(best[True]),
                                "ratio": round(best[True] / best[False], 3)}
    table = Table(title=f"leader build + stage + apply per one-record append, per CPU second "
                        f"({n:,} appends, best of 3)")
    for col in ("producers", "without producer /s", "idempotent /s", "ratio"):
        table.add_column(col, justify="right")
    for label, r in rows.items():
        table.add_row(label, f"{r['plain_per_s']:,}", f"{r['idempotent_per_s']:,}", f"{r['ratio']:.2f}")
    console.print(table)
    print(json.dumps({"bench": "idempotence", "appends": n, "by_producers": rows,
                      "ratio_idempotent_vs_plain": min(r["ratio"] for r in rows.values())}))


if __name__ == "__main__":
    main()
