"""A depot's write and read path on one store: appended batches stored as one value against a key per record.

Run ``python -m bench.depot_layout [--quick]``. Two real stores (RocksDB, WAL off) take the same records
(``{"user", "n", "page"}``, ~40 B of msgpack each, as ``bench.microbatch`` appends them) in appends of
``--batch`` records (``bench.cluster_append``'s batched phase sends 10,000 a call, ``bench.microbatch`` 20,000):

* ``batches``: the current layout (``pstate.depot_batches``: an append of several records is one value);
* ``records``: the layout before session 16, one key per record (the peer: the same builder and entry, its
  depot writes put as that code put them).

Write: the leader's work for one append, built into an entry (``ChangeSetBuilder.depot_append_encoded``),
encoded, and applied (every replica's work), in µs per record. Read: the whole partition read back as a
``DepotStream`` serves it, replies of 8,192 records as stored and packed (``DepotView.read_packed``), in µs
per record. Rounds of the two layouts alternate in the same run (a shared machine's load hits both alike);
each figure is the median over rounds. Prints a table, then as the LAST line one JSON object with the ratios
``write_batches_vs_records`` and ``read_batches_vs_records`` (below 1: the batch layout is cheaper).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack
from rich.console import Console
from rich.table import Table

from pstate import depots
from pstate.changeset_builder import ChangeSetBuilder
from pstate.depot_batches import record_key
from pstate.store import TaskGroupStore

DEPOT = "*clicks"
#: records per reply, as ``DepotStream`` sends them by default
REPLY_RECORDS = 8192

Append = Callable[[ChangeSetBuilder, Sequence[bytes]], None]


def _batches(b: ChangeSetBuilder, records: Sequence[bytes]) -> None:
    b.depot_append_encoded(DEPOT, 0, records)


def _records(b: ChangeSetBuilder, records: Sequence[bytes]) -> None:
    """The pre-session-16 layout: the same meta and time run, one key per record."""
    p = depots.check_partition(0)
    info, last = depots.read_partition_meta(b.reader, DEPOT, 0)
    run, last = depots.time_run(DEPOT, p, info.end, b.time_ms, last)
    if run is not None:
        b.writes.put(depots.META, *run)
    b.writes.put_many(depots.depot_cf(DEPOT), [record_key(0, o) for o in range(info.end, info.end + len(records))],
                      records)
    end = depots.PartitionInfo(info.start, info.end + len(records), info.appended_bytes + sum(map(len, records)))
    b.writes.put(depots.META, depots.depot_meta_key(DEPOT, p), depots.encode_partition_meta(end, last))


def _round(root: Path, append: Append, chunks: list[list[bytes]]) -> tuple[float, float]:
    """(write µs per record, read µs per record) on a fresh store."""
    shutil.rmtree(root, ignore_errors=True)
    with TaskGroupStore(root, {}, [DEPOT]) as store:
        t0 = time.perf_counter()
        for i, chunk in enumerate(chunks):
            b = store.changes()
            append(b, chunk)
            store.apply(i, b.encode())
        write = time.perf_counter() - t0
        n = sum(map(len, chunks))
        view = store.depot(DEPOT)
        t0 = time.perf_counter()
        at = got = 0
        while at < n:
            records, _first, at, _offsets = view.read_packed(0, at, min(n, at + REPLY_RECORDS), 48 << 20)
            got += len(records)
        read = time.perf_counter() - t0
        assert got == n, (got, n)
    return write / n * 1e6, read / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200,000 records, 3 rounds per layout")
    ap.add_argument("--records", type=int, default=None, help="records (200,000 quick, 1,000,000 full)")
    ap.add_argument("--batch", type=int, default=10_000, help="records per append")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per layout (3 quick, 7 full)")
    args = ap.parse_args()
    n = args.records or (200_000 if args.quick else 1_000_000)
    rounds = args.rounds or (3 if args.quick else 7)
    recs = [msgpack.packb({"user": f"u{i % 1000}", "n": i, "page": f"/p/{i % 37}"}) for i in range(n)]
    chunks = [recs[i:i + args.batch] for i in range(0, n, args.batch)]
    layouts: dict[str, Append] = {"batches": _batches, "records": _records}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in layouts}
    tmp = Path(tempfile.mkdtemp(prefix="bench-depot-layout-"))
    try:
        for _ in range(rounds):
            for name, append in layouts.items():
                got[name].append(_round(tmp / name, append, chunks))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med: dict[str, Any] = {k: (statistics.median(w for w, _r in v), statistics.median(r for _w, r in v))
                           for k, v in got.items()}
    table = Table(title=f"depot layout: {n:,} records of ~{sum(map(len, recs)) // n} B, appends of {args.batch:,}")
    for col in ("layout", "write µs/record", "read µs/record"):
        table.add_column(col)
    for k, (w, r) in med.items():
        table.add_row(k, f"{w:.3f}", f"{r:.3f}")
    Console().print(table)
    print(json.dumps({
        "bench": "depot_layout", "quick": args.quick, "records": n, "batch": args.batch, "rounds": rounds,
        "write_us_per_record": {k: round(v[0], 4) for k, v in med.items()},
        "read_us_per_record": {k: round(v[1], 4) for k, v in med.items()},
        "write_batches_vs_records": round(med["batches"][0] / med["records"][0], 3),
        "read_batches_vs_records": round(med["batches"][1] / med["records"][1], 3),
    }))


if __name__ == "__main__":
    main()
