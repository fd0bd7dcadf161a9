"""Idempotent appends under leader crashes and pauses: real processes, RF=3, every value stored exactly once.

Three writers append unique values with ``ack="applied"`` through every client
path (``append_async`` on the asyncio streams, blocking ``append`` on the sync
streams, ``append_many`` as unary batches) while group leaders are killed with
SIGKILL five times, then one is paused with SIGSTOP and resumed. The appends in
flight at each fault are retried by the client with the same producer sequence;
afterwards every replica of every group holds each acknowledged value exactly
once, and no value at all twice.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import msgpack
import pytest

from conductor.client import Cluster
from conductor.devcluster import DevCluster
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from tests.faults.conftest import SESSION_TIMEOUT, fault_cluster
from tests.integration.cluster_helpers import (
    Appender,
    Writer,
    converged,
    deploy,
    group_status,
    groups_of,
    replica_state,
    wait_for,
)

KILLS = 5


@pytest.fixture
def dc(tmp_path: Path) -> Iterator[DevCluster]:
    with fault_cluster(tmp_path / "cluster", log_level="INFO") as cluster:  # retries answered are logged at INFO
        yield cluster


def _flowing(writers: list[Any], more: int, what: str) -> None:
    marks = [w.count() for w in writers]
    wait_for(lambda: all(w.count() >= m + more for w, m in zip(writers, marks, strict=True)), 60, what)


def _request(sequence: int, *ids: str) -> pb.AppendRequest:
    return pb.AppendRequest(module="Clicks", group=0, ack=pb.ACK_APPLIED, producer=0xFEED, sequence=sequence,
                            appends=[pb.DepotRecords(depot="*raw", task=0, records=[
                                msgpack.packb({"user": "u", "id": i}) for i in ids])])


def _send(dc: DevCluster, node: str, request: pb.AppendRequest) -> pb.AppendReply:
    with grpc.insecure_channel((dc.node_dir(node) / "node.address").read_text()) as ch:
        reply: pb.AppendReply = pbg.ClientStub(ch).Append(request, timeout=30)
        return reply


def test_a_resent_request_gets_its_original_offsets_from_the_leader_and_from_the_next_one(dc: DevCluster) -> None:
    groups = deploy(dc, tasks=4, threads=2)
    leader = groups[0].leader
    assert leader is not None
    first = _send(dc, leader, _request(1, "a", "b"))
    second = _send(dc, leader, _request(2, "c"))
    assert list(first.first_offsets) == [0] and list(second.first_offsets) == [2]
    assert list(_send(dc, leader, _request(1, "a", "b")).first_offsets) == [0]  # a retry: nothing appended
    dc.nodes[leader].kill()
    new = wait_for(lambda: (st := groups_of(dc, "Clicks")[0]).leader not in (None, leader) and st.leader,
                   SESSION_TIMEOUT * 3, "a new leader of group 0")
    wait_for(lambda: group_status(dc, new, "Clicks", 0).role == "leader", 20, "the new leader to serve")
    assert list(_send(dc, new, _request(2, "c")).first_offsets) == [2]  # the new leader holds the window
    assert list(_send(dc, new, _request(3, "d")).first_offsets) == [3]
    with pytest.raises(grpc.RpcError) as e:  # the same number for another request is a client bug, refused
        _send(dc, new, pb.AppendRequest(
            module="Clicks", group=0, ack=pb.ACK_APPLIED, producer=0xFEED, sequence=3, appends=[
                pb.DepotRecords(depot="*raw", task=0, records=[msgpack.packb(1)]),
                pb.DepotRecords(depot="*raw", task=2, records=[msgpack.packb(2)])]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "reused sequence 3" in (e.value.details() or "")
    with Cluster.connect(dc.hosts) as cluster:
        rows = cluster.depot("Clicks", "*raw").read(0, 0, None, 1 << 20)
    assert [r["id"] for r in rows] == ["a", "b", "c", "d"]


@pytest.mark.slow
def test_leader_kills_and_a_pause_store_every_acknowledged_value_exactly_once(dc: DevCluster) -> None:
    deploy(dc, tasks=4, threads=2)
    with Cluster.connect(dc.hosts, timeout_s=40) as cluster:
        raw = cluster.depot("Clicks", "*raw")
        clicks = cluster.depot("Clicks", "*clicks")
        writers: list[Any] = [
            Appender(raw, window=32, prefix="async-"),
            Writer(lambda recs: [raw.append(r, ack="applied") for r in recs],
                   lambda n: [{"user": f"u{n % 7}", "id": f"sync-{n}"}]),
            Writer(lambda recs: clicks.append_many(recs, ack="applied"),
                   lambda n: [{"user": f"u{(n * 20 + k) % 11}", "id": f"many-{n}-{k}"} for k in range(20)]),
        ]
        for w in writers:
            w.start()
        try:
            _flowing(writers, 20, "every writer to get acknowledgements")
            for kill in range(KILLS):
                group = kill % 2
                victim = groups_of(dc, "Clicks")[group].leader
                assert victim is not None
                dc.nodes[victim].kill()
                leader = wait_for(lambda g=group, v=victim: (st := groups_of(dc, "Clicks")[g]).leader not in (None, v)
                                  and st.leader, SESSION_TIMEOUT * 3, f"kill {kill}: a new leader of group {group}")
                wait_for(lambda g=group, lead=leader: group_status(dc, lead, "Clicks", g).role == "leader", 20,
                         f"kill {kill}: the new leader to serve")
                _flowing(writers, 10, f"kill {kill}: appends to continue after failover")
                dc.start_node(victim)
                dc.wait_nodes([victim])
                wait_for(lambda v=victim: all(v in st.isr for st in groups_of(dc, "Clicks").values()), 90,
                         f"kill {kill}: {victim} to rejoin every ISR")
            zombie = groups_of(dc, "Clicks")[1].leader
            assert zombie is not None
            dc.nodes[zombie].signal(signal.SIGSTOP)
            try:
                wait_for(lambda: groups_of(dc, "Clicks")[1].leader not in (None, zombie), SESSION_TIMEOUT * 3,
                         "a new leader of group 1 while the old one is paused")
                _flowing(writers, 10, "appends through the new leader")
            finally:
                dc.nodes[zombie].signal(signal.SIGCONT)
            wait_for(lambda: all(zombie in st.isr for st in groups_of(dc, "Clicks").values()), 90,
                     f"{zombie} to rejoin every ISR after the pause")
            _flowing(writers, 10, "appends after the pause")
        finally:
            for w in writers:
                w.stop()
    wait_for(lambda: converged(dc, "Clicks"), 90, "every replica to apply everything")
    acked = [r["id"] for w in writers for r in w.acked]
    assert len(acked) == len(set(acked))
    retried = sum(dc.nodes[n].log_path.read_text(errors="replace").count("answered a retried append")
                  for n in dc.nodes)
    groups = groups_of(dc, "Clicks")
    dc.stop()
    for g, st in groups.items():
        per_replica = {}
        for r in st.replicas:
            seen: Counter[str] = Counter()
            for rows in replica_state(dc.root, r, "Clicks", g)["depots"].values():
                seen.update(rec["id"] for _off, rec in rows)
            dups = {i: n for i, n in seen.items() if n > 1}
            assert not dups, f"group {g} replica {r}: {len(dups)} value(s) stored twice, e.g. {list(dups)[:5]}"
            per_replica[r] = seen
        first = per_replica[st.replicas[0]]
        assert all(s == first for s in per_replica.values()), f"group {g}: replicas hold different values"
    stored: Counter[str] = Counter()
    for g, st in groups.items():
        for rows in replica_state(dc.root, st.replicas[0], "Clicks", g)["depots"].values():
            stored.update(rec["id"] for _off, rec in rows)
    missing = [i for i in acked if stored[i] != 1]
    assert not missing, f"{len(missing)} acknowledged value(s) not stored exactly once, e.g. {missing[:5]}"
    print(f"\n{len(acked)} acknowledged, {sum(stored.values())} stored, 0 duplicates; "
          f"{retried} retried append(s) answered with their original offsets")
