"""``replication.fsync=interval`` on a real cluster: a machine losing power is not elected, rebuilds and rejoins.

Real ZooKeeper, conductor and worker processes, RF=3, min-ISR 2, a writer appending unique values with
``ack="applied"``, entries acknowledged from the page cache and fsynced every 10 s (so a power loss really
does take acknowledged entries). A power loss is a SIGKILL followed by what the machine's restart does to the
files (tests/faults/power_loss.py): every group's replog loses its unsynced tail, the storage marks read as last
synced, under another boot id. The victim must take a new incarnation (the page-cache rule: its own marks agree
with its shortened log, so nothing else can tell), leave the ISR instead of being elected, catch up and rejoin;
no acknowledged write may be lost and every replica ends byte-identical. A plain SIGKILL (same boot: the kernel
kept the page cache) keeps the incarnation. docs/replication.md, "Durability modes", says what each mode survives.
"""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from conductor.cli import app
from conductor.client import Cluster
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from replog.marks_file import MarksFile
from tests.faults.conftest import SESSION_TIMEOUT
from tests.faults.power_loss import PageCacheLoss, lose_machine_page_cache
from tests.integration.cluster_helpers import (
    Appender,
    assert_replicas_identical,
    converged,
    deploy,
    group_status,
    groups_of,
    wait_for,
)

#: acknowledged from the page cache; a lag limit above the time a replica is down keeps it in the ISR until it
#: restarts (it must leave by itself: the case the page-cache rule is for)
INTERVAL = {"replication.min.isr": "2", "replication.fsync": "interval", "replication.flush.ms": "10000",
            "replication.max.time.lag.millis": "20000"}


def _live(dc: DevCluster) -> list[str]:
    with Metastore(dc.hosts) as ms:
        return ms.nodes.live()


def _incarnations(dc: DevCluster, node: str) -> dict[int, int | None]:
    return {g: st.incarnation_of(node) for g, st in groups_of(dc, "Clicks").items()}


def _power_loss(dc: DevCluster, node: str) -> list[PageCacheLoss]:
    """SIGKILL ``node``, then its machine's page cache is gone: a third of every group's last segment at most
    (entries written within the 10 s flush interval), marks as last synced, another boot."""
    dc.nodes[node].kill()
    rng = random.Random(node)
    losses = lose_machine_page_cache(dc.node_dir(node) / "Clicks", lambda size: rng.randint(size // 10, size // 3))
    assert losses and all(x.lost_acknowledged for x in losses), losses
    return losses


def _took_new_incarnations(dc: DevCluster, node: str, before: dict[int, int | None],
                           losses: list[PageCacheLoss]) -> None:
    """The group znode records a new storage incarnation of ``node`` in every group whose page cache it lost."""
    lost = {int(x.group_dir.name) for x in losses}
    wait_for(lambda: all(inc != before[g] for g, inc in _incarnations(dc, node).items() if g in lost), 30,
             f"{node} to record a new storage incarnation in groups {sorted(lost)}")


def _restart_after_session(dc: DevCluster, node: str) -> None:
    wait_for(lambda: node not in _live(dc), SESSION_TIMEOUT + 10, f"{node}'s session to end", interval_s=0.2)
    dc.start_node(node)
    dc.wait_nodes([node])


def _rejoined_and_identical(dc: DevCluster, nodes: set[str], appender: Appender) -> None:
    wait_for(lambda: all(nodes <= set(st.isr) for st in groups_of(dc, "Clicks").values()), 90,
             f"{sorted(nodes)} to rejoin every ISR")
    wait_for(lambda: converged(dc, "Clicks"), 60, "every replica to catch up")
    assert_replicas_identical(dc, "Clicks", appender.acked)  # 0 acknowledged writes lost, replicas identical


@pytest.mark.slow
def test_follower_losing_power_is_not_elected_when_the_leader_dies(dc: DevCluster) -> None:
    groups = deploy(dc, options=INTERVAL)
    leader = groups[0].leader
    assert leader is not None
    victim, intact = [r for r in groups[0].replicas if r != leader]
    with Cluster.connect(dc.hosts, timeout_s=30) as cluster:
        appender = Appender(cluster.depot("Clicks", "*raw"), window=32).start()
        try:
            wait_for(lambda: appender.count() > 600, 60, "appends to flow")
            before = _incarnations(dc, victim)
            acked_at_loss = appender.count()
            losses = _power_loss(dc, victim)
            assert victim in groups_of(dc, "Clicks")[0].isr
            _restart_after_session(dc, victim)
            dc.nodes[leader].kill()  # the one left holding what the victim lost: the intact follower
            new_leader = wait_for(lambda: (st := groups_of(dc, "Clicks")[0]).leader not in (None, leader)
                                  and st.leader, SESSION_TIMEOUT + 2, "a new leader of group 0")
            # Elected at most on a new storage it rebuilt from the leader before the leader died (re-admitted to
            # the ISR): never on the storage it lost. (The leader dies as soon as it is back, so it rarely has.)
            assert new_leader == intact or groups_of(dc, "Clicks")[0].incarnation_of(victim) != before[0], \
                f"{new_leader} elected on the storage that lost its page cache; only {intact} held every write"
            _took_new_incarnations(dc, victim, before, losses)
            wait_for(lambda: group_status(dc, new_leader, "Clicks", 0).role == "leader", SESSION_TIMEOUT + 2,
                     "the new leader to serve")
            wait_for(lambda: appender.count() > acked_at_loss + 900, 60, "appends to continue after failover")
            _restart_after_session(dc, leader)
            wait_for(lambda: appender.count() > acked_at_loss + 1100, 60, "appends while the old leader restarts")
        finally:
            appender.stop()
    assert appender.failed == 0, appender.errors[:3]
    log = (dc.root / "logs" / f"node-{victim}.log").read_text()
    assert "replication.fsync=interval" in log and "leaving the ISR" in log, "the page-cache rule did not act"
    _rejoined_and_identical(dc, {victim, leader}, appender)


def test_leader_losing_power_fails_over_and_rebuilds(dc: DevCluster) -> None:
    groups = deploy(dc, options=INTERVAL)
    leader = groups[0].leader
    assert leader is not None
    with Cluster.connect(dc.hosts, timeout_s=30) as cluster:
        appender = Appender(cluster.depot("Clicks", "*raw"), window=32).start()
        try:
            wait_for(lambda: appender.count() > 600, 60, "appends to flow")
            before = _incarnations(dc, leader)
            losses = _power_loss(dc, leader)
            acked_at_loss = appender.count()
            new_leader = wait_for(lambda: (st := groups_of(dc, "Clicks")[0]).leader not in (None, leader)
                                  and st.leader, SESSION_TIMEOUT + 4, "a new leader of group 0")
            _restart_after_session(dc, leader)
            _took_new_incarnations(dc, leader, before, losses)
            assert groups_of(dc, "Clicks")[0].leader == new_leader
            wait_for(lambda: appender.count() > acked_at_loss + 900, 60, "appends after the failover")
        finally:
            appender.stop()
    assert appender.failed == 0, appender.errors[:3]
    assert "replication.fsync=interval" in (dc.root / "logs" / f"node-{leader}.log").read_text()
    _rejoined_and_identical(dc, {leader}, appender)


def _cli(dc: DevCluster, *args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--zk", dc.hosts], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def _volatile(dc: DevCluster, node: str) -> bool:
    marks = MarksFile(dc.node_dir(node) / "Clicks" / "0" / "marks").load()
    return marks is not None and marks.volatile


def test_interval_set_live_then_a_killed_worker_keeps_its_incarnation(dc: DevCluster) -> None:
    """`conductor set-option M replication.fsync interval` reaches every replica while it runs (its marks say
    it acknowledges from the page cache), `conductor status` shows the word, and a SIGKILL under the same boot
    loses nothing: the replica keeps its incarnation and stays electable."""
    deploy(dc, options={"replication.min.isr": "2"})
    shown = json.loads(_cli(dc, "status", "Clicks", "--json"))["effective_options"]
    assert shown["replication.fsync"] == "always"
    out = _cli(dc, "set-option", "Clicks", "replication.fsync", "interval")
    assert "replication.fsync: always (default) -> interval" in out, out
    assert json.loads(_cli(dc, "status", "Clicks", "--json"))["effective_options"]["replication.fsync"] == "interval"
    assert "replication.fsync=interval" in _cli(dc, "status", "Clicks")
    replicas = groups_of(dc, "Clicks")[0].replicas
    with Cluster.connect(dc.hosts, timeout_s=30) as cluster:
        appender = Appender(cluster.depot("Clicks", "*raw"), window=32).start()
        try:
            wait_for(lambda: appender.count() > 300 and all(_volatile(dc, r) for r in replicas), 60,
                     "every replica of group 0 to acknowledge from the page cache")
            victim = groups_of(dc, "Clicks")[0].leader
            assert victim is not None
            before = _incarnations(dc, victim)
            dc.nodes[victim].kill()
            acked_at_kill = appender.count()
            _restart_after_session(dc, victim)
            wait_for(lambda: appender.count() > acked_at_kill + 600, 60, "appends after the restart")
            assert _incarnations(dc, victim) == before, "a killed process under the same boot lost nothing"
        finally:
            appender.stop()
    assert appender.failed == 0, appender.errors[:3]
    log = (dc.root / "logs" / f"node-{victim}.log").read_text()
    assert "lost entries it acknowledged" not in log, log[-2000:]
    _rejoined_and_identical(dc, set(replicas), appender)
