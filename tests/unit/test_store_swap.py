"""A far-horizon install's store is verified and opened off the task thread; the task thread only swaps it in
(conductor.worker.store_swap, ReplicaStore.prepare_install / install_prepared)."""

from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path

import pytest
import rocksdict

from conductor.worker.replica_store import ReplicaStore
from conductor.worker.store_swap import PreparedStore, hand_over
from pstate import Map, TaskGroupStore
from pstate import checkpoint as checkpoint_mod
from pstate.checkpoint import Manifest, store_dir
from pstate.errors import StoreClosed

SCHEMAS = {"$$counts": Map(str, int)}


def _leader_checkpoint(tmp_path: Path, name: str, value: int) -> tuple[Path, Manifest]:
    lead = TaskGroupStore(tmp_path / f"lead-{name}", SCHEMAS, ["*log"])
    cs = lead.changes()
    cs.set_many("$$counts", [(f"k{i}", i * value) for i in range(300)])
    lead.apply(value, cs.encode())
    m = lead.checkpoint(tmp_path / name, leader_epoch=1)
    lead.close()
    return tmp_path / name, m


def _no_task_thread_io(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, opening RocksDB or reading a file to check it fails the test."""
    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("the task thread's part of an install opened RocksDB or checked a file")
    monkeypatch.setattr(rocksdict, "Rdict", refuse)
    monkeypatch.setattr(checkpoint_mod, "file_crc", refuse)


def test_the_task_threads_part_of_an_install_opens_no_store_and_checks_no_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "replica" / "state"
    rs = ReplicaStore(TaskGroupStore(store_dir(dest), SCHEMAS, ["*log"]), path=dest)
    assert dest.is_symlink() and rs.store.path == os.path.realpath(dest)  # opened at its own directory
    for n in (1, 2):
        old = rs.store
        cp, m = _leader_checkpoint(tmp_path, f"cp{n}", n)
        prepared = rs.prepare_install(cp, m, {})  # (the copy's thread)
        assert prepared.store.applied_offset == n and os.path.realpath(dest) == old.path  # ready, not in use yet
        with monkeypatch.context() as mp:
            _no_task_thread_io(mp)
            assert prepared.claim()
            rs.install_prepared(prepared)  # (the task thread)
        assert os.path.realpath(dest) == os.path.realpath(prepared.target) == rs.store.path
        assert rs.store is prepared.store and rs.store.select_one("$$counts", "k7") == 7 * n
        assert rs.path == dest  # (the next install swaps the same path)
        assert old.select_one("$$counts", "k7") == (None if n == 1 else 7)  # open: the task thread left it
        assert os.path.exists(old.path)
        prepared.finish()  # (the copy's thread again)
        assert not os.path.exists(old.path)
        with pytest.raises(StoreClosed):
            old.select_one("$$counts", "k7")
    rs.close()
    reopened = TaskGroupStore(dest, SCHEMAS, ["*log"])
    assert reopened.applied_offset == 2 and reopened.select_one("$$counts", "k7") == 14
    reopened.close()
    assert sorted(p.name for p in dest.parent.iterdir()) == sorted(["state", os.path.basename(rs.store.path)])


def test_a_plain_store_directory_is_closed_before_the_swap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store made before stores had their own directories is opened through the path the swap redirects:
    closed first (RocksDB would write its next files into the new store), moved aside, deleted later."""
    dest = tmp_path / "replica" / "state"
    old = TaskGroupStore(dest, SCHEMAS, ["*log"])
    rs = ReplicaStore(old)
    cp, m = _leader_checkpoint(tmp_path, "cp", 1)
    prepared = rs.prepare_install(cp, m, {})
    with monkeypatch.context() as mp:
        _no_task_thread_io(mp)
        assert prepared.claim()
        rs.install_prepared(prepared)
    with pytest.raises(StoreClosed):
        old.select_one("$$counts", "k7")
    aside = [p for p in dest.parent.iterdir() if p.name.endswith(".old")]
    assert dest.is_symlink() and len(aside) == 1 and rs.store.select_one("$$counts", "k7") == 7
    prepared.finish()
    assert not aside[0].exists()
    rs.close()


def test_a_store_not_installed_is_closed_and_deleted(tmp_path: Path) -> None:
    """Refused (or the task thread never answered): the prepared store goes, and the replica's stays."""
    dest = tmp_path / "replica" / "state"
    rs = ReplicaStore(TaskGroupStore(dest, SCHEMAS, ["*log"]))
    cp, m = _leader_checkpoint(tmp_path, "cp", 1)
    refused = rs.prepare_install(cp, m, {})
    assert hand_over(refused, lambda done: done.set_result("in the ISR"), 5.0) == "in the ISR"
    assert not os.path.exists(refused.target) and not dest.is_symlink()

    never: PreparedStore = rs.prepare_install(cp, m, {})
    waiting: list[Future[str | None]] = []
    with pytest.raises(TimeoutError):
        hand_over(never, waiting.append, 0.05)
    assert not os.path.exists(never.target)
    assert not never.claim()  # the task thread comes too late: it installs nothing
    assert rs.store.applied_offset == -1
    rs.close()


def test_what_a_crash_mid_install_left_beside_a_store_is_removed_and_the_store_kept(tmp_path: Path) -> None:
    dest = tmp_path / "state"
    current = store_dir(dest)
    (Path(current) / "CURRENT").write_text("kept")
    staged = tmp_path / ".state.0123456789ab"  # staged, never swapped in
    staged.mkdir()
    (staged / "000007.sst").write_bytes(b"x" * 10)
    link = tmp_path / ".state.0123456789ab.link"  # a swap's new link, never renamed over state
    link.symlink_to(staged.name)
    other = tmp_path / ".other.0123456789ab"  # not this store's
    other.mkdir()

    removed = checkpoint_mod.remove_stale_versions(dest)

    assert sorted(removed) == sorted([str(staged), str(link)])
    assert os.path.realpath(dest) == current and (Path(current) / "CURRENT").read_text() == "kept"
    assert not staged.exists() and not os.path.lexists(link) and other.is_dir()
    assert checkpoint_mod.remove_stale_versions(dest) == []
    assert checkpoint_mod.remove_stale_versions(tmp_path / "absent" / "state") == []
