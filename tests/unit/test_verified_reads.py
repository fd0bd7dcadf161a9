"""Every read of RocksDB is verified: a damaged SST block raises CorruptStore, never a short result.

rocksdict's iterators end quietly on a checksum mismatch; these tests flip
bytes in a real SST file of a real RocksDB and check that every scan path
(PState scans both ways, depot reads by key and by value, the verify pass a
replica runs at open) raises the typed error instead of returning a prefix.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from pstate import CorruptStore, Map, P, TaskGroupStore
from pstate.reader import scan_chunks
from pstate.store import pstate_cf

SCHEMAS = {"$$m": Map(int, str)}
N = 20_000


def _damaged(tmp_path: Path) -> TaskGroupStore:
    """A store with N records in a PState and a depot, flushed to SST files, then bytes flipped mid-file."""
    path = tmp_path / "state"
    s = TaskGroupStore(path, SCHEMAS, depots=["*d"])
    b = s.changes()
    b.set_many("$$m", [(i, f"value-{i:08d}-" + "x" * 40) for i in range(N)])
    for lo in range(0, N, 100):  # appends of 100: stored batches, the damage inside one of them
        b.depot_append("*d", 0, [f"record-{i:08d}-" + "y" * 40 for i in range(lo, lo + 100)])
    s.apply(0, b.encode())
    s.close()
    ssts = sorted(glob.glob(str(path / "*.sst")), key=os.path.getsize)
    assert ssts, "the close flushed nothing to SST files"
    for sst in ssts[-2:]:  # the two largest: the PState's and the depot's data
        size = os.path.getsize(sst)
        with open(sst, "r+b") as f:
            for off in (size // 3, size // 2):  # data blocks in the middle: a scan reads good blocks first
                f.seek(off)
                byte = f.read(1)
                f.seek(off)
                f.write(bytes([byte[0] ^ 0xFF]))
    return TaskGroupStore(path, SCHEMAS, depots=["*d"])


def test_intact_store_reads_everything_and_verifies(tmp_path: Path) -> None:
    s = TaskGroupStore(tmp_path / "ok", SCHEMAS, depots=["*d"])
    b = s.changes()
    b.set_many("$$m", [(i, str(i)) for i in range(1000)])
    b.depot_append("*d", 0, list(range(1000)))
    s.apply(0, b.encode())
    s.close()
    s = TaskGroupStore(tmp_path / "ok", SCHEMAS, depots=["*d"])
    s.verify()
    assert len(s.select("$$m", P.all())) == 1000
    assert len(s.depot("*d").read(0, 0, max_bytes=1 << 30)) == 1000
    first, nxt, raw = s.depot("*d").read_raw(0, 0, max_bytes=1 << 30)
    assert (first, nxt, len(raw)) == (0, 1000, 1000)
    r = s.applied_reader()
    assert len(list(r.scan(pstate_cf("$$m"), b"", None, reverse=True))) == 1000
    assert sum(map(len, scan_chunks(r, pstate_cf("$$m"), b"", None, lambda: 64))) == 1000
    s.close()


def test_damaged_sst_fails_every_scan_path(tmp_path: Path) -> None:
    s = _damaged(tmp_path)
    try:
        with pytest.raises(CorruptStore):
            s.verify()
        with pytest.raises(CorruptStore):
            s.select("$$m", P.all())
        r = s.applied_reader()
        with pytest.raises(CorruptStore):
            list(r.scan(pstate_cf("$$m"), b"", None))
        with pytest.raises(CorruptStore):
            list(r.scan(pstate_cf("$$m"), b"", None, reverse=True))
        with pytest.raises(CorruptStore):  # scans read a chunk per C call (paged scans, query topologies)
            list(scan_chunks(r, pstate_cf("$$m"), b"", None, lambda: 1000))
        with pytest.raises(CorruptStore):
            s.depot("*d").read(0, 0, max_bytes=1 << 30)
        with pytest.raises(CorruptStore):
            s.depot("*d").read_raw(0, 0, max_bytes=1 << 30)
    finally:
        s.close()


def test_a_scan_that_stops_before_the_damage_is_whole(tmp_path: Path) -> None:
    """Reads that never reach the damaged block are whole and succeed (the check costs nothing there)."""
    s = _damaged(tmp_path)
    try:
        got = s.depot("*d").read(0, 0, max_bytes=4096)
        assert got and [o for o, _r in got] == list(range(len(got)))
        assert s.select_one("$$m", 3) == "value-00000003-" + "x" * 40
    finally:
        s.close()
