"""The metastore against a real ZooKeeper: CRUD, CAS races, ephemerals, watches, connection hooks."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from conductor.client.router import LeaderRouter
from conductor.metastore import (
    GroupNotFound,
    GroupState,
    Metastore,
    ModuleExists,
    ModuleNotFound,
    NodeAlreadyRegistered,
    VersionConflict,
)
from conductor.metastore.layout import group_path
from conductor.metastore.module_spec import MIN_ISR, InvalidOption, ModuleSpec, UnknownOption
from conductor.zkserver import ZooKeeperServer
from replog.election import switch_leader


def wait_for(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def ms(zk_hosts: str) -> Iterator[Metastore]:
    m = Metastore(zk_hosts, session_timeout=2.0).start()
    try:
        yield m
    finally:
        m.close()


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def make_spec(name: str, threads: int = 2) -> ModuleSpec:
    return ModuleSpec(name=name, module_ref="examples.word_count:WordCount", tasks=4, threads=threads,
                      workers=3, replication_factor=3)


REPS = ("n1", "n2", "n3")


def initial_groups(threads: int = 2) -> dict[int, GroupState]:
    return {g: GroupState.initial(REPS[g:] + REPS[:g]) for g in range(threads)}


def test_module_crud_and_options(ms: Metastore) -> None:
    name = unique("Crud")
    spec = make_spec(name)
    ms.modules.create(spec, initial_groups())
    assert name in ms.modules.names()
    got, version = ms.modules.get(name)
    assert got == spec and version == 0
    assert ms.groups.get(name, 1) == (GroupState.initial(("n2", "n3", "n1")), 0)
    assert sorted(ms.groups.all(name)) == [0, 1]
    with pytest.raises(ModuleExists):
        ms.modules.create(make_spec(name, threads=1), initial_groups(1))
    assert ms.modules.get(name)[0] == spec  # the refused create changed nothing

    updated = ms.modules.set_option(name, MIN_ISR, "3")
    assert updated.option(MIN_ISR) == 3 and ms.modules.get(name) == (updated, 1)
    with pytest.raises(InvalidOption):
        ms.modules.set_option(name, MIN_ISR, "4")
    with pytest.raises(UnknownOption):
        ms.modules.set_option(name, "replication.bogus", "1")

    ms.resigns.request(name, 0, "n2", epoch=0)
    ms.modules.delete(name)
    assert name not in ms.modules.names()
    with pytest.raises(ModuleNotFound):
        ms.modules.get(name)
    with pytest.raises(GroupNotFound):
        ms.groups.get(name, 0)
    with pytest.raises(ModuleNotFound):
        ms.modules.delete(name)


def test_create_module_rejects_mismatched_groups(ms: Metastore) -> None:
    name = unique("Bad")
    with pytest.raises(ValueError, match="2 task groups"):
        ms.modules.create(make_spec(name), initial_groups(1))
    assert name not in ms.modules.names()


def test_cas_conflict_between_sessions(zk_hosts: str, ms: Metastore) -> None:
    name = unique("Cas")
    ms.modules.create(make_spec(name), initial_groups())
    other = Metastore(zk_hosts, session_timeout=2.0).start()
    try:
        state, version = ms.groups.get(name, 0)
        stale_state, stale_version = other.groups.get(name, 0)
        new_version = ms.groups.cas(name, 0, switch_leader(state, "n2"), version)
        assert new_version == version + 1
        with pytest.raises(VersionConflict) as err:
            other.groups.cas(name, 0, switch_leader(stale_state, "n3"), stale_version)
        assert err.value.current == switch_leader(state, "n2")
        assert err.value.current_version == new_version
        # The loser retries from the state the conflict handed it.
        assert other.groups.cas(name, 0, switch_leader(err.value.current, "n3"), err.value.current_version) == 2
        assert ms.groups.get(name, 0)[0].leader == "n3" and ms.groups.get(name, 0)[0].epoch == state.epoch + 2
    finally:
        other.close()
        ms.modules.delete(name)


def test_ephemeral_node_disappears_when_session_closes(zk_hosts: str, ms: Metastore) -> None:
    node = unique("node")
    seen: list[list[str]] = []
    handle = ms.nodes.watch(seen.append)
    worker = Metastore(zk_hosts, session_timeout=2.0).start()
    try:
        info = worker.nodes.register(node, "127.0.0.1:7001")
        assert node in ms.nodes.live()
        got = ms.nodes.get(node)
        assert got is not None and got.address == "127.0.0.1:7001" and got.pid == info.pid
        wait_for(lambda: any(node in s for s in seen), what="watch to report the node")
        with pytest.raises(NodeAlreadyRegistered, match="already registered by ZooKeeper session"):
            ms.nodes.register(node, "127.0.0.1:7002")
        worker.nodes.register(node, "127.0.0.1:7001")  # re-registering in the same session is fine
    finally:
        worker.close()
    assert node not in ms.nodes.live()
    assert ms.nodes.get(node) is None
    wait_for(lambda: node not in seen[-1], what="watch to report the node gone")
    handle.cancel()


def test_a_node_advertises_its_metrics_address_and_keeps_it_when_it_registers_again(zk_hosts: str,
                                                                                  ms: Metastore) -> None:
    node = unique("node")
    worker = Metastore(zk_hosts, session_timeout=2.0).start()
    try:
        worker.nodes.register(node, "127.0.0.1:7001", replication="127.0.0.1:7003")
        assert ms.nodes.get(node).metrics == ""  # type: ignore[union-attr]
        worker.nodes.advertise_metrics(node, "127.0.0.1:9100")
        got = ms.nodes.get(node)
        assert got is not None and (got.address, got.replication, got.metrics) == \
            ("127.0.0.1:7001", "127.0.0.1:7003", "127.0.0.1:9100")
        worker.nodes.register(node, "127.0.0.1:7001", replication="127.0.0.1:7003")  # as reregister() does
        assert ms.nodes.get(node).metrics == "127.0.0.1:9100"  # type: ignore[union-attr]
    finally:
        worker.close()


def test_a_restarted_worker_waits_for_its_crashed_predecessors_session(zk_hosts: str, ms: Metastore) -> None:
    """Found by the fault campaign (seed 203): a worker SIGKILLed and restarted within its session timeout
    found its id still registered by the dead session and exited instead of waiting for it to expire."""
    node = unique("node")
    crashed = Metastore(zk_hosts, session_timeout=2.0).start()
    crashed.nodes.register(node, "127.0.0.1:7001")
    threading.Timer(1.0, crashed.close).start()  # its session ends a second later (as expiry would end it)
    restarted = Metastore(zk_hosts, session_timeout=2.0).start()
    try:
        info = restarted.nodes.register(node, "127.0.0.1:7002", stale_wait_s=20.0)
        assert ms.nodes.get(node) == info
        with pytest.raises(NodeAlreadyRegistered):  # a live holder of the id keeps it: the wait ends, it fails
            ms.nodes.register(node, "127.0.0.1:7003", stale_wait_s=1.0)
    finally:
        restarted.close()


def test_registration_survives_the_stale_holder_vanishing_between_create_and_read(zk_hosts: str,
                                                                                   ms: Metastore) -> None:
    """Found by the fault campaign (seed 2314): a restarted worker's create met its crashed predecessor's
    node, whose session then ended before the worker read the node's owner; the read's NoNodeError made the
    worker exit while starting. The predecessor's session is closed exactly between the two calls here."""
    node = unique("node")
    crashed = Metastore(zk_hosts, session_timeout=2.0).start()
    crashed.nodes.register(node, "127.0.0.1:7001")
    restarted = Metastore(zk_hosts, session_timeout=2.0).start()
    real_get = restarted.zk.get
    reads: list[str] = []

    def get_after_the_holder_is_gone(path: str, *args: Any, **kwargs: Any) -> Any:
        if path.endswith(node) and not reads:
            reads.append(path)
            crashed.close()  # the real server deletes the stale ephemeral node now
        return real_get(path, *args, **kwargs)

    restarted.zk.get = get_after_the_holder_is_gone  # type: ignore[method-assign]
    try:
        info = restarted.nodes.register(node, "127.0.0.1:7002", stale_wait_s=20.0)
        assert reads and ms.nodes.get(node) == info
    finally:
        restarted.zk.get = real_get  # type: ignore[method-assign]
        restarted.close()


def test_watch_group_reports_changes(ms: Metastore) -> None:
    name = unique("Watch")
    ms.modules.create(make_spec(name), initial_groups())
    events: list[tuple[GroupState | None, int]] = []
    callback_threads: set[str] = set()

    def on_change(state: GroupState | None, version: int) -> None:
        callback_threads.add(threading.current_thread().name)
        events.append((state, version))

    ms.groups.watch(name, 0, on_change)
    wait_for(lambda: len(events) == 1, what="initial group event")
    state, version = ms.groups.get(name, 0)
    ms.groups.cas(name, 0, switch_leader(state, "n3"), version)
    wait_for(lambda: len(events) == 2, what="group change event")
    assert events[1] == (switch_leader(state, "n3"), 1)
    ms.modules.delete(name)
    wait_for(lambda: events[-1] == (None, -1), what="group deletion event")
    assert all(t.startswith("metastore-callbacks") for t in callback_threads)  # never kazoo's thread


def test_resign_hand_off_is_one_transaction(ms: Metastore) -> None:
    name = unique("Resign")
    ms.modules.create(make_spec(name), initial_groups())
    state, version = ms.groups.get(name, 0)
    ms.resigns.request(name, 0, "n2", epoch=state.epoch)
    request = ms.resigns.get(name, 0)
    assert request is not None and request["to"] == "n2" and request["epoch"] == state.epoch
    with pytest.raises(VersionConflict):
        ms.resigns.complete(name, 0, switch_leader(state, "n2"), version + 5)
    assert ms.resigns.get(name, 0) is not None  # the failed transaction deleted nothing
    assert ms.resigns.complete(name, 0, switch_leader(state, "n2"), version) == version + 1
    assert ms.resigns.get(name, 0) is None and ms.groups.get(name, 0)[0].leader == "n2"
    ms.modules.delete(name)


def test_connection_hooks_pause_step_down_and_reregister(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path)
    server.start()
    calls: list[tuple[str, str]] = []

    def hook(name: str) -> Callable[[], None]:
        return lambda: calls.append((name, threading.current_thread().name))

    ms = Metastore(server.hosts, session_timeout=4.0, pause_writes=hook("pause"), step_down=hook("step_down"),
                   resume=hook("resume"))
    try:
        ms.start()
        ms.nodes.register("w1", "127.0.0.1:7001")
        server.stop()
        wait_for(lambda: ("pause" in [c[0] for c in calls]), what="pause_writes on SUSPENDED")
        server.start()
        wait_for(lambda: [c[0] for c in calls][-1:] == ["resume"], timeout=15, what="resume on CONNECTED")
        assert "step_down" not in [c[0] for c in calls]  # a brief outage keeps the session
        assert ms.nodes.live() == ["w1"]

        # Expire the session from outside (same session id, then close it): kazoo reports LOST.
        session_id = ms.session_id
        twin = KazooClient(hosts=server.hosts, client_id=ms.zk.client_id)
        twin.start(timeout=10)
        twin.stop()
        twin.close()
        wait_for(lambda: "step_down" in [c[0] for c in calls], timeout=15, what="step_down on LOST")
        wait_for(lambda: ms.session_id != session_id and ms.nodes.live() == ["w1"], timeout=15,
                 what="node re-registered in the new session")
        assert ms.zk.get("/millrace/nodes/w1")[1].ephemeralOwner == ms.session_id
        assert all(t.startswith("metastore-callbacks") for _, t in calls)
    finally:
        ms.close()
        server.stop()


def test_group_path_layout() -> None:
    assert group_path("WordCount", 3) == "/millrace/modules/WordCount/groups/3"


# ---- a module's spec and groups in one round trip (Modules.get_with_groups), as the leader router reads them


def plain(ms: Metastore, name: str) -> tuple[ModuleSpec, dict[int, GroupState]]:
    spec, _v = ms.modules.get(name)
    return spec, {g: st for g, (st, _v) in ms.groups.all(name).items()}


def test_the_pipelined_read_answers_what_the_plain_reads_answer(ms: Metastore,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique("Routes")
    spec = make_spec(name, threads=3)
    ms.modules.create(spec, initial_groups(3))
    st, version = ms.groups.get(name, 1)
    ms.groups.cas(name, 1, switch_leader(st, st.isr[1]), version)  # a version and a leader other than the initial
    expected = plain(ms, name)
    plain_reads = 0
    sequential = ms.call

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal plain_reads
        plain_reads += 1
        return sequential(*args, **kwargs)

    monkeypatch.setattr(ms, "call", counted)
    for hint, reads in ((None, 5), (3, 0)):  # without a hint: spec, children, 3 groups; with it, none of those
        plain_reads = 0
        got = ms.modules.get_with_groups(name, hint)
        assert got == expected and plain_reads == reads
        assert got[0] == spec and got[1][1].leader == st.isr[1] and got[1][1].version == version + 1


def test_a_module_deployed_again_with_another_group_count_is_read_whole(ms: Metastore) -> None:
    """The hint is the group count seen last; a module destroyed and deployed again under the same name with
    more or fewer groups is read the plain way, whole."""
    name = unique("Redeployed")
    ms.modules.create(make_spec(name), initial_groups())
    for threads, hint in ((3, 2), (1, 3)):
        ms.modules.delete(name)
        ms.modules.create(make_spec(name, threads=threads), initial_groups(threads))
        spec, groups = ms.modules.get_with_groups(name, hint)
        assert spec.threads == threads and sorted(groups) == list(range(threads))


def test_no_module_is_module_not_found_with_or_without_a_hint(ms: Metastore) -> None:
    for hint in (None, 2):
        with pytest.raises(ModuleNotFound):
            ms.modules.get_with_groups(unique("Missing"), hint)


def test_a_refresh_after_a_leader_move_sees_the_new_leader(ms: Metastore, zk_hosts: str) -> None:
    """The router's refresh (what the Spark planner does before every plan) reads the moved leader, through
    another session than the one that moved it."""
    name = unique("Moved")
    ms.modules.create(make_spec(name), initial_groups())
    with Metastore(zk_hosts, session_timeout=2.0) as other:
        router = LeaderRouter(other)
        assert router.routes(name).groups[0].leader == "n1"
        st, version = ms.groups.get(name, 0)
        ms.groups.cas(name, 0, switch_leader(st, "n2"), version)
        assert router.routes(name).groups[0].leader == "n1"  # cached until asked to refresh
        fresh = router.routes(name, refresh=True).groups[0]
        assert (fresh.leader, fresh.epoch) == ("n2", st.epoch + 1)


def test_a_closed_session_fails_as_the_plain_reads_fail(ms: Metastore, zk_hosts: str) -> None:
    name = unique("Closed")
    ms.modules.create(make_spec(name), initial_groups())
    other = Metastore(zk_hosts, session_timeout=2.0, op_timeout=1.0).start()
    other.close()
    with pytest.raises(Exception) as pipelined:
        other.modules.get_with_groups(name, 2)
    with pytest.raises(Exception) as sequential:
        plain(other, name)
    assert type(pipelined.value) is type(sequential.value)
