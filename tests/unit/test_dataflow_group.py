"""GroupDataflow, one step at a time: a root's completion, messages a group sends itself, poison held per source."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from pstate import Map, TaskGroupStore, outbox
from pstate.changes import ChangeSet
from topology import Module, hash_by, task_for_key
from topology.dataflow.entries import build_client_append
from topology.dataflow.group import Batch, GroupDataflow
from topology.dataflow.poison import RetryBook
from topology.dataflow.shipping import Pull
from topology.module import DEAD_LETTERS
from topology.stream import StreamRunner

TASKS, GROUPS = 4, 2


def plus_one(n: int | None) -> int:
    return (n or 0) + 1


def key_of(group: int, prefix: str) -> str:
    return next(f"{prefix}{i}" for i in range(1000) if task_for_key(f"{prefix}{i}", TASKS) % GROUPS == group)


class Counts(Module):
    def define(self, m):
        m.depot("*in", hash_by(lambda r: r["k"]))
        m.pstate("$$n", Map(str, int))

        @m.stream("*in")
        def fan(ctx, r):
            for k in r["to"]:
                ctx.send(count, k, r.get("bad", False))
            if "again" in r:
                ctx.depot_append("*in", r["again"])
            return len(r["to"])

        @m.handler
        def count(ctx, key, bad):
            if bad:
                raise RuntimeError("bad message")
            ctx.update("$$n", key, plus_one)


class Cluster:
    """Two groups, entries applied at once, messages delivered at once: the happy path, stepped by hand."""

    def __init__(self, root: Path) -> None:
        md = Counts.build()
        self.md = md
        self.flows = []
        for g in range(GROUPS):
            store = TaskGroupStore(root / str(g), {n: d.schema for n, d in md.pstates.items()}, md.depot_names())
            flow = GroupDataflow(functools.partial(lambda s: s, store), StreamRunner(md, TASKS, GROUPS, g),
                                 keepalive_ms=10, trim_min=1,
                                 retries=RetryBook(attempts=3, backoff_ms=100, factor=2))
            flow.lead(epoch=1)
            self.flows.append(flow)

    def commit(self, g: int, builder: Any) -> int:
        flow = self.flows[g]
        off = flow.store.applied_offset + 1
        cs = ChangeSet.decode(flow.store.stage(off, builder))
        flow.store.apply(off, cs)
        flow.applied(off, cs)
        return off

    def append(self, record: dict[str, Any]) -> tuple[int, int]:
        task = self.md.depots["*in"].partitioner(record, TASKS)
        g = task % GROUPS
        b, _firsts, acks = build_client_append(self.flows[g].store, self.flows[g].runner,
                                               [("*in", task, [msgpack.packb(record)])])
        assert acks == {"fan": [len(record["to"])]}
        return g, self.commit(g, b)

    def exchange(self, now: int) -> int:
        """Deliver every message once, build the inbound entries due; returns how many messages moved."""
        moved = 0
        for g, flow in enumerate(self.flows):
            for dst, _node, msg in flow.outgoing(now):
                assert dst != g, "a group's messages to itself never leave it"
                self.flows[dst].received(msg, peer=g)
                moved += 1
        for g, flow in enumerate(self.flows):
            if flow.inbound_due(now):
                b = flow.build_inbound(now)
                if b is not None:
                    self.commit(g, b)
        return moved

    def count(self, key: str) -> Any:
        return self.flows[task_for_key(key, TASKS) % GROUPS].store.select_one("$$n", key)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    for f in c.flows:
        f.store.close()


def test_a_root_completes_once_its_hops_are_applied_and_reported(cluster: Cluster) -> None:
    here, there = key_of(0, "a"), key_of(1, "b")
    g, off = cluster.append({"k": here, "to": [here, there]})
    flow = cluster.flows[g]
    other = 1 - g
    assert g == 0 and not flow.root_complete(off) and flow.completed_roots() == []
    assert cluster.count(here) == 1 and cluster.count(there) is None  # the local hop ran in the append's entry
    for t in range(1, 5):
        cluster.exchange(t * 20)
        if flow.completed_roots() == [off]:
            break
    else:
        pytest.fail("the root never completed")
    assert cluster.count(here) == cluster.count(there) == 1
    assert flow.root_complete(off)
    for t in range(5, 9):  # the complete envelope is trimmed from the outbox
        cluster.exchange(t * 20)
        b = flow.build_trim()
        if b is not None:
            cluster.commit(g, b)
    assert outbox.bounds(flow.store.applied_reader(), other).pending == 0
    assert not any(f.busy() for f in cluster.flows)


def test_a_poison_envelope_is_held_with_backoff_per_source_then_dead_lettered(cluster: Cluster) -> None:
    there = key_of(1, "b")
    cluster.append({"k": key_of(0, "s"), "to": [there], "bad": True})
    dst = cluster.flows[1]
    cluster.exchange(0)  # pull, ship, attempt 1 fails
    assert outbox.inbox_position(dst.store.applied_reader(), 0) == 0
    assert not dst.inbound_due(50)  # backing off
    # group 1 appends a record to its own depot partition: an envelope to itself, from another source
    again = {"k": key_of(1, "y"), "to": [key_of(1, "c")]}
    cluster.append({"k": key_of(1, "z"), "to": [], "again": again})
    cluster.exchange(60)
    assert cluster.count(key_of(1, "c")) == 1  # consumed while the envelope from group 0 is held
    assert outbox.inbox_position(dst.store.applied_reader(), 0) == 0
    for t in (120, 200, 330, 600):
        cluster.exchange(t)
    reader = dst.store.applied_reader()
    assert outbox.inbox_position(reader, 0) == 1 and outbox.dead_letters(reader) == 1
    [(_, dead)] = [r for t in range(1, TASKS, GROUPS) for r in dst.store.depot(DEAD_LETTERS).read(t, 0)]
    assert dead["hop"] == "count" and dead["error"] == "RuntimeError: bad message" and dead["attempts"] == 3
    assert dead["key"] == there and dead["from_group"] == 0
    assert cluster.count(there) is None


def test_a_destination_builds_its_next_inbound_entry_only_once_the_last_one_is_applied(cluster: Cluster) -> None:
    there = key_of(1, "b")
    dst = cluster.flows[1]

    def ship(now: int) -> None:  # pulls and batches only: no entry is built
        for g, flow in enumerate(cluster.flows):
            for d, _node, msg in flow.outgoing(now):
                cluster.flows[d].received(msg, peer=g)

    cluster.append({"k": key_of(0, "s1"), "to": [there]})
    ship(10)
    ship(11)
    assert dst.inbound_due(12)
    first = dst.build_inbound(12)
    assert first is not None
    off = dst.store.applied_offset + 1
    payload = dst.store.stage(off, first)  # appended to the replog, not applied yet
    cluster.append({"k": key_of(0, "s2"), "to": [there]})
    ship(13)
    ship(14)
    assert dst.busy() and not dst.inbound_due(15)  # the second envelope waits for the first entry's round
    cs = ChangeSet.decode(payload)
    dst.store.apply(off, cs)
    dst.applied(off, cs)
    assert dst.inbound_due(16)
    cluster.commit(1, dst.build_inbound(16))
    assert cluster.count(there) == 2
    assert outbox.inbox_position(dst.store.applied_reader(), 0) == 2


def test_a_refused_inbound_entry_does_not_hold_back_the_next_one(cluster: Cluster) -> None:
    there = key_of(1, "b")
    dst = cluster.flows[1]
    cluster.append({"k": key_of(0, "s1"), "to": [there]})
    for now in (10, 11):
        for g, flow in enumerate(cluster.flows):
            for d, _node, msg in flow.outgoing(now):
                cluster.flows[d].received(msg, peer=g)
    assert dst.build_inbound(12) is not None
    dst.dropped_inbound()  # refused before reaching the log (never staged): pull again, build again
    for now in (13, 14):
        for g, flow in enumerate(cluster.flows):
            for d, _node, msg in flow.outgoing(now):
                cluster.flows[d].received(msg, peer=g)
    assert dst.inbound_due(15)
    cluster.commit(1, dst.build_inbound(15))
    assert cluster.count(there) == 1


def test_pulls_are_for_the_source_group_and_from_another_leadership_are_refused(cluster: Cluster) -> None:
    flow = cluster.flows[0]
    flow.received(Pull(src=1, dst=1, epoch=5, position=0, window=100, report=(0, ())), peer=1)  # not ours
    assert flow.shipper.due({1: (0, 1)}) == []
    flow.received(Pull(src=0, dst=1, epoch=5, position=0, window=100, report=(0, ())), peer=1)
    flow.received(Pull(src=0, dst=1, epoch=4, position=0, window=100, report=(0, ())), peer="old")
    assert flow.shipper.due({1: (0, 1)}) == [(1, 1, 0, 1, 100)]
    follower = cluster.flows[1]
    follower.follow()
    follower.received(Batch(0, [(0, b"x")]))  # not leading: ignored
    assert not follower.busy() and not follower.inbound_due(0)


def test_a_full_outbox_refuses_client_appends_but_never_hop_traffic(cluster: Cluster,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from replog.errors import Backpressure
    from topology.dataflow import entries

    monkeypatch.setattr(entries, "OUTBOX_MAX_ENVELOPES", 2)
    there = key_of(1, "b")
    for i in range(2):  # group 1 is not pulling: envelopes pile up in group 0's outbox
        cluster.append({"k": key_of(0, f"s{i}"), "to": [there]})
    with pytest.raises(Backpressure, match="task group 1 has not completed 2 envelope"):
        cluster.append({"k": key_of(0, "s9"), "to": [there]})
    cluster.append({"k": key_of(0, "s8"), "to": [key_of(0, "c")]})  # no hop to group 1: accepted
    for t in range(1, 6):  # group 1 consumes and reports; the trim makes room again
        cluster.exchange(t * 20)
        b = cluster.flows[0].build_trim()
        if b is not None:
            cluster.commit(0, b)
    cluster.append({"k": key_of(0, "s9"), "to": [there]})
    assert cluster.count(there) == 2


def test_a_round_is_due_now_with_work_at_the_cadence_while_waiting_and_at_the_keepalive_when_idle(
        cluster: Cluster) -> None:
    """What the task thread sleeps on (GroupDataflow.next_due_ms): ``now`` for a round with work, 0 ("at the
    cadence") while waiting on other groups, the keepalive when idle; only work owes a trim check."""
    src, dst = cluster.flows
    cluster.append({"k": key_of(0, "s"), "to": [key_of(1, "d")]})
    assert src.working() and src.next_due_ms(5) == 5  # an applied entry: the round must ship and pull now
    for f in cluster.flows:
        f.outgoing(5)  # first pulls
    assert src.next_due_ms(6) == 0 and src.working()  # the envelope is out: waiting for its completion
    for t in range(1, 8):
        cluster.exchange(5 + t * 20)
    assert not src.busy() and not dst.busy()
    src.outgoing(200)
    due = src.next_due_ms(201)
    assert due is not None and due > 201 and not src.working()  # idle: the next keepalive, no trim owed
