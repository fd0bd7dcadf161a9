"""The conductor against a real ZooKeeper: placement, failover from the ISR, HA takeover, outages.

Each test runs in its own chroot of the session ZooKeeper (or its own server
when it must stop it), so conductors and nodes of different tests never meet.
Worker nodes are real ZooKeeper sessions registering ephemeral znodes; a node
is "lost" by closing its session, exactly what ZooKeeper does when a worker dies.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from conductor.controller import Conductor
from conductor.metastore import GroupState, Metastore, ModuleExists
from conductor.metastore.module_spec import ModuleSpec, NotEnoughNodes
from conductor.zkserver import ZooKeeperServer

REPO = Path(__file__).resolve().parents[2]


def wait_for(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def hosts(zk_hosts: str) -> str:
    """A fresh chroot: the whole /millrace tree of this test lives under it."""
    chroot = f"/t-{uuid.uuid4().hex[:10]}"
    zk = KazooClient(hosts=zk_hosts)
    zk.start(timeout=10)
    try:
        zk.ensure_path(chroot)
    finally:
        zk.stop()
        zk.close()
    return zk_hosts + chroot


class Nodes:
    """Worker nodes as live ZooKeeper sessions; ``kill`` closes one (its ephemeral znode vanishes)."""

    def __init__(self, hosts: str, session_timeout: float = 2.0) -> None:
        self.hosts = hosts
        self.session_timeout = session_timeout
        self.sessions: dict[str, Metastore] = {}

    def add(self, *node_ids: str) -> None:
        for node_id in node_ids:
            ms = Metastore(self.hosts, session_timeout=self.session_timeout).start()
            ms.nodes.register(node_id, f"127.0.0.1:{7000 + len(self.sessions)}")
            self.sessions[node_id] = ms

    def kill(self, node_id: str) -> None:
        self.sessions.pop(node_id).close()

    def close(self) -> None:
        for ms in self.sessions.values():
            ms.close()


@pytest.fixture
def nodes(hosts: str) -> Iterator[Nodes]:
    n = Nodes(hosts)
    try:
        yield n
    finally:
        n.close()


@pytest.fixture
def conductor(hosts: str) -> Iterator[Conductor]:
    c = Conductor(hosts, "c1", session_timeout=2.0, reconcile_interval=0.5).start()
    try:
        assert c.wait_active(10), "a lone conductor must become active"
        yield c
    finally:
        c.stop()


def spec(name: str, threads: int = 3, rf: int = 3, workers: int = 3) -> ModuleSpec:
    return ModuleSpec(name=name, module_ref="examples.word_count:WordCount", tasks=threads * 2, threads=threads,
                      workers=workers, replication_factor=rf)


def groups_of(ms: Metastore, module: str) -> dict[int, GroupState]:
    return {g: s for g, (s, _) in ms.groups.all(module).items()}


def test_deploy_places_groups_visibly_in_zookeeper(conductor: Conductor, nodes: Nodes) -> None:
    nodes.add("n1", "n2", "n3")
    with pytest.raises(NotEnoughNodes, match="replication factor 4 needs 4 distinct live node"):
        conductor.deploy(ModuleSpec(name="Big", module_ref="a.b:C", tasks=4, threads=2, workers=4,
                                    replication_factor=4))
    assert conductor.ms.modules.names() == []  # refused before anything was written
    created = conductor.deploy(spec("WordCount", threads=6))
    stored = groups_of(conductor.ms, "WordCount")
    assert stored == created and sorted(stored) == list(range(6))
    leaders: Counter[str] = Counter()
    for state in stored.values():
        assert len(set(state.replicas)) == 3 and set(state.replicas) == {"n1", "n2", "n3"}
        assert state.leader == state.replicas[0] and state.epoch == 1 and state.isr == state.replicas
        assert state.leader is not None
        leaders[state.leader] += 1
    assert leaders == {"n1": 2, "n2": 2, "n3": 2}
    assert conductor.ms.modules.get("WordCount")[0] == spec("WordCount", threads=6)
    with pytest.raises(ModuleExists):
        conductor.deploy(spec("WordCount", threads=6))
    conductor.destroy("WordCount")
    assert conductor.ms.modules.names() == []


def test_node_loss_elects_from_isr_and_bumps_epoch(conductor: Conductor, nodes: Nodes,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millrace.conductor")
    nodes.add("n1", "n2", "n3")
    before = conductor.deploy(spec("WordCount", threads=3))
    led_by_n2 = {g for g, s in before.items() if s.leader == "n2"}
    assert led_by_n2
    nodes.kill("n2")
    wait_for(lambda: all(groups_of(conductor.ms, "WordCount")[g].leader not in (None, "n2") for g in led_by_n2),
             what="new leaders for n2's groups")
    after = groups_of(conductor.ms, "WordCount")
    for g, old in before.items():
        new = after[g]
        if g in led_by_n2:
            expected = next(x for x in old.replicas if x != "n2")  # first live ISR member in replica order
            assert new.leader == expected and new.epoch == old.epoch + 1
            assert "n2" not in new.isr and new.osr == ("n2",)
            assert (f"node n2 lost: group WordCount/{g} leader n2 -> {expected}, epoch 1 -> 2, "
                    f"ISR [{','.join(new.isr)}]") in caplog.text
        else:
            assert new == old  # a dead follower is the leader's business, not the conductor's
    status = {row["group"]: row for row in conductor.status("WordCount")}
    assert all(row["leaderless_reason"] is None for row in status.values())


def test_osr_member_never_elected_and_isr_member_leads_on_return(conductor: Conductor, nodes: Nodes,
                                                                 hosts: str) -> None:
    nodes.add("n1", "n2", "n3")
    conductor.deploy(spec("Orders", threads=1))
    ms = conductor.ms
    state, version = ms.groups.get("Orders", 0)
    assert state.leader == "n1"
    # n2 and n3 fell behind: the leader moved them to the OSR.
    shrunk = GroupState(leader="n1", epoch=state.epoch, isr=("n1",), osr=("n2", "n3"), placement=state.replicas)
    ms.groups.cas("Orders", 0, shrunk, version)
    nodes.kill("n1")
    wait_for(lambda: ms.groups.get("Orders", 0)[0].epoch == state.epoch + 1, what="the conductor to react to n1's loss")
    down = ms.groups.get("Orders", 0)[0]
    assert down.leader is None and down.isr == ("n1",) and down.osr == ("n2", "n3")
    reason = conductor.status("Orders")[0]["leaderless_reason"]
    assert "never elected" in reason and "['n2', 'n3']" in reason
    time.sleep(1.5)  # several reconciles later it is still leaderless: the live OSR is never elected
    assert ms.groups.get("Orders", 0)[0] == down
    nodes.add("n1")  # n1's worker restarts with its data
    wait_for(lambda: ms.groups.get("Orders", 0)[0].leader == "n1", what="n1 to lead again")
    assert ms.groups.get("Orders", 0)[0].epoch == state.epoch + 2


def test_standby_takes_over_after_active_crashes(hosts: str, nodes: Nodes, tmp_path: Path) -> None:
    nodes.add("n1", "n2", "n3")
    log_path = tmp_path / "c1.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conductor.controller", "--zk", hosts, "--name", "c1", "--session-timeout",
             "2", "--reconcile-interval", "0.5"],
            cwd=REPO, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    standby: Conductor | None = None
    try:
        wait_for(lambda: "conductor c1 is now active" in log_path.read_text(), timeout=20,
                 what="c1 to become active")
        standby = Conductor(hosts, "c2", session_timeout=2.0, reconcile_interval=0.5).start()
        assert standby.ms.conductors.contenders()[0] == "c1"
        assert not standby.wait_active(1.0)
        before = standby.deploy(spec("WordCount", threads=3))

        # c1 handles a loss while active.
        nodes.kill("n3")
        g3 = next(g for g, s in before.items() if s.leader == "n3")
        wait_for(lambda: standby.ms.groups.get("WordCount", g3)[0].leader not in (None, "n3"),
                 what="c1 to fail over n3's group")
        # (c1 logs the transition after its write lands: on a loaded box the line can trail the znode)
        wait_for(lambda: f"node n3 lost: group WordCount/{g3} leader n3 ->" in log_path.read_text(), timeout=10,
                 what="c1 to log the failover")

        os.kill(proc.pid, signal.SIGKILL)  # a crash: no clean session close, ZooKeeper must expire it
        proc.wait(timeout=10)
        assert standby.wait_active(15), "c2 must take over once c1's session expires"
        assert standby.ms.conductors.contenders()[0] == "c2"

        nodes.kill("n1")
        g1 = next(g for g, s in before.items() if s.leader == "n1")
        wait_for(lambda: standby.ms.groups.get("WordCount", g1)[0].epoch == before[g1].epoch + 1,
                 what="c2 to handle n1's loss")
        s1 = standby.ms.groups.get("WordCount", g1)[0]
        # n2 is the only live ISR member; n3 (a dead follower here) is left for the leader to shrink out.
        assert s1.leader == "n2" and s1.isr == ("n2", "n3") and s1.osr == ("n1",)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if standby is not None:
            standby.stop()


def test_clean_stop_hands_over_immediately(hosts: str, nodes: Nodes) -> None:
    nodes.add("n1", "n2")
    c1 = Conductor(hosts, "c1", session_timeout=10.0, reconcile_interval=0.5).start()
    c2 = Conductor(hosts, "c2", session_timeout=10.0, reconcile_interval=0.5)
    try:
        assert c1.wait_active(10)
        c2.start()
        c2.deploy(spec("Small", threads=2, rf=2, workers=2))
        c1.stop()
        t0 = time.monotonic()
        assert c2.wait_active(5)
        assert time.monotonic() - t0 < 5  # no session timeout to wait for: the election znode is deleted
        nodes.kill("n2")
        wait_for(lambda: all(s.leader == "n1" for s in groups_of(c2.ms, "Small").values()),
                 what="c2 to fail over n2's groups")
    finally:
        c1.stop()
        c2.stop()


def test_conductor_stays_active_through_brief_zookeeper_outage(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path)
    server.start()
    nodes = Nodes(server.hosts, session_timeout=8.0)
    c1 = Conductor(server.hosts, "c1", session_timeout=8.0, reconcile_interval=0.5)
    try:
        c1.start()
        assert c1.wait_active(10)
        nodes.add("n1", "n2", "n3")
        before = c1.deploy(spec("WordCount", threads=3))
        server.stop()
        time.sleep(1.0)
        server.start()
        wait_for(lambda: c1.ms.connected, timeout=15, what="the conductor to reconnect")
        # Closing a node's session only deletes its znode at once when the close reaches ZooKeeper;
        # a node closed while still disconnected would linger until its session expires (a crash).
        wait_for(lambda: all(m.connected for m in nodes.sessions.values()), timeout=15,
                 what="the nodes to reconnect")
        assert c1.is_active  # SUSPENDED is not LOST: the session and election znode survived
        nodes.kill("n2")
        g2 = next(g for g, s in before.items() if s.leader == "n2")
        wait_for(lambda: c1.ms.groups.get("WordCount", g2)[0].leader not in (None, "n2"), timeout=15,
                 what="failover after the outage")
    finally:
        c1.stop()
        nodes.close()
        server.stop()


def test_session_loss_demotes_and_reruns_election(hosts: str, nodes: Nodes) -> None:
    nodes.add("n1", "n2")
    c1 = Conductor(hosts, "c1", session_timeout=2.0, reconcile_interval=0.5).start()
    c2 = Conductor(hosts, "c2", session_timeout=2.0, reconcile_interval=0.5)
    try:
        assert c1.wait_active(10)
        c2.start()
        c2.deploy(spec("Small", threads=2, rf=2, workers=2))
        # Expire c1's session from outside (same session id, then close it): what a long partition does.
        twin = KazooClient(hosts=hosts, client_id=c1.ms.zk.client_id)
        twin.start(timeout=10)
        twin.stop()
        twin.close()
        assert c2.wait_active(10), "c2 must take over when c1's session is lost"
        wait_for(lambda: not c1.is_active, what="c1 to stand down")
        wait_for(lambda: c2.ms.conductors.contenders() == ["c2", "c1"], what="c1 to campaign again")
        nodes.kill("n2")
        wait_for(lambda: all(s.leader == "n1" for s in groups_of(c2.ms, "Small").values()),
                 what="failover by the new active conductor")
        assert not c1.is_active
    finally:
        c1.stop()
        c2.stop()


def test_balance_moves_minimal_leaders_to_a_returned_node(conductor: Conductor, nodes: Nodes) -> None:
    nodes.add("n1", "n2", "n3")
    conductor.deploy(spec("WordCount", threads=3))
    nodes.kill("n3")
    ms = conductor.ms
    wait_for(lambda: all(s.leader != "n3" for s in groups_of(ms, "WordCount").values()), what="failover")
    nodes.add("n3")
    # n3 caught up: its leaders add it back to their ISR (a CAS, as the replication layer does).
    for g, (state, version) in ms.groups.all("WordCount").items():
        if "n3" in state.osr:
            ms.groups.cas("WordCount", g, GroupState(leader=state.leader, epoch=state.epoch,
                                                    isr=(*state.isr, "n3"), osr=(), placement=state.replicas),
                         version)
    assert sorted(Counter(s.leader for s in groups_of(ms, "WordCount").values()).values()) == [1, 2]
    requested = conductor.balance()
    assert len(requested) == 1 and next(iter(requested.values())) == "n3"
    (module, g), _ = next(iter(requested.items()))
    request = ms.resigns.get(module, g)
    assert request is not None and request["to"] == "n3"
    moved = conductor.balance(direct=True)
    assert moved == requested
    assert ms.resigns.get(module, g) is None  # the direct switch also served the pending request
    leaders = Counter(s.leader for s in groups_of(ms, "WordCount").values())
    assert leaders == {"n1": 1, "n2": 1, "n3": 1}
    assert conductor.balance() == {}


def test_leadership_bound_to_session_and_restart_seen_by_next_conductor(hosts: str, nodes: Nodes,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millrace.conductor")
    nodes.add("n1", "n2", "n3")
    c1 = Conductor(hosts, "c1", session_timeout=2.0, reconcile_interval=0.5).start()
    try:
        assert c1.wait_active(10)
        before = c1.deploy(spec("WordCount", threads=3))
        for state in before.values():
            assert state.leader is not None
            assert state.leader_session == nodes.sessions[state.leader].session_id != 0
    finally:
        c1.stop()
    # While no conductor runs, n1 restarts: same node id, new session.
    nodes.kill("n1")
    nodes.add("n1")
    c2 = Conductor(hosts, "c2", session_timeout=2.0, reconcile_interval=0.5).start()
    try:
        assert c2.wait_active(10)
        g1 = next(g for g, s in before.items() if s.leader == "n1")
        wait_for(lambda: c2.ms.groups.get("WordCount", g1)[0].epoch == before[g1].epoch + 1,
                 what="c2 to re-elect n1's group")
        after = c2.ms.groups.get("WordCount", g1)[0]
        assert after.leader != "n1" and after.leader is not None and after.osr == ("n1",)
        assert after.leader_session == nodes.sessions[after.leader].session_id
        assert f"node n1 restarted (new session): group WordCount/{g1} leader n1 -> {after.leader}" in caplog.text
        for g, s in before.items():  # the other groups were fine and stay untouched
            if g != g1:
                assert c2.ms.groups.get("WordCount", g)[0] == s
    finally:
        c2.stop()


def _rejoin_isr(ms: Metastore, module: str, node: str) -> None:
    """What a leader does once ``node`` caught up: add it back to the ISR with a CAS."""
    for g, (state, version) in ms.groups.all(module).items():
        if node in state.osr:
            ms.groups.cas(module, g, GroupState(leader=state.leader, epoch=state.epoch, isr=(*state.isr, node),
                                               osr=(), placement=state.replicas,
                                               leader_session=state.leader_session), version)


def test_periodic_balancing_waits_for_full_isr_then_requests_hand_offs(hosts: str, nodes: Nodes) -> None:
    from conductor.status import LEADERSHIP_BALANCING, RUNNING, module_status

    nodes.add("n1", "n2", "n3")
    c = Conductor(hosts, "c1", session_timeout=2.0, reconcile_interval=0.2, balance_interval=0.5).start()
    try:
        assert c.wait_active(10)
        c.deploy(spec("WordCount", threads=3))
        ms = c.ms
        nodes.kill("n3")
        wait_for(lambda: all(s.leader != "n3" for s in groups_of(ms, "WordCount").values()), what="failover")
        nodes.add("n3")
        time.sleep(1.5)  # several rounds: n3 is live but out of sync, so nothing may be requested
        assert ms.resigns.all("WordCount") == {}
        assert module_status(ms, "WordCount")["state"] == RUNNING
        _rejoin_isr(ms, "WordCount", "n3")
        wait_for(lambda: ms.resigns.all("WordCount") != {}, what="a resign request from the periodic round")
        (g, request), = ms.resigns.all("WordCount").items()
        state, version = ms.groups.get("WordCount", g)
        assert request["to"] == "n3" and request["epoch"] == state.epoch
        assert request["to_session"] == nodes.sessions["n3"].session_id
        st = module_status(ms, "WordCount", rpc_timeout_s=0.2)
        assert st["state"] == LEADERSHIP_BALANCING and st["groups"][g]["handing_off_to"] == "n3"
        # The leader hands off (what its replica does once n3 holds everything): CAS + request delete.
        from replog.election import switch_leader

        ms.resigns.complete("WordCount", g, switch_leader(state, "n3", request["to_session"]), version)
        assert module_status(ms, "WordCount", rpc_timeout_s=0.2)["state"] == RUNNING
        assert sorted(Counter(s.leader for s in groups_of(ms, "WordCount").values()).values()) == [1, 1, 1]
        time.sleep(1.0)
        assert ms.resigns.all("WordCount") == {}, "a balanced module gets no more requests"
    finally:
        c.stop()


def test_stale_resign_requests_are_withdrawn_and_drains_validated(conductor: Conductor, nodes: Nodes) -> None:
    from conductor.controller import UnknownNode
    from conductor.status import RUNNING, module_status

    nodes.add("n1", "n2", "n3")
    conductor.deploy(spec("WordCount", threads=3))
    ms = conductor.ms
    state, _ = ms.groups.get("WordCount", 0)
    ms.resigns.request("WordCount", 0, "n2", state.epoch - 1, 1)  # leadership moved on since
    assert module_status(ms, "WordCount", rpc_timeout_s=0.2)["state"] == RUNNING  # a stale one is not balancing
    assert conductor.request_switches(["WordCount"]) == []
    assert ms.resigns.all("WordCount") == {}
    with pytest.raises(UnknownNode, match=r"unknown node 'n7'.*known nodes: n1, n2, n3"):
        conductor.disallow_leaders("n7")
    conductor.disallow_leaders("n1")
    assert ms.drains.nodes() == {"n1"}
    moves = conductor.balance(["WordCount"])
    leaders = {g: s.leader for g, s in groups_of(ms, "WordCount").items()}
    assert set(moves) == {("WordCount", g) for g, leader in leaders.items() if leader == "n1"}
    assert all(to != "n1" for to in moves.values())
    assert conductor.allow_leaders("n1") and not conductor.allow_leaders("n1")
    assert ms.drains.nodes() == set()


def test_group_left_leaderless_by_a_worker_is_led_again_at_once_by_its_elr_member(hosts: str, nodes: Nodes) -> None:
    """The double fault of the simulator's seeds 5251341 & co: after a failover to n2 (n1, the deposed leader,
    joins the ELR), n2 finds its storage lost and, as the last ISR member, marks itself so in one CAS,
    leaving the group leaderless. The conductor hears it on the group's watch (not on its next periodic
    reconcile, a minute away here) and elects n1, which holds every applied entry."""
    from replog.eligibility import record_storage
    from replog.messages import STORAGE_LOST

    c = Conductor(hosts, "c1", session_timeout=2.0, reconcile_interval=60.0).start()
    try:
        assert c.wait_active(10)
        nodes.add("n1", "n2", "n3")
        c.deploy(spec("Orders", threads=1))
        ms = c.ms
        state, version = ms.groups.get("Orders", 0)
        nodes.add("n4")  # a membership change: the conductor reconciles now and starts watching the group
        wait_for(lambda: ("Orders", 0) in c._group_watches, what="the conductor to watch the new group")
        time.sleep(1.0)  # let that membership change's reconciles finish: the next one is the watch's
        live = ms.nodes.sessions()
        failed_over = dataclasses.replace(
            state, leader="n2", epoch=state.epoch + 1, version=version + 1, isr=("n2",), osr=("n1", "n3"),
            elr=("n1",), leader_session=live["n2"],
            storage=tuple((n, 100 + i, live[n]) for i, n in enumerate(("n1", "n2", "n3"))))
        ms.groups.cas("Orders", 0, failed_over, version)
        lost = record_storage(failed_over, "n2", 999, live["n2"])  # n2 reopened its storage after damage
        assert lost is not None and lost.leader is None and lost.incarnation_of("n2") == STORAGE_LOST
        t0 = time.monotonic()
        ms.groups.cas("Orders", 0, lost, failed_over.version)
        wait_for(lambda: ms.groups.get("Orders", 0)[0].leader == "n1", timeout=8.0, what="n1 (ELR) to lead")
        took = time.monotonic() - t0
        led = ms.groups.get("Orders", 0)[0]
        assert led.isr == ("n1",) and led.elr == () and led.epoch == lost.epoch + 1
        assert took < 5.0, f"the conductor took {took:.1f}s: it waited for a periodic reconcile"
    finally:
        c.stop()
