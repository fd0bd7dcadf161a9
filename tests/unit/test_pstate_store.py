"""TaskGroupStore: atomic idempotent apply, microbatch commits, staging, depots, errors, checkpoints."""

from __future__ import annotations

import os
from pathlib import Path as FsPath

import msgpack
import pytest

from pstate import (
    ChangeSet,
    CorruptStore,
    DepotNotFound,
    Map,
    P,
    PStateNotFound,
    SchemaMismatch,
    StoreClosed,
    TaskGroupStore,
    checkpoint,
    install,
    read_manifest,
)
from pstate.checkpoint import file_stamp
from pstate.errors import PStateError
from pstate.store import pstate_cf

SCHEMAS = {"$$counts": Map(str, int)}


@pytest.fixture
def store(tmp_path: FsPath) -> TaskGroupStore:
    s = TaskGroupStore(tmp_path / "state", SCHEMAS, depots=["*log"])
    yield s  # type: ignore[misc]
    s.close()


def test_apply_is_idempotent_and_persists(tmp_path: FsPath) -> None:
    s = TaskGroupStore(tmp_path / "s", SCHEMAS)
    cs = s.changes()
    cs.set("$$counts", "a", 1)
    payload = cs.encode()
    assert s.applied_offset == -1
    assert s.apply(5, payload) is True
    assert s.apply(5, payload) is False
    assert s.apply(3, payload) is False
    cs = s.changes()
    cs.transform("$$counts", P.key("a").update(lambda n: n + 10))
    assert s.apply(6, cs.encode())
    s.close()
    with pytest.raises(StoreClosed):
        s.select_one("$$counts", "a")
    s = TaskGroupStore(tmp_path / "s", SCHEMAS)
    assert s.applied_offset == 6
    assert s.select_one("$$counts", "a") == 11
    s.close()


def test_microbatch_commit_skips_replays(store: TaskGroupStore) -> None:
    cs = store.changes("wc", 7)
    cs.transform("$$counts", P.key("x").null_to_val(0).update(lambda n: n + 1))
    payload = cs.encode()
    assert store.apply(0, payload)
    assert store.last_batch("wc") == 7
    assert store.last_batch("other") is None
    # the same batch re-sent as a new entry (driver crash + replay): offset advances, data does not change
    assert store.apply(1, payload) is False
    assert store.applied_offset == 1
    assert store.select_one("$$counts", "x") == 1
    older = store.changes("wc", 6)
    older.set("$$counts", "x", 100)
    assert store.apply(2, older.encode()) is False
    assert store.select_one("$$counts", "x") == 1
    with pytest.raises(SchemaMismatch):
        store.changes("wc", None)


def test_builder_reads_its_own_writes(store: TaskGroupStore) -> None:
    cs = store.changes()
    cs.set_many("$$counts", [("a", 1), ("b", 2)])
    cs.transform("$$counts", P.key("a").update(lambda n: n * 10))
    assert cs.select("$$counts", P.all()) == [("a", 10), ("b", 2)]
    store.apply(0, cs.encode())
    assert store.select("$$counts", P.map_vals()) == [10, 2]


def test_update_is_transform_update_with_one_read_and_one_write(store: TaskGroupStore) -> None:
    cs = store.changes()
    cs.update("$$counts", "a", lambda n: (n or 0) + 1)
    cs.update("$$counts", "a", lambda n: n + 1)  # reads its own write
    cs.update("$$counts", "gone", lambda n: n)  # None stays None: nothing written, as with transform
    for bad in (None, "x"):  # not an int: refused as transform refuses it, nothing written
        with pytest.raises(SchemaMismatch):
            cs.update("$$counts", "a", lambda n, bad=bad: bad)
    with pytest.raises(SchemaMismatch):
        cs.update("$$counts", 7, lambda n: 1)  # a key of the wrong type goes the validating way
    store.apply(0, cs.encode())
    assert store.select("$$counts", P.all()) == [("a", 2)]


def test_staged_entries_compose_on_the_leader(store: TaskGroupStore) -> None:
    inc = P.key("k").null_to_val(0).update(lambda n: n + 1)
    payloads = []
    for off in range(3):  # three entries in flight before any is applied
        cs = store.changes()
        cs.transform("$$counts", inc)
        payloads.append(store.stage(off, cs))
    assert store.select_one("$$counts", "k") is None  # queries see applied state only
    for off, p in enumerate(payloads):
        store.apply(off, p)
    assert store.select_one("$$counts", "k") == 3
    cs = store.changes()
    cs.transform("$$counts", inc)
    store.stage(3, cs)
    store.drop_staged()
    cs = store.changes()
    cs.transform("$$counts", inc)
    store.apply(3, cs.encode())
    assert store.select_one("$$counts", "k") == 4


def test_changeset_encoding_is_compact_and_validated() -> None:
    cs = ChangeSet(["pstate:$$counts"], [(0, 0, [b"k1", b"v1", b"k2", b"v2"]), (1, 0, [b"k3"])], "t", 1)
    assert ChangeSet.decode(cs.encode()) == cs
    assert len(cs) == 3
    with pytest.raises(CorruptStore):
        ChangeSet.decode(b"\x93garbage")
    with pytest.raises(CorruptStore):
        ChangeSet.decode(msgpack.packb([1, None, None, ["x"], [[0, 5, [b"k", b"v"]]]]))
    with pytest.raises(CorruptStore):
        ChangeSet.decode(msgpack.packb([99, None, None, [], []]))


def test_corrupt_or_foreign_payload_writes_nothing(store: TaskGroupStore) -> None:
    with pytest.raises(CorruptStore):
        store.apply(0, b"not msgpack at all \xc1")
    foreign = ChangeSet([pstate_cf("$$nope")], [(0, 0, [b"k", b"v"])]).encode()
    with pytest.raises(CorruptStore):
        store.apply(0, foreign)
    assert store.applied_offset == -1


def test_typed_errors(store: TaskGroupStore) -> None:
    with pytest.raises(PStateNotFound) as ei:
        store.select("$$missing")
    assert ei.value.grpc_code == "NOT_FOUND"
    with pytest.raises(DepotNotFound):
        store.depot("*missing")
    cs = store.changes()
    with pytest.raises(DepotNotFound):
        cs.depot_append("*missing", 0, [1])
    with pytest.raises(SchemaMismatch) as e2:
        cs.depot_append("*log", -1, [1])
    assert e2.value.grpc_code == "INVALID_ARGUMENT"
    with pytest.raises(SchemaMismatch):
        cs.depot_append("*log", 0, [object()])
    assert len(cs) == 0
    assert issubclass(StoreClosed, PStateError)


def test_depot_append_read_trim(store: TaskGroupStore) -> None:
    cs = store.changes()
    assert cs.depot_append("*log", 0, ["a", "b", "c"]) == [0, 1, 2]
    assert cs.depot_append("*log", 1, [{"x": 1}]) == [0]
    assert cs.depot_append("*log", 0, ["d"]) == [3]
    store.apply(0, cs.encode())
    d = store.depot("*log")
    assert d.partition_info(0).end == 4 and d.partition_info(0).start == 0
    assert d.partition_info(7).end == 0
    assert d.read(0, 1) == [(1, "b"), (2, "c"), (3, "d")]
    assert d.read(0, 1, 3) == [(1, "b"), (2, "c")]
    assert d.read(0, 0, max_bytes=1) == [(0, "a")]  # at least one record
    assert d.read(1, 0) == [(0, {"x": 1})]
    cs = store.changes()
    cs.depot_trim("*log", 0, 2)
    cs.depot_trim("*log", 1, 99)  # clamped to the end
    store.apply(1, cs.encode())
    assert (d.partition_info(0).start, d.partition_info(0).end) == (2, 4)
    assert d.read(0, 0) == [(2, "c"), (3, "d")]
    assert d.partition_info(1).start == 1 and d.read(1, 0) == []
    cs = store.changes()
    assert cs.depot_append("*log", 1, ["y"]) == [1]


def test_depot_append_encoded_stores_the_bytes_and_stages_like_depot_append(store: TaskGroupStore) -> None:
    import msgpack

    cs = store.changes()
    assert cs.depot_append("*log", 0, ["a"]) == [0]
    raw = [msgpack.packb(r) for r in ({"u": 1}, "b", 2**63)]
    assert cs.depot_append_encoded("*log", 0, raw) == [1, 2, 3]
    assert cs.depot_append_encoded("*log", 0, []) == []
    with pytest.raises(DepotNotFound):
        cs.depot_append_encoded("*missing", 0, raw)
    payload = store.stage(0, cs)
    later = store.changes()  # builds on the staged entry: offsets continue
    assert later.depot_append_encoded("*log", 0, [msgpack.packb("c")]) == [4]
    store.apply(0, payload)
    store.apply(1, later.encode())
    d = store.depot("*log")
    assert d.read(0, 0) == [(0, "a"), (1, {"u": 1}), (2, "b"), (3, 2**63), (4, "c")]
    assert d.read_raw(0, 1, 3) == (1, 3, raw[:2])


def test_read_raw_counts_dense_offsets_and_honours_trims_and_max_bytes(store: TaskGroupStore) -> None:
    import msgpack

    raw = [msgpack.packb({"i": i, "pad": "x" * (i % 7)}) for i in range(10_000)]
    cs = store.changes()
    cs.depot_append_encoded("*log", 3, raw)
    store.apply(0, cs.encode())
    d = store.depot("*log")
    assert d.read_raw(3, 0) == (0, 10_000, raw)
    assert d.read_raw(3, 9_990, 20_000) == (9_990, 10_000, raw[9_990:])
    assert d.read_raw(3, 10_000) == (10_000, 10_000, [])
    assert d.read_raw(2, 0) == (0, 0, [])  # a partition never written
    # max_bytes: up to and including the record that reaches it, at least one record
    limit = sum(map(len, raw[100:5_000])) - 1
    assert d.read_raw(3, 100, None, limit) == (100, 5_000, raw[100:5_000])
    assert d.read_raw(3, 100, None, 1) == (100, 101, raw[100:101])
    cs = store.changes()
    cs.depot_trim("*log", 3, 4_000)
    store.apply(1, cs.encode())
    assert d.read_raw(3, 10, 4_500) == (4_000, 4_500, raw[4_000:4_500])  # the reply says where it starts
    assert d.read_raw(3, 0, 4_000) == (0, 0, [])


def test_checkpoint_install_and_corruption(tmp_path: FsPath, store: TaskGroupStore) -> None:
    cs = store.changes()
    cs.set_many("$$counts", [(f"k{i}", i) for i in range(500)])
    store.apply(0, cs.encode())
    m = store.checkpoint(tmp_path / "cp", leader_epoch=4)
    assert m.applied_offset == 0 and m.leader_epoch == 4
    assert read_manifest(str(tmp_path / "cp")) == m
    assert any(f.name.endswith(".sst") for f in m.files)
    dest = tmp_path / "replica" / "state"
    install(tmp_path / "cp", m, dest)
    r = TaskGroupStore(dest, SCHEMAS, depots=["*log"])
    assert r.applied_offset == 0 and r.select_one("$$counts", "k7") == 7
    r.close()
    # a second install swaps atomically over the first
    cs = store.changes()
    cs.set("$$counts", "k7", 70)
    store.apply(1, cs.encode())
    m2 = store.checkpoint(tmp_path / "cp2", leader_epoch=5)
    install(tmp_path / "cp2", m2, dest)
    r = TaskGroupStore(dest, SCHEMAS, depots=["*log"])
    assert r.applied_offset == 1 and r.select_one("$$counts", "k7") == 70
    r.close()
    # corrupt one file: refused, naming it, and dest untouched
    sst = next(f.name for f in m2.files if f.name.endswith(".sst"))
    victim = tmp_path / "cp2" / sst
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    os.unlink(victim)  # break the hard link so the live store keeps its file
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptStore) as ei:
        install(tmp_path / "cp2", m2, dest)
    assert sst in str(ei.value)
    r = TaskGroupStore(dest, SCHEMAS, depots=["*log"])
    assert r.select_one("$$counts", "k7") == 70
    r.close()


def test_install_trusts_files_checked_on_arrival_only_while_their_stamp_holds(
        tmp_path: FsPath, store: TaskGroupStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A far-horizon copy checks each file as it arrives and hands install its stamp: a file still so stamped is
    hard-linked and not read again; one that changed since (here rewritten with a flipped byte) is read and
    refused."""
    cs = store.changes()
    cs.set_many("$$counts", [(f"k{i}", i) for i in range(500)])
    store.apply(0, cs.encode())
    m = store.checkpoint(tmp_path / "cp", leader_epoch=4)
    checked = {f.name: file_stamp(tmp_path / "cp" / f.name) for f in m.files}
    read: list[str] = []
    real_crc = checkpoint.file_crc

    def counting_crc(path: str, *, fsync: bool = False) -> tuple[int, int]:
        read.append(os.path.basename(path))
        return real_crc(path, fsync=fsync)

    monkeypatch.setattr(checkpoint, "file_crc", counting_crc)
    dest = tmp_path / "replica" / "state"
    install(tmp_path / "cp", m, dest, checked)
    ssts = {f.name for f in m.files if f.name.endswith(".sst")}
    assert ssts and not read, read  # trusted, every kind of file: not read again
    assert all((dest / f.name).stat().st_ino == checked[f.name][1] for f in m.files)  # given up: linked
    r = TaskGroupStore(dest, SCHEMAS, depots=["*log"])
    assert r.applied_offset == 0 and r.select_one("$$counts", "k7") == 7
    r.close()
    # a byte flipped after the check (a new inode, so a new stamp): read again, and refused
    victim = tmp_path / "cp" / sorted(ssts)[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    os.unlink(victim)
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptStore) as ei:
        install(tmp_path / "cp", m, dest, checked)
    assert victim.name in str(ei.value)


def test_scans_keep_their_bounds_alive(tmp_path: FsPath) -> None:
    """rocksdict iterators do not keep their ReadOptions alive; DbReader must (regression)."""
    import gc

    s = TaskGroupStore(tmp_path / "s", SCHEMAS)
    cs = s.changes()
    cs.set_many("$$counts", [(f"k{i:04d}", i) for i in range(2000)])
    s.apply(0, cs.encode())
    view = s.pstate("$$counts")
    for _ in range(50):
        fwd = s._reader.scan(pstate_cf("$$counts"), b"\x02", b"\x02\x05k0010")
        rev = s._reader.scan(pstate_cf("$$counts"), b"\x02\x05k0005", b"\x02\x05k0010", reverse=True)
        _junk = [bytes(48) for _ in range(100)]
        gc.collect()
        assert sum(1 for _ in fwd) == 10 and sum(1 for _ in rev) == 5
        assert len(view.select(P.sorted_range("k0100", "k0110").all())) == 10
    s.close()


def test_damage_found_by_the_open_itself_is_a_typed_error_and_releases_the_store(tmp_path: FsPath) -> None:
    # campaign seed 2072: a flipped bit in the SST holding _meta failed the open's first read as a bare
    # Exception, so the worker gave up the whole module instead of quarantining this replica
    s = TaskGroupStore(tmp_path / "s", SCHEMAS)
    cs = s.changes()
    cs.set("$$counts", "a", 1)
    assert s.apply(0, cs.encode())
    s.close()  # flushed: _meta's applied offset is in an SST
    for sst in (tmp_path / "s").glob("*.sst"):
        with open(sst, "r+b") as f:  # two bytes of the first data block; the footer and index stay readable
            head = f.read(2)
            f.seek(0)
            f.write(bytes(b ^ 0xFF for b in head))
    for _ in range(2):  # the failed open let go of RocksDB: the same process can open (or move) it again
        with pytest.raises(CorruptStore):
            TaskGroupStore(tmp_path / "s", SCHEMAS)


def test_flush_persists_every_family_at_one_applied_offset_while_other_threads_run(
        tmp_path: FsPath) -> None:
    # a leader's checkpoint stalled the whole worker for 141-176 ms: RocksDB's checkpoint flushes memtables
    # holding the GIL. The store's flush (a checkpoint's too) must let other threads run, and must persist
    # every column family at once (the store has no WAL: a family flushed alone would break replay after a crash).
    import itertools
    import threading
    import time

    s = TaskGroupStore(tmp_path / "s", SCHEMAS, depots=["*log"])
    for offset in range(800):
        cs = s.changes()
        for k in range(50):
            cs.set("$$counts", f"k{offset}-{k}", offset)
        cs.depot_append("*log", 0, [os.urandom(3000)])
        assert s.apply(offset, cs.encode())
    families = [pstate_cf("$$counts"), "depot:*log", "_meta"]
    active = "rocksdb.num-entries-active-mem-table"
    assert all(s._cfs[f].property_int_value(active) for f in families)
    assert s._unflushed > 0  # (an empty memtable is left to the checkpoint's flush)
    ticks: list[float] = []
    done = threading.Event()

    def tick() -> None:
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.0005)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        time.sleep(0.01)
        started = time.perf_counter()
        s.flush()
        ended = time.perf_counter()
    finally:
        done.set()
        ticker.join()
    assert all(s._cfs[f].property_int_value(active) == 0 for f in families), "one atomic flush of all"
    level0 = "rocksdb.num-files-at-level0"  # one flush, not a second one of what came meanwhile
    assert [s._cfs[f].property_int_value(level0) for f in families[:2]] == [1, 1]
    # the ticker ran through the flush: holding the GIL, RocksDB's checkpoint stopped it for the whole flush
    stamps = [started, *(t for t in ticks if started < t < ended), ended]
    longest = max(b - a for a, b in itertools.pairwise(stamps))
    assert longest < max(0.5 * (ended - started), 0.005), (longest, ended - started)
    cs = s.changes()
    cs.set("$$counts", "late", 1)
    assert s.apply(800, cs.encode())  # in a memtable only: lost with the process
    s.abandon()
    s = TaskGroupStore(tmp_path / "s", SCHEMAS, depots=["*log"])
    assert s.applied_offset == 799
    assert s.select_one("$$counts", "k799-49") == 799
    assert s.select_one("$$counts", "late") is None
    s.close()


def test_checkpoint_flushes_even_a_small_memtable_without_the_gil(tmp_path: FsPath,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 27: RocksDB's checkpoint flushed a small memtable itself, holding the GIL through its fsyncs (7-16 ms
    # on the 2-core box, 75 ms while another store flushed): every thread of the leader waited, its event loop too
    s = TaskGroupStore(tmp_path / "s", SCHEMAS)
    cs = s.changes()
    cs.set("$$counts", "k", 1)
    assert s.apply(0, cs.encode())
    assert 0 < s._unflushed < 1 << 20
    flushes: list[int] = []
    compaction_flush = s._compaction_flush

    def counted() -> None:
        flushes.append(s._unflushed)
        compaction_flush()

    monkeypatch.setattr(s, "_compaction_flush", counted)
    manifest = s.checkpoint(tmp_path / "ck", leader_epoch=1)
    assert len(flushes) == 1 and manifest.applied_offset == 0
    active = "rocksdb.num-entries-active-mem-table"
    assert s._cfs[pstate_cf("$$counts")].property_int_value(active) == 0
    s.checkpoint(tmp_path / "ck2", leader_epoch=1)
    assert len(flushes) == 1, "nothing applied since: nothing to flush"
    s.close()
