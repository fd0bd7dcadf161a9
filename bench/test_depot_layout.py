"""A cheap run of bench.depot_layout's measurement: both layouts take and give back the same records."""

from __future__ import annotations

from pathlib import Path

import msgpack

from bench.depot_layout import DEPOT, _batches, _records, _round
from pstate.depot_batches import BATCH_TAG
from pstate.store import TaskGroupStore, depot_cf


def test_both_layouts_store_and_read_every_record(tmp_path: Path) -> None:
    recs = [msgpack.packb({"n": i}) for i in range(1_000)]
    chunks = [recs[i:i + 300] for i in range(0, 1_000, 300)]
    for name, append in (("batches", _batches), ("records", _records)):
        write_us, read_us = _round(tmp_path / name, append, chunks)  # (asserts every record read back)
        assert write_us > 0 and read_us > 0
        with TaskGroupStore(tmp_path / name, {}, [DEPOT]) as store:
            keys = [k for k, _v in store.applied_reader().scan(depot_cf(DEPOT), b"", None)]
            assert store.depot(DEPOT).read_raw(0, 0, None, 1 << 30)[2] == recs
        assert len(keys) == (4 if name == "batches" else 1_000)
        assert all(k[12:] == BATCH_TAG for k in keys) == (name == "batches")
