"""The replicated cluster under faults: real ZooKeeper, conductor and worker processes, RF=3 on loopback."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
import msgpack
import pytest

from conductor.client import Cluster
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from replog.errors import StalledGroup
from tests.faults.conftest import SESSION_TIMEOUT
from tests.integration.cluster_helpers import (
    Appender,
    assert_replicas_identical,
    converged,
    deploy,
    group_status,
    groups_of,
    replica_state,
    wait_for,
)


def test_rf3_append_10000_applied_readable_on_every_replica(dc: DevCluster) -> None:
    deploy(dc)
    with Cluster.connect(dc.hosts) as cluster:
        clicks = cluster.depot("Clicks", "*clicks")
        records = [{"user": f"user{i % 97}", "id": f"a{i}"} for i in range(10_000)]
        offsets = clicks.append_many(records, ack="applied")
        assert len(offsets) == 10_000 and all(o >= 0 for o in offsets)
        # offsets are dense per partition: each task's offsets are exactly 0..n-1
        from topology import task_for_key

        per_task: dict[int, list[int]] = {}
        for rec, off in zip(records, offsets, strict=True):
            per_task.setdefault(task_for_key(rec["user"], 4), []).append(off)
        for offs in per_task.values():
            assert sorted(offs) == list(range(len(offs)))
        # reads through the leader see every record, in order
        total = 0
        for task in range(4):
            start, end = clicks.partition_info(task)
            got = clicks.read(task, 0, end, max_bytes=1 << 30)
            assert len(got) == end - start
            total += len(got)
        assert total == 10_000
    wait_for(lambda: converged(dc, "Clicks"), 30, "every replica to apply everything")
    assert_replicas_identical(dc, "Clicks", records)


def test_kill9_leader_during_appends_fails_over_and_restarted_node_rejoins(dc: DevCluster) -> None:
    groups = deploy(dc)
    victim = groups[0].leader
    assert victim is not None
    with Cluster.connect(dc.hosts, timeout_s=30) as cluster:
        appender = Appender(cluster.depot("Clicks", "*raw"), window=32).start()
        try:
            wait_for(lambda: appender.count() > 300, 30, "appends to flow")
            before_kill = appender.count()
            dc.nodes[victim].kill()
            killed_at = time.monotonic()
            # a new leader from the ISR serves group 0 within session timeout + 2 s
            new_leader = wait_for(lambda: (st := groups_of(dc, "Clicks")[0]).leader not in (None, victim)
                                  and st.leader, SESSION_TIMEOUT + 2, "a new leader of group 0")
            wait_for(lambda: group_status(dc, new_leader, "Clicks", 0).role == "leader",
                     SESSION_TIMEOUT + 2 - (time.monotonic() - killed_at), "the new leader to serve")
            wait_for(lambda: appender.count() > before_kill + 300, 30, "appends to continue after failover")
            dc.start_node(victim)
            dc.wait_nodes([victim])
            wait_for(lambda: appender.count() > before_kill + 600, 30, "appends while the node restarts")
        finally:
            appender.stop()
    st = wait_for(lambda: (s := groups_of(dc, "Clicks")[0]) and victim in s.isr and s, 60,
                  f"{victim} to rejoin the ISR of group 0")
    assert st.leader != victim or st.epoch >= 3
    wait_for(lambda: converged(dc, "Clicks"), 60, "every replica to catch up")
    assert appender.count() > 600
    assert_replicas_identical(dc, "Clicks", appender.acked)


def test_sigstopped_leader_is_fenced_and_steps_down(dc: DevCluster) -> None:
    groups = deploy(dc)
    zombie = groups[1].leader
    assert zombie is not None
    zombie_addr = (dc.node_dir(zombie) / "node.address").read_text()
    with Cluster.connect(dc.hosts, timeout_s=30) as cluster:
        appender = Appender(cluster.depot("Clicks", "*raw"), window=16).start()
        try:
            wait_for(lambda: appender.count() > 200, 30, "appends to flow")
            dc.nodes[zombie].signal(signal.SIGSTOP)
            new_leader = wait_for(lambda: (s := groups_of(dc, "Clicks")[1]).leader not in (None, zombie)
                                  and s.leader, SESSION_TIMEOUT * 3, "a new leader of group 1")
            n = appender.count()
            wait_for(lambda: appender.count() > n + 200, 30, "appends through the new leader")
            dc.nodes[zombie].signal(signal.SIGCONT)
            # Right after SIGCONT the zombie may still think it leads; an applied-ack append must not succeed.
            with grpc.insecure_channel(zombie_addr) as ch:
                req = pb.AppendRequest(module="Clicks", group=1, ack=pb.ACK_APPLIED, appends=[
                    pb.DepotRecords(depot="*raw", task=1, records=[msgpack.packb({"user": "z", "id": "zombie"})])])
                with pytest.raises(grpc.RpcError):
                    pbg.ClientStub(ch).Append(req, timeout=15)
            wait_for(lambda: group_status(dc, zombie, "Clicks", 1).role != "leader", 15, "the zombie to step down")
            assert group_status(dc, new_leader, "Clicks", 1).role == "leader"
            n = appender.count()
            wait_for(lambda: appender.count() > n + 100, 30, "appends after the zombie returned")
        finally:
            appender.stop()
    wait_for(lambda: converged(dc, "Clicks"), 60, "every replica to catch up")
    assert_replicas_identical(dc, "Clicks", appender.acked)
    ids = set()
    for g in (0, 1):
        for r in groups[g].replicas:
            for rows in replica_state(dc.root, r, "Clicks", g)["depots"].values():
                ids.update(rec["id"] for _o, rec in rows)
    assert "zombie" not in ids, "the fenced leader's append must never be applied"


def test_min_isr_stalls_with_two_followers_down_then_recovers(dc: DevCluster) -> None:
    groups = deploy(dc, options={"replication.min.isr": "2", "replication.max.time.lag.millis": "1500",
                                 "replication.depot.append.timeout.millis": "3000"})
    leader = groups[0].leader
    followers = [r for r in groups[0].replicas if r != leader]
    with Cluster.connect(dc.hosts, timeout_s=10) as cluster:
        raw = cluster.depot("Clicks", "*raw")  # RF 3 on 3 nodes: every group has a replica on every node
        assert raw.append({"user": "a", "id": "before"}, ack="applied") >= 0
        for f in followers:
            dc.nodes[f].stop()
        err = None
        others: list[Exception] = []
        deadline = time.monotonic() + 30
        while err is None and time.monotonic() < deadline:
            try:
                raw.append({"user": "a", "id": "during"}, ack="applied")
            except StalledGroup as e:
                err = e
            except Exception as e:
                others.append(e)
                time.sleep(0.2)
        assert isinstance(err, StalledGroup), f"expected StalledGroup while the ISR is below min-ISR, got {others!r}"
        assert err.min_isr == 2 and leader in err.isr and "min-ISR" in str(err)
        for f in followers:
            dc.start_node(f)
        dc.wait_nodes(followers)
        ok = wait_for(lambda: _try_append(raw, {"user": "a", "id": "after"}), 60, "appends to succeed again")
        assert ok


def _try_append(depot, rec) -> bool:
    try:
        depot.append(rec, ack="applied")
        return True
    except Exception:
        return False


def test_standby_conductor_takes_over_and_failover_still_works(tmp_path: Path) -> None:
    with DevCluster(tmp_path / "ha", nodes=3, conductors=2, session_timeout=SESSION_TIMEOUT) as dc:
        groups = deploy(dc)
        # the first conductor started is active (it created the first election znode)
        active = "c1"
        dc.conductors[active].kill()
        victim = groups[0].leader
        time.sleep(SESSION_TIMEOUT + 1)  # c1's session expires; c2 becomes active
        dc.nodes[victim].kill()
        wait_for(lambda: groups_of(dc, "Clicks")[0].leader not in (None, victim), SESSION_TIMEOUT * 3,
                 "c2 to elect a new leader for group 0")
        log = dc.conductors["c2"].log_path.read_text()
        assert "is now active" in log
        with Cluster.connect(dc.hosts, timeout_s=20) as cluster:
            assert cluster.depot("Clicks", "*raw").append({"user": "x", "id": "after-ha"}, ack="applied") >= 0


def test_set_option_applies_live_lowering_min_isr_unstalls(dc: DevCluster) -> None:
    """Two followers down stall min-ISR 2; the operator lowers min-ISR to 1 and the running leader applies."""
    groups = deploy(dc, options={"replication.min.isr": "2", "replication.max.time.lag.millis": "1500",
                                 "replication.depot.append.timeout.millis": "3000"})
    leader = groups[0].leader
    followers = [r for r in groups[0].replicas if r != leader]
    with Cluster.connect(dc.hosts, timeout_s=10) as cluster:
        raw = cluster.depot("Clicks", "*raw")
        for f in followers:
            dc.nodes[f].stop()
        wait_for(lambda: _stalled(raw), 30, "appends to fail with StalledGroup")
        with Metastore(dc.hosts) as ms:
            ms.modules.set_option("Clicks", "replication.min.isr", "1")
        assert wait_for(lambda: _try_append(raw, {"user": "a", "id": "live"}), 30,
                        "the running leader to apply under the new min-ISR")
        # *raw partitions at random: the group that applied it shrank its ISR to its leader alone (a group
        # that got no append since the followers stopped has nobody lagging, so it keeps its ISR).
        assert any(st.isr == (st.leader,) for st in groups_of(dc, "Clicks").values())


def _stalled(depot) -> bool:
    try:
        depot.append({"user": "a", "id": "probe"}, ack="applied")
    except StalledGroup:
        return True
    except Exception:
        pass
    return False
