"""Idempotent producers on a real store: retries answered from the window, staged or applied, and bounded state."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path as FsPath

import msgpack
import pytest

from conductor.worker.replica_store import ReplicaStore
from pstate import Map, TaskGroupStore, producers
from pstate.changes import ChangeSet
from topology.entries.port import EntryPort
from topology.entries.requests import DepotAppend

PID = 0xABCDEF


@pytest.fixture
def rs(tmp_path: FsPath) -> Iterator[ReplicaStore]:
    s = ReplicaStore(TaskGroupStore(tmp_path / "state", {"$$counts": Map(str, int)}, depots=["*log"]))
    yield s
    s.close()


def _records(*values: object) -> list[bytes]:
    return [msgpack.packb(v, use_bin_type=True) for v in values]


class Leader:
    """The leader's side of the task thread: build, stage at the next offset, apply later (like replica_host)."""

    def __init__(self, rs: ReplicaStore) -> None:
        self.rs = rs
        self.port = EntryPort(rs.current, rs.code)
        self.end = rs.applied_offset + 1
        self.log: list[tuple[int, int, bytes]] = []

    def append(self, values: list[object], producer: int = PID, sequence: int = 0,
               task: int = 0) -> list[int]:
        builder, (firsts, _acks) = self.port.build(DepotAppend([("*log", task, _records(*values))], producer,
                                                               sequence))
        self.log.append((self.end, 1, self.rs.stage(self.end, builder)))
        self.end += 1
        return firsts

    def apply_all(self) -> None:
        self.rs.apply_entries([e for e in self.log if e[0] > self.rs.applied_offset])


def _depot(rs: ReplicaStore, task: int = 0) -> list[object]:
    return [v for _o, v in rs.store.depot("*log").read(task, 0, None, 1 << 30)]


def test_a_retry_gets_the_original_offsets_staged_or_applied_and_appends_nothing(rs: ReplicaStore) -> None:
    lead = Leader(rs)
    assert lead.append(["a", "b"], sequence=1) == [0]
    assert lead.append(["c"], sequence=2) == [2]
    assert lead.append(["a", "b"], sequence=1) == [0]  # the original is staged, not applied yet
    lead.apply_all()
    assert lead.append(["c"], sequence=2) == [2]  # applied
    assert lead.append(["d"], sequence=3) == [3]
    lead.apply_all()
    assert _depot(rs) == ["a", "b", "c", "d"]
    assert lead.port.retries_answered == 2
    # the retry's entry holds no writes: it only waits its turn in the log
    assert len(ChangeSet.decode(lead.log[2][2])) == 0


def test_a_new_leader_sees_the_window_in_entries_it_holds_but_has_not_applied(tmp_path: FsPath) -> None:
    old = ReplicaStore(TaskGroupStore(tmp_path / "old", {}, depots=["*log"]))
    new = ReplicaStore(TaskGroupStore(tmp_path / "new", {}, depots=["*log"]))
    try:
        lead = Leader(old)
        lead.append(["x"], sequence=7)
        new.stage_inherited(lead.log)  # what a follower turned leader does with its unapplied tail
        builder, (firsts, _) = EntryPort(new.current, None).build(DepotAppend([("*log", 0, _records("x"))], PID, 7))
        assert firsts == [0] and len(builder) == 0
    finally:
        old.close()
        new.close()


def test_other_producers_and_unnumbered_requests_are_appended(rs: ReplicaStore) -> None:
    lead = Leader(rs)
    lead.append(["a"], sequence=1)
    assert lead.append(["a"], producer=PID + 1, sequence=1) == [1]
    assert lead.append(["a"], producer=0, sequence=0) == [2]
    assert lead.append(["a"], producer=0, sequence=0) == [3]
    lead.apply_all()
    assert _depot(rs) == ["a"] * 4


def test_a_sequence_reused_for_a_different_request_is_refused(rs: ReplicaStore) -> None:
    lead = Leader(rs)
    lead.append(["a"], sequence=1)
    with pytest.raises(ValueError, match="reused sequence 1"):
        lead.port.build(DepotAppend([("*log", 0, _records("a")), ("*log", 1, _records("b"))], PID, 1))


def test_the_window_is_bounded_and_past_it_a_retry_is_appended_again(rs: ReplicaStore) -> None:
    lead = Leader(rs)
    n = producers.WINDOW + 10
    for seq in range(1, n + 1):
        lead.append([seq], sequence=seq)
    lead.apply_all()
    window = list(rs.store.applied_reader().scan("_meta", b"q:", b"q;"))
    assert len(window) == producers.WINDOW  # one slot per sequence number of the window, overwritten in turn
    assert lead.append([n], sequence=n) == [n - 1]  # inside the window: the original offset
    assert lead.append([1], sequence=1) == [n]  # past it: appended again (at-least-once)
    lead.apply_all()
    assert _depot(rs)[-1] == 1 and len(_depot(rs)) == n + 1


def test_producers_idle_too_long_or_beyond_the_limit_are_forgotten(rs: ReplicaStore,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(producers, "MAX_PRODUCERS", 3)
    lead = Leader(rs)
    for pid in range(1, 6):
        lead.append([pid], producer=pid, sequence=1)
    lead.apply_all()
    reader = rs.store.applied_reader()
    assert producers.producers(reader) == 3
    assert producers.lookup(reader, 1, 1).previous is None and producers.lookup(reader, 2, 1).previous is None
    assert producers.lookup(reader, 5, 1).previous is not None
    # an idle producer expires on the next append of anyone
    clock = [int(time.time() * 1000)]
    monkeypatch.setattr(producers, "MAX_PRODUCERS", 100)
    monkeypatch.setattr("topology.entries.client_append.time.time", lambda: clock[0] / 1000)
    lead.append(["new"], producer=99, sequence=1)
    clock[0] += producers.EXPIRY_MS + 1
    lead.append(["newer"], producer=99, sequence=producers.EXPIRY_CHECK_EVERY)  # checks now and then
    lead.apply_all()
    assert producers.producers(rs.store.applied_reader()) == 3


def test_a_retry_gets_the_original_ack_values_of_the_topologies(tmp_path: FsPath) -> None:
    from topology import load_module
    from topology.group_code import GroupCode, ModuleCode

    md = load_module("examples.timeline:Timeline").build()
    code = GroupCode(ModuleCode("Timeline", "v1", "v1", lambda _v: md), 4, 1, 0)  # one task group: hops stay here
    rs = ReplicaStore(TaskGroupStore(tmp_path / "tl", {n: d.schema for n, d in md.pstates.items()},
                                     md.depot_names()), code)
    try:
        lead = Leader(rs)
        follows = [("*follows", 0, _records(*({"author": "ann", "follower": f} for f in ("bob", "cat"))))]
        builder, _reply = lead.port.build(DepotAppend(follows, PID, 1))
        lead.log.append((lead.end, 1, rs.stage(lead.end, builder)))
        lead.end += 1
        lead.apply_all()
        post = [("*posts", 0, _records({"author": "ann", "id": 1, "text": "hi"}))]
        first_builder, first = lead.port.build(DepotAppend(post, PID, 2))
        assert first[1] == {"fanout": [2]}
        rs.stage(lead.end, first_builder)
        again_builder, again = lead.port.build(DepotAppend(post, PID, 2))
        assert again == first and len(again_builder) == 0
    finally:
        rs.close()
