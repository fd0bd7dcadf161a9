"""replog.retirement: a plan's last write retires the copies it drops; they are released once the kept replicas
reconfirm their storage, or taken back if those lost it; nothing is applied meanwhile."""

from __future__ import annotations

from dataclasses import replace

import pytest

from replog.config import ReplicationConfig
from replog.election import next_leadership
from replog.eligibility import record_storage
from replog.messages import (
    STORAGE_LOST,
    Ack,
    ClientAppend,
    GroupState,
    InvalidGroupState,
    IsrChanged,
    LocalFlushed,
    MetastoreChanged,
    Removed,
    Tick,
)
from replog.reassignment import (
    ReassignmentRefused,
    advance_reassignment,
    cancel_reassignment,
    start_reassignment,
)
from replog.replica import Replica
from replog.retirement import retired_names, take_back

LIVE = {"a": 1, "b": 2, "c": 3}


def shrinking(*, to: tuple[str, ...] = ("b",)) -> GroupState:
    """(a, b, c), every storage recorded, b leading, a plan to ``to`` started."""
    st = replace(GroupState.initial(("a", "b", "c")), leader="b", version=3, leader_session=2,
                 storage=(("a", 11, 1), ("b", 12, 2), ("c", 13, 3)))
    return start_reassignment(st, to)


def completed(*, to: tuple[str, ...] = ("b",)) -> GroupState:
    step = advance_reassignment(shrinking(to=to), LIVE)
    assert step.new is not None and not step.new.reassigning
    return step.new


def test_completion_retires_the_dropped_isr_copies_and_lists_the_kept_ones_to_reconfirm() -> None:
    st = completed()
    assert st.replicas == ("b",) and st.isr == ("b",) and st.storage == (("b", 12, 2),)
    assert st.retired == (("a", 11, 1), ("c", 13, 3)) and st.reconfirming == ("b",)
    assert GroupState.from_json(st.to_json(), st.version) == st
    legacy = GroupState.from_json(GroupState.initial(("a",)).to_json())
    assert legacy.retired == () and b"retired" not in legacy.to_json()


def test_an_out_of_sync_or_lost_copy_is_not_retired() -> None:
    st = replace(shrinking(), isr=("a", "b"), osr=("c",))
    new = advance_reassignment(st, LIVE).new
    assert new is not None and retired_names(new) == ("a",)


def test_cancel_retires_the_added_copies_that_joined_the_isr() -> None:
    st = start_reassignment(replace(GroupState.initial(("a", "b")), version=3, storage=(("a", 1, 1), ("b", 2, 2))),
                            ["a", "b", "c"])
    st = replace(st, version=st.version + 1, isr=("a", "b", "c"), osr=(), storage=st.with_storage("c", 3, 3))
    new = cancel_reassignment(st, LIVE).new
    assert new is not None and new.replicas == ("a", "b") and new.retired == (("c", 3, 3),)
    assert set(new.reconfirming) == {"a", "b"}


def test_group_state_rejects_broken_retired_copies() -> None:
    st = completed()
    with pytest.raises(InvalidGroupState, match="retired copies"):
        replace(st, retired=(("b", 12, 2),))  # a replica
    with pytest.raises(InvalidGroupState, match="retired copies"):
        replace(st, retired=(("a", STORAGE_LOST, 1),))
    with pytest.raises(InvalidGroupState, match="retired copies"):
        replace(st, retired=())  # reconfirming without retired copies
    with pytest.raises(ReassignmentRefused, match="retired copies"):
        start_reassignment(st, ["a", "b"])


def test_the_last_kept_replica_to_reconfirm_releases_the_copies() -> None:
    st = completed(to=("a", "b"))
    assert retired_names(st) == ("c",) and st.reconfirming == ("a", "b")
    mid = record_storage(st, "a", 11, 1)  # same storage, same session: recorded again all the same
    assert mid is not None and mid.reconfirming == ("b",) and mid.retired == st.retired
    assert advance_reassignment(mid, LIVE).waiting is not None  # b has not reconfirmed
    done = record_storage(mid, "b", 12, 2)
    assert done is not None and done.retired == () and done.reconfirming == ()
    assert record_storage(done, "b", 12, 2) is None


def test_a_kept_replica_with_new_storage_leaves_the_isr_and_no_longer_holds_the_release_up() -> None:
    st = completed(to=("a", "b"))
    a_lost = record_storage(st, "a", 99, 1)  # a found damage: a new incarnation
    assert a_lost is not None and a_lost.isr == ("b",) and a_lost.retired == st.retired
    done = record_storage(a_lost, "b", 12, 2)
    assert done is not None and done.retired == ()


def test_the_conductor_releases_once_the_leader_moved_the_unconfirmed_replica_out() -> None:
    st = completed(to=("a", "b"))
    st = replace(st, version=st.version + 1, isr=("b",), osr=("a",))  # the leader shrank a (down)
    st = replace(st, version=st.version + 1, storage=st.with_storage("b", 12, 2), reconfirming=("a",))
    step = advance_reassignment(st, LIVE)
    assert step.new is not None and step.new.retired == () and step.new.version == st.version + 1


def test_a_lost_last_replica_keeps_the_copies_and_they_are_taken_back() -> None:
    st = completed()
    lost = record_storage(st, "b", 99, 2)  # b found damage in the window: the last ISR member
    assert lost is not None and lost.incarnation_of("b") == STORAGE_LOST and lost.leader is None
    assert lost.reconfirming == ("b",) and lost.retired == st.retired
    assert record_storage(lost, "b", 99, 2) is None
    step = advance_reassignment(lost, LIVE)
    back = step.new
    assert back is not None and back == take_back(lost)
    assert set(back.isr) == {"a", "c"} and back.osr == ("b",) and back.leader is None and not back.reassigning
    assert back.retired == () and back.incarnation_of("a") == 11 and back.storage_session("a") == 1
    elected = next_leadership(back, LIVE)
    assert elected is not None and elected.leader in ("a", "c")
    # b, now outside the ISR, records its new storage and catches up
    again = record_storage(back, "b", 99, 2)
    assert again is not None and again.incarnation_of("b") == 99 and "b" in again.osr
    # and the plan starts again towards its target
    assert start_reassignment(back, ["b"]).removing in (("a", "c"), ("c", "a"))


def test_no_take_back_while_a_kept_replica_can_lead() -> None:
    assert take_back(completed()) is None
    assert take_back(completed(to=("a", "b"))) is None


# ------------------------------------------------------------------------------------------------ replicas


def cfg() -> ReplicationConfig:
    return ReplicationConfig(replication_factor=1)


def test_a_retired_replica_says_removed_and_keeps_its_data() -> None:
    st = shrinking()
    r = Replica("a", "g", cfg(), session=1, incarnation=11)
    r.handle(MetastoreChanged(st), 0)
    out = r.handle(MetastoreChanged(completed()), 1)
    assert Removed(completed().version, retired=True) in out and r.removed


def test_a_leader_applies_nothing_while_copies_are_retired_and_reconfirms_then_applies() -> None:
    st = completed()
    st = replace(st, version=st.version + 1, epoch=2, leader="b", leader_session=2)
    r = Replica("b", "g", cfg(), session=2, incarnation=12)
    out = r.handle(MetastoreChanged(st), 0)
    assert r.is_leader
    record = [a for a in out if type(a).__name__ == "RecordStorage"]
    assert len(record) == 1 and record[0].new.retired == () and record[0].new.reconfirming == ()
    r.handle(ClientAppend(1, 1, 10, Ack.APPLIED, ("x",)), 1)
    r.handle(LocalFlushed(1), 2)
    r.handle(Tick(), 3)
    assert r.apply_offset == -1, "nothing is applied while a copy is retired"
    out = r.handle(IsrChanged(record[0].new), 4)
    assert r.apply_offset == 0 and any(type(a).__name__ == "Reply" and a.error is None for a in out)
