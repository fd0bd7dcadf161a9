"""replog.reassignment: the steps of a plan, the joint min-ISR rule, and what the state machine does with them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from replog.config import ReplicationConfig
from replog.election import elect_leader, next_leadership
from replog.messages import (
    Ack,
    ChangeIsr,
    ClientAppend,
    GroupState,
    InvalidGroupState,
    IsrChanged,
    IsrChangeFailed,
    LocalFlushed,
    MetastoreChanged,
    Removed,
    ReplicateAck,
    Reply,
    SendEntries,
    Tick,
)
from replog.reassignment import (
    ReassignmentRefused,
    advance_reassignment,
    cancel_reassignment,
    min_isr_for,
    min_isr_met,
    start_reassignment,
)
from replog.replica import Replica

LIVE = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}


def group(*replicas: str, leader: str = "a") -> GroupState:
    st = GroupState.initial(replicas)
    return replace(st, leader=leader, version=3)


# ------------------------------------------------------------------------------------------------ GroupState


def test_znode_without_plan_fields_reads_as_no_reassignment_and_round_trips() -> None:
    legacy = b'{"epoch":1,"isr":["a","b"],"leader":"a","leader_session":0,"osr":["c"],"replicas":["a","b","c"]}'
    st = GroupState.from_json(legacy, 4)
    assert not st.reassigning and st.adding == st.removing == () and st.target == st.original == ("a", "b", "c")
    assert b"adding" not in st.to_json() and b"removing" not in st.to_json()
    moving = start_reassignment(st, ["a", "b", "d"])
    assert GroupState.from_json(moving.to_json(), moving.version) == moving
    assert b'"adding":["d"]' in moving.to_json() and b'"removing":["c"]' in moving.to_json()


def test_group_state_rejects_broken_plans() -> None:
    base = group("a", "b", "c")
    with pytest.raises(InvalidGroupState, match="must be distinct replicas"):
        replace(base, adding=("x",))
    with pytest.raises(InvalidGroupState, match="both added and removed"):
        replace(base, adding=("b",), removing=("b",))
    with pytest.raises(InvalidGroupState, match="replicas before and after"):
        replace(base, removing=("a", "b", "c"))


# ------------------------------------------------------------------------------------------------ the steps


def test_start_adds_replicas_out_of_sync_and_refuses_a_second_plan() -> None:
    st = group("a")
    new = start_reassignment(st, ["a", "b", "c"])
    assert (new.isr, new.osr, new.adding, new.removing) == (("a",), ("b", "c"), ("b", "c"), ())
    assert new.version == st.version + 1 and new.epoch == st.epoch and new.leader == "a"
    with pytest.raises(ReassignmentRefused, match="in progress"):
        start_reassignment(new, ["a", "b"])
    with pytest.raises(ReassignmentRefused, match="already has"):
        start_reassignment(st, ["a"])
    with pytest.raises(ReassignmentRefused, match="distinct"):
        start_reassignment(st, ["b", "b"])


def test_advance_waits_for_every_target_replica_in_sync_then_completes() -> None:
    st = start_reassignment(group("a"), ["a", "b", "c"])
    assert "not in sync" in (advance_reassignment(st, LIVE).waiting or "")
    joined = replace(st, isr=("a", "b", "c"), osr=(), version=st.version + 1)
    assert "not live" in (advance_reassignment(joined, {"a": 1, "b": 2}).waiting or "")
    done = advance_reassignment(joined, LIVE).new
    assert done is not None and done.replicas == ("a", "b", "c") and not done.reassigning
    assert done.version == joined.version + 1 and done.epoch == joined.epoch


def test_advance_moves_leadership_off_a_removed_leader_before_removing_it() -> None:
    st = start_reassignment(group("a", "b", "c"), ["b", "c", "d"])
    joined = replace(st, isr=("a", "b", "c", "d"), osr=(), version=st.version + 1)
    step = advance_reassignment(joined, LIVE)
    assert step.resign_to == "b" and step.new is None
    moved = replace(joined, leader="c", epoch=joined.epoch + 1, version=joined.version + 1)
    done = advance_reassignment(moved, LIVE).new
    assert done is not None and done.replicas == ("b", "c", "d") and done.isr == ("b", "c", "d")
    assert done.leader == "c"


def test_completion_drops_removed_replicas_everywhere() -> None:
    st = replace(group("a", "b", "c"), storage=(("a", 1, 1), ("b", 2, 2), ("c", 3, 3)))
    moving = start_reassignment(st, ["a", "b"])
    done = advance_reassignment(moving, LIVE).new
    assert done is not None and "c" not in done.replicas + done.isr + done.osr + done.elr
    assert done.incarnation_of("c") is None


def test_cancel_goes_back_to_the_original_replicas_unless_only_added_ones_are_in_sync() -> None:
    st = start_reassignment(group("a"), ["a", "b", "c"])
    joined = replace(st, isr=("a", "b"), osr=("c",), version=st.version + 1)
    back = cancel_reassignment(joined, LIVE).new
    assert back is not None and back.replicas == ("a",) and back.isr == ("a",) and not back.reassigning
    led_by_added = replace(joined, leader="b", epoch=joined.epoch + 1, version=joined.version + 1)
    assert cancel_reassignment(led_by_added, LIVE).resign_to == "a"
    only_added = replace(joined, isr=("b",), osr=("a", "c"), leader="b", version=joined.version + 1)
    assert "no original replica" in (cancel_reassignment(only_added, LIVE).waiting or "")


# ------------------------------------------------------------------------------------------------ min-ISR


def test_min_isr_default_follows_the_replica_count_and_an_option_is_capped() -> None:
    assert [min_isr_for(ReplicationConfig(), n) for n in (1, 2, 3, 5)] == [1, 1, 2, 4]
    assert min_isr_for(ReplicationConfig(min_isr=3), 2) == 2


def test_joint_min_isr_counts_removed_replicas_only_toward_the_original_configuration() -> None:
    cfg = ReplicationConfig()
    everyone, adding, removing = ("a", "b", "c", "d"), ("d",), ("c",)  # replace c by d, min-ISR 2 on both sides
    assert min_isr_met(("a", "b"), everyone, adding, removing, cfg)
    assert not min_isr_met(("a", "c"), everyone, adding, removing, cfg)  # c's vote would be needed by the target
    assert not min_isr_met(("a", "d"), everyone, adding, removing, cfg)  # d's vote would be needed by the original
    assert min_isr_met(("a", "c", "d"), everyone, adding, removing, cfg)
    # RF 1 -> 3: the original's one copy is enough, so appends do not stall while b and c catch up
    assert min_isr_met(("a",), ("a", "b", "c"), ("b", "c"), (), cfg)
    # RF 3 -> 5: three in-sync originals
    assert min_isr_met(("a", "b"), ("a", "b", "c", "d", "e"), ("d", "e"), (), cfg)
    assert not min_isr_met(("a", "d"), ("a", "b", "c", "d", "e"), ("d", "e"), (), cfg)


# ------------------------------------------------------------------------------------------------ election


def test_a_removed_replica_is_elected_only_when_no_other_in_sync_replica_can_lead() -> None:
    st = replace(start_reassignment(group("a", "b", "c"), ["b", "c", "d"]), leader=None)
    assert elect_leader(st, LIVE, order=["a", "b", "c", "d"]) == "b"
    assert elect_leader(st, {"a": 1, "d": 4}) == "a"  # the only live in-sync copy: availability
    assert elect_leader(st, {"d": 4}) is None  # an added replica outside the ISR never
    led = next_leadership(replace(st, leader="b", leader_session=2), {"a": 1, "c": 3, "d": 4},
                          order=["a", "b", "c", "d"])
    assert led is not None and led.leader == "c" and led.removing == ("a",)


# ------------------------------------------------------------------------------------------------ Replica


def leader_of(st: GroupState) -> Replica:
    r = Replica("a", "g", ReplicationConfig(max_time_lag_ms=100, append_timeout_ms=500), session=1)
    r.handle(MetastoreChanged(replace(st, leader_session=1, epoch=2)), 0)
    assert r.is_leader
    return r


def test_leader_admits_an_added_replica_by_the_rejoin_rule_and_then_needs_its_acks() -> None:
    st = start_reassignment(group("a", "b"), ["a", "b", "c"])
    r = leader_of(st)
    r.handle(ClientAppend(1, 1, 10, Ack.APPLIED), 1)
    r.handle(LocalFlushed(1), 2)
    out = r.handle(ReplicateAck("b", "a", 2, 0, 1, reset=True), 3)
    assert r.apply_offset == 0 and Reply(1, 0, 1) in out  # b is the original quorum; c is catching up
    out = r.handle(ReplicateAck("c", "a", 2, 0, 1, reset=True), 4)
    (join,) = [x for x in out if isinstance(x, ChangeIsr)]
    assert join.new.isr == ("a", "b", "c") and join.new.adding == ("c",)
    r.handle(IsrChanged(join.new), 5)
    r.handle(ClientAppend(2, 1, 10, Ack.APPLIED), 6)
    r.handle(LocalFlushed(2), 7)
    r.handle(ReplicateAck("b", "a", 2, 1, 2), 8)
    assert r.apply_offset == 0  # c joined the ISR: its ack is needed
    r.handle(ReplicateAck("c", "a", 2, 1, 2), 9)
    assert r.apply_offset == 1


def test_leader_forgets_a_removed_replica_and_a_removed_replica_says_so() -> None:
    st = start_reassignment(group("a", "b", "c"), ["a", "b"])
    r = leader_of(st)
    done = advance_reassignment(replace(st, epoch=2, leader_session=1), LIVE).new
    assert done is not None
    r.handle(MetastoreChanged(done), 5)
    assert set(r.follower_offsets()) == {"b"}
    out = r.handle(ReplicateAck("c", "a", 2, 0, 0, reset=True), 6)  # a removed replica keeps talking
    assert not [x for x in out if isinstance(x, SendEntries) and x.dst == "c"]

    c = Replica("c", "g", ReplicationConfig(), session=3)
    c.handle(MetastoreChanged(replace(st, epoch=2)), 0)
    out = c.handle(MetastoreChanged(done), 1)
    assert Removed(done.version) in out and c.removed and c.next_tick_ms() is None
    out = c.handle(ClientAppend(1, 1, 10, Ack.APPLIED), 2)
    assert len(out) == 1 and isinstance(out[0], Reply) and out[0].error is not None
    assert c.handle(MetastoreChanged(replace(st, epoch=2)), 3) == []  # terminal: a new replica serves a re-add


def test_a_stale_znode_without_the_replica_does_not_remove_it() -> None:
    before = group("a", "b")
    added = start_reassignment(before, ["a", "b", "c"])
    c = Replica("c", "g", ReplicationConfig(), session=3)
    c.handle(MetastoreChanged(replace(added, epoch=2)), 0)
    assert c.handle(MetastoreChanged(before), 1) == [] and not c.removed


def test_a_stale_znode_from_before_the_replica_was_added_is_ignored_whole() -> None:
    """Sweep seed: a replica added (again) got a notification older than its first znode, without itself; its
    storage must not be recorded on it (that znode has no place for it), and a failed CAS answered with such a
    znode is taken as answered without it."""
    cfg = ReplicationConfig(request_timeout_ms=100)
    removed = replace(group("a", "b"), storage=(("a", 1, 1), ("b", 2, 2)))
    added = start_reassignment(removed, ["a", "b", "c"])
    c = Replica("c", "g", cfg, session=3, incarnation=30)
    (rec,) = c.handle(MetastoreChanged(added), 0)
    assert c.handle(MetastoreChanged(removed), 1) == [] and not c.removed
    assert c.handle(IsrChangeFailed("conflict", rec.new, removed), 2) == [] and not c.removed  # type: ignore[attr-defined]
    out = c.handle(Tick(), 200)  # proposes its record again, on the znode that lists it
    assert [type(x).__name__ for x in out] == ["RecordStorage"]
