"""Applied means applied, across a SIGKILL (fault campaign seed 504).

Real ZooKeeper, conductor and worker processes; one task group, RF=3, min-ISR 2,
a writer appending unique values with ``ack="applied"``. Both followers are
killed (the live ISR drops below min-ISR, so the leader can apply nothing new),
then the leader is SIGKILLed and restarted. RocksDB runs without its WAL, so the
restarted leader's store comes back at its last flush (here: empty); the commit
rule cannot re-apply anything with the followers down. Every acknowledged value
must be readable as soon as the leader serves again, before any follower
returns: the replica re-applies up to its storage marks' applied floor.
"""

from __future__ import annotations

from conductor.client import Cluster
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from tests.faults.conftest import SESSION_TIMEOUT
from tests.integration.cluster_helpers import Appender, deploy, group_status, groups_of, wait_for

TASKS = 4


def _live(dc: DevCluster) -> list[str]:
    with Metastore(dc.hosts) as ms:
        return ms.nodes.live()


def _readable_ids(cluster: Cluster) -> set[str]:
    depot = cluster.depot("Clicks", "*raw")
    ids: set[str] = set()
    for task in range(TASKS):
        ids.update(rec["id"] for rec in depot.read(task, 0, None, max_bytes=1 << 30))
    return ids


def test_acknowledged_applied_values_are_readable_when_a_killed_leader_below_min_isr_serves_again(
        dc: DevCluster) -> None:
    groups = deploy(dc, tasks=TASKS, threads=1,
                    options={"replication.min.isr": "2", "replication.max.time.lag.millis": "2000"})
    leader = groups[0].leader
    assert leader is not None
    followers = [r for r in groups[0].replicas if r != leader]
    with Cluster.connect(dc.hosts, timeout_s=30) as cluster:
        appender = Appender(cluster.depot("Clicks", "*raw"), window=32).start()
        try:
            wait_for(lambda: appender.count() > 500, 60, "appends to flow")
        finally:
            appender.stop()
        acked = {rec["id"] for rec in appender.acked}
        assert acked <= _readable_ids(cluster)

        for f in followers:
            dc.nodes[f].kill()
        # (the followers' sessions end first, or the conductor would elect one of them when the leader dies)
        wait_for(lambda: not set(followers) & set(_live(dc)), SESSION_TIMEOUT + 10,
                 "the killed followers' sessions to end", interval_s=0.2)
        dc.nodes[leader].kill()
        dc.start_node(leader)
        dc.wait_nodes([leader])
        wait_for(lambda: group_status(dc, leader, "Clicks", 0).role == "leader", SESSION_TIMEOUT + 20,
                 "the restarted leader to lead again")
        st = groups_of(dc, "Clicks")[0]
        assert st.leader == leader and not any(dc.nodes[f].alive() for f in followers)
        assert len([m for m in st.isr if m == leader or dc.nodes[m].alive()]) < 2, st  # below min-ISR

        # Right away: a handful of read rounds at most (the apply may trail the role change by one drain).
        def all_readable() -> bool:
            return acked <= _readable_ids(cluster)

        try:
            wait_for(all_readable, 5, "every acknowledged value to be readable on the restarted leader")
        except AssertionError:
            missing = acked - _readable_ids(cluster)
            raise AssertionError(f"{len(missing)} of {len(acked)} values acknowledged as applied are not "
                                 f"readable on the restarted leader, e.g. {sorted(missing)[:5]}") from None
