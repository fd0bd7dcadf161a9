"""A far-horizon install's writes run on an install thread while its replica is parked; the other replicas of
its task thread keep stepping (conductor.worker.checkpoint_install, issue 27)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from conductor.worker import checkpoint_install
from conductor.worker.durability import machine_boot
from conductor.worker.inbox import InstallCheckpoint
from conductor.worker.replica_disk import open_disk
from conductor.worker.replica_host import ReplicaHost
from conductor.worker.replica_store import ReplicaStore
from conductor.worker.task_thread import TaskThread
from pstate import Map, TaskGroupStore
from pstate.checkpoint import Manifest, store_dir
from replog.config import DEFAULT_SEGMENT_BYTES
from replog.epoch_file import EpochFile
from replog.messages import GroupState, MetastoreChanged, Role
from tests.unit.test_replica_host_faults import DEFINITION, _append, _leading, _open, _records

UPTO = 5
PAIRS = [(2, 0)]


def _checkpoint(tmp_path: Path, pstates: dict[str, Any], depots: list[str]) -> tuple[Path, Manifest]:
    """A leader's checkpoint of a store of that shape, applied up to :data:`UPTO`."""
    lead = TaskGroupStore(tmp_path / "lead", pstates, depots)
    lead.apply(UPTO, lead.changes().encode())
    m = lead.checkpoint(tmp_path / "cp", leader_epoch=2)
    lead.close()
    return tmp_path / "cp", m


def _following_n2(h: ReplicaHost) -> None:
    """``h`` (n1) follows n2 in epoch 2, outside the ISR: it may install n2's checkpoint."""
    h.post(MetastoreChanged(GroupState("n2", 2, ("n2",), ("n1",), 2, 1)))
    for _ in range(500):
        r = h.replica
        if r.role is Role.FOLLOWER and r.leader == "n2" and r.epoch == 2:
            return
        time.sleep(0.01)
    raise AssertionError("the replica did not follow n2")


def _gated(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event, list[str]]:
    """The install's writes wait for the returned gate; ``entered`` once they started, on the threads listed."""
    entered, gate, threads = threading.Event(), threading.Event(), []
    real = checkpoint_install.durable_steps

    def gated(*args: Any) -> None:
        threads.append(threading.current_thread().name)
        entered.set()
        assert gate.wait(10)
        real(*args)
    monkeypatch.setattr(checkpoint_install, "durable_steps", gated)
    return entered, gate, threads


def _install(tmp_path: Path, h: ReplicaHost) -> tuple[Future[str | None], Any]:
    pstates = {name: decl.schema for name, decl in DEFINITION.pstates.items()}
    cp, m = _checkpoint(tmp_path, pstates, DEFINITION.depot_names())
    prepared = h.store.prepare_install(cp, m, {})  # (the copy's thread)
    done: Future[str | None] = Future()
    h.post(InstallCheckpoint(prepared, PAIRS, "n2", 2, done))
    return done, prepared


def test_the_other_replicas_of_a_task_thread_step_while_an_install_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The task thread checks the install and hands its writes to an install thread; meanwhile it steps the
    other replica (its append is acknowledged) and holds what the parked replica is sent; once the writes are
    over, the replica resumes: new log start, marks, store and state machine, and what waited is handled."""
    runner = TaskThread("task-test")
    faults: list[ReplicaHost] = []
    lead, follower = (_open(tmp_path / n, g, faults, runner) for g, n in enumerate("ab"))
    entered, gate, threads = _gated(monkeypatch)
    try:
        _leading(lead)
        _following_n2(follower)
        done, prepared = _install(tmp_path, follower)
        assert entered.wait(10)
        assert _append(lead, _records(lead, {"id": 0})).result(timeout=10) == 0  # stepped while parked
        assert not done.done() and follower.store.applied_offset == -1
        follower.post(MetastoreChanged(GroupState("n2", 2, ("n2",), ("n1",), 3, 1)))  # waits for the resume
        time.sleep(0.05)
        assert follower.replica.applied == -1 and not done.done()
        gate.set()
        assert done.result(timeout=10) is None
        prepared.finish()  # (the copy's thread)
        assert len(threads) == 1 and threads[0].startswith("millrace-install")
        assert follower.log.start_offset == follower.log.end_offset == UPTO + 1
        assert follower.store.applied_offset == UPTO and follower.marks.current is not None
        assert follower.marks.current.applied == UPTO and follower.marks.current.installing == -1
        assert follower.stats["far_horizon_installs"] == 1 and EpochFile(tmp_path / "b" / "epochs").load() == PAIRS
        for _ in range(500):  # (handled once it resumed)
            st = follower._znode  # (the group state sent while it was parked)
            if st is not None and st.version == 3:
                break
            time.sleep(0.01)
        assert follower.replica.applied == UPTO and follower.replica.role is Role.FOLLOWER
        assert _append(lead, _records(lead, {"id": 1})).result(timeout=10) == 1 and faults == []
    finally:
        gate.set()
        for h in (lead, follower):
            h.stop()
    runner.stop()
    runner.thread.join(timeout=10)


def test_a_replica_stopped_while_parked_closes_its_disk_once_the_writes_are_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    faults: list[ReplicaHost] = []
    follower = _open(tmp_path / "b", 1, faults)
    entered, gate, _threads = _gated(monkeypatch)
    try:
        _following_n2(follower)
        done, prepared = _install(tmp_path, follower)
        assert entered.wait(10)
        stopping = threading.Thread(target=follower.stop)
        stopping.start()
        assert not follower.closed.wait(0.2)  # (its writes still run)
        gate.set()
        assert follower.closed.wait(10) and done.result(timeout=10) is None
        prepared.finish()
        stopping.join(timeout=10)
    finally:
        gate.set()
        follower.stop()
    disk = open_disk("b", tmp_path / "b", UPTO, DEFAULT_SEGMENT_BYTES, machine_boot())
    try:
        assert disk.storage_lost is None and disk.log.start_offset == disk.log.end_offset == UPTO + 1
        assert disk.epoch_file.load() == PAIRS
    finally:
        disk.log.close()
        disk.marks.close()


class _Crash(Exception):
    """The process died here (nothing after this step ran)."""


SCHEMAS = {"$$counts": Map(str, int)}


@pytest.mark.parametrize("steps_done", range(6))
def test_a_crash_between_two_writes_leaves_what_open_finishes_or_discards(tmp_path: Path, steps_done: int) -> None:
    """The writes run one after another on the install thread, in the install's crash order; a crash after any
    prefix of them reopens intact: before the store's swap the old store and log (the new epoch history is
    valid for the old log), after it the checkpoint's store and a log that restarts after it (the reset
    finished at open when the crash came before it)."""
    directory = tmp_path / "replica"
    directory.mkdir()
    dest = directory / "state"
    disk = open_disk("r", directory, -1, DEFAULT_SEGMENT_BYTES, machine_boot())
    rs = ReplicaStore(TaskGroupStore(store_dir(dest), SCHEMAS, ["*log"]), path=dest)
    cp, m = _checkpoint(tmp_path, SCHEMAS, ["*log"])
    prepared = rs.prepare_install(cp, m, {})
    assert prepared.claim()
    ran: list[str] = []

    def step(name: str, real: Any) -> Any:
        def crashing(*a: Any, **k: Any) -> Any:
            if len(ran) == steps_done:
                raise _Crash(name)
            ran.append(name)
            return real(*a, **k)
        return crashing
    disk.epoch_file.save = step("epochs", disk.epoch_file.save)  # type: ignore[method-assign]
    disk.marks.update = step("marks", disk.marks.update)  # type: ignore[method-assign]
    rs.install_prepared = step("swap", rs.install_prepared)  # type: ignore[method-assign]
    disk.log.reset = step("reset", disk.log.reset)  # type: ignore[method-assign]
    install = InstallCheckpoint(prepared, PAIRS, "n2", 2, Future())
    if steps_done < 5:
        with pytest.raises(_Crash):
            checkpoint_install.durable_steps(disk.epoch_file, disk.marks, rs, disk.log, install)
    else:
        checkpoint_install.durable_steps(disk.epoch_file, disk.marks, rs, disk.log, install)
    assert ran == ["epochs", "marks", "swap", "reset", "marks"][:steps_done]
    disk.log.close()
    disk.marks.close()
    rs.close()
    prepared.finish()
    store = TaskGroupStore(dest, SCHEMAS, ["*log"])
    applied = store.applied_offset
    store.close()
    reopened = open_disk("r", directory, applied, DEFAULT_SEGMENT_BYTES, machine_boot())
    try:
        assert reopened.storage_lost is None
        assert reopened.epoch_file.load() == (PAIRS if steps_done >= 1 else [])
        if steps_done >= 3:  # swapped: the checkpoint's store, the log after it
            assert applied == UPTO and reopened.log.start_offset == reopened.log.end_offset == UPTO + 1
        else:
            assert applied == -1 and reopened.log.end_offset == 0
    finally:
        reopened.log.close()
        reopened.marks.close()
