"""A replica a reassignment adds opens with no store on disk: created when first used, never when a far-horizon
install comes first (ReplicaStore.deferred, conductor.worker.replica_store)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import rocksdict

from conductor.worker.replica_store import ReplicaStore
from pstate import Map, TaskGroupStore
from pstate.checkpoint import Manifest, remove_stale_versions
from pstate.errors import StoreClosed
from pstate.store import depot_cf, pstate_cf
from tests.unit.test_group_code import DEFS
from topology.group_code import GroupCode, ModuleCode


def _code() -> GroupCode:
    return GroupCode(ModuleCode("M", "v1", "v2", DEFS.__getitem__), tasks=1, groups=1, group=0)


def _deferred(tmp_path: Path) -> tuple[ReplicaStore, Path]:
    dest = tmp_path / "replica" / "state"
    rs = ReplicaStore.open_versioned(dest, _code(), defer_empty=True)
    return rs, dest


def _no_store_created(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("a store was opened or created")
    monkeypatch.setattr(rocksdict, "Rdict", refuse)


def _checkpoint(tmp_path: Path, value: int) -> tuple[Path, Manifest]:
    """A leader's checkpoint of version v1's store (``$$counts`` and ``*events``), applied to ``value``."""
    lead = TaskGroupStore(tmp_path / "lead", {"$$counts": Map(str, int)}, ["*events"])
    cs = lead.changes()
    cs.set_many("$$counts", [(f"k{i}", i * value) for i in range(50)])
    lead.apply(value, cs.encode())
    m = lead.checkpoint(tmp_path / "cp", leader_epoch=1)
    lead.close()
    return tmp_path / "cp", m


def test_an_empty_replica_answers_as_an_empty_store_without_creating_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as mp:
        _no_store_created(mp)
        rs, dest = _deferred(tmp_path)
        assert not rs.created and not os.path.lexists(dest)
        assert rs.code is not None and rs.code.runner is not None and rs.code.applied == "v1"  # (the initial one)
        assert rs.applied_offset == -1 and rs.depot_sizes() == [] and rs.depot_bytes() == {}
        rs.drop_staged()  # (a follower's role change)
        rs.flush()  # (retention)
        rs.verify()  # (the worker's open)
    assert not rs.created and not os.path.lexists(dest)
    # first use: created, defined by the initial version, as an empty store opened at once would have been
    assert rs.read_value("$$counts", "k1") is None
    assert rs.created and dest.is_symlink() and rs.store.path == os.path.realpath(dest)
    assert rs.current().applied_offset == -1
    assert {pstate_cf("$$counts"), depot_cf("*events")} <= set(rocksdict.Rdict.list_cf(rs.store.path))
    b = rs.store.changes()
    b.set_many("$$counts", [("k1", 5)])
    rs.apply_entries([(0, 0, b.encode())])
    rs.close()
    again = ReplicaStore.open_versioned(dest, _code(), defer_empty=True)  # (on disk now: opened, not deferred)
    assert again.created and again.applied_offset == 0 and again.read_value("$$counts", "k1") == 5
    again.close()


def test_a_far_horizon_install_replaces_an_empty_replica_that_never_created_its_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rs, dest = _deferred(tmp_path)
    cp, m = _checkpoint(tmp_path, 3)
    with monkeypatch.context() as mp:
        mp.setattr(ReplicaStore, "_create", lambda _self: pytest.fail("the empty store was created"))
        prepared = rs.prepare_install(cp, m, {})  # (the copy's thread: defined by the build version)
        assert not os.path.lexists(dest)
        assert prepared.claim()
        rs.install_prepared(prepared)  # (the task thread)
        prepared.finish()
    assert rs.created and rs.store is prepared.store and os.path.realpath(dest) == os.path.realpath(prepared.target)
    assert rs.applied_offset == 3 and rs.read_value("$$counts", "k7") == 21
    assert sorted(p.name for p in dest.parent.iterdir()) == sorted(["state", os.path.basename(prepared.target)])
    rs.close()


def test_an_empty_replica_closed_before_its_store_was_created_never_creates_it(tmp_path: Path) -> None:
    """A replica removed (its directory deleted) or failed before it used its store: no store appears after."""
    rs, dest = _deferred(tmp_path)
    rs.close()
    with pytest.raises(StoreClosed):
        rs.read_value("$$counts", "k1")
    assert not os.path.lexists(dest)
    rs2, dest2 = _deferred(tmp_path / "b")
    rs2.abandon()
    with pytest.raises(StoreClosed):
        rs2.current()
    assert not os.path.lexists(dest2)


def test_threads_that_first_use_an_empty_replica_at_once_create_one_store(tmp_path: Path) -> None:
    rs, dest = _deferred(tmp_path)
    got: list[TaskGroupStore] = []
    threads = [threading.Thread(target=lambda: got.append(rs.store)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(s) for s in got}) == 1 and got[0].path == os.path.realpath(dest)
    assert [p.name for p in dest.parent.iterdir() if p.name != "state"] == [os.path.basename(got[0].path)]
    rs.close()


def test_a_restart_before_or_during_the_install_finds_no_store_and_opens_an_empty_one(tmp_path: Path) -> None:
    """What a crash leaves: nothing at ``state`` (before the install), or a staged version beside it that nothing
    points at (during it, before the swap); the next open deletes the staged version and starts empty, as it
    started from an empty store before."""
    rs, dest = _deferred(tmp_path)
    cp, m = _checkpoint(tmp_path, 3)
    prepared = rs.prepare_install(cp, m, {})  # staged and opened beside ``state``; then the process dies
    prepared.store.abandon()
    assert not os.path.lexists(dest) and os.path.isdir(prepared.target)
    assert remove_stale_versions(dest) == [prepared.target]  # (the worker's first open of the module)
    again = ReplicaStore.open_versioned(dest, _code())
    assert again.created and again.applied_offset == -1 and again.read_value("$$counts", "k7") is None
    again.close()
