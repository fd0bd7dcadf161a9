"""The election rule's abdication and preference order (the rest is in test_placement.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replog.election import abdicate, elect_leader, next_leadership
from replog.eligibility import record_storage
from replog.messages import STORAGE_LOST, GroupState, InvalidGroupState

NODES = ("n1", "n2", "n3", "n4")


def test_abdicating_leader_leaves_leadership_and_isr_and_a_live_isr_member_takes_over() -> None:
    s = GroupState(leader="n1", epoch=4, version=9, isr=("n1", "n2", "n3"), osr=(), placement=("n1", "n2", "n3"),
                   leader_session=11)
    after = abdicate(s, "n1", {"n1": 11, "n2": 22, "n3": 33})
    assert after == GroupState(leader="n2", epoch=5, version=10, isr=("n2", "n3"), osr=("n1",),
                               placement=s.replicas, leader_session=22)
    assert abdicate(after, "n1", {"n2": 22}) is None  # no longer leads: nothing to give up (stale call)


def test_abdicating_with_no_other_live_isr_member_leaves_the_group_leaderless() -> None:
    s = GroupState(leader="n1", epoch=4, isr=("n1", "n2"), osr=("n3",), placement=("n1", "n2", "n3"))
    after = abdicate(s, "n1", {"n1": 1, "n3": 3})
    assert after is not None and after.leader is None and after.epoch == 5
    assert after.isr == ("n2",) and set(after.osr) == {"n1", "n3"}  # n2 holds every applied entry
    back = next_leadership(after, {"n1": 1, "n2": 2, "n3": 3})
    assert back is not None and back.leader == "n2"  # never the OSR members


def test_sole_isr_member_abdicating_stays_in_the_isr() -> None:
    s = GroupState(leader="n1", epoch=2, isr=("n1",), osr=("n2",), placement=("n1", "n2"), leader_session=5)
    after = abdicate(s, "n1", {"n1": 5, "n2": 6})
    assert after is not None and (after.leader, after.isr, after.epoch, after.leader_session) == (None, ("n1",), 3, 0)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_abdicate_safety(data: st.DataObject) -> None:
    """Whatever the live set: the epoch grows, the ISR only shrinks and never empties, the new leader is
    a live member of the old ISR other than the one abdicating."""
    reps = data.draw(st.permutations(NODES))
    k = data.draw(st.integers(1, 4))
    isr = tuple(reps[:k])
    leader = data.draw(st.sampled_from(isr))
    s = GroupState(leader=leader, epoch=data.draw(st.integers(0, 50)), isr=isr, osr=tuple(reps[k:]),
                   placement=tuple(reps))
    live = dict.fromkeys(data.draw(st.sets(st.sampled_from(NODES))), 1)
    after = abdicate(s, leader, live)
    assert after is not None and after.epoch == s.epoch + 1 and after.version == s.version + 1
    assert after.leader != leader and set(after.isr) <= set(s.isr) and after.isr
    assert (leader not in after.isr) == (len(s.isr) > 1)
    if after.leader is not None:
        assert after.leader in s.isr and after.leader in live


def test_order_overrides_the_placement_preference() -> None:
    s = GroupState(leader=None, epoch=1, isr=("n1", "n2", "n3"), osr=(), placement=("n1", "n2", "n3"))
    assert elect_leader(s, {"n1", "n2", "n3"}) == "n1"
    assert elect_leader(s, {"n1", "n2", "n3"}, order=("n3", "n1", "n2")) == "n3"
    after = next_leadership(s, {"n1", "n2", "n3"}, order=("n2", "n3", "n1"))
    assert after is not None and after.leader == "n2"


# ------------------------------------------------------------------ eligible leader replicas (ELR, KIP-966)

def _recorded(*nodes: str, session: int = 1) -> tuple[tuple[str, int, int], ...]:
    return tuple((n, 100 + i, session) for i, n in enumerate(nodes))


def test_failover_keeps_the_deposed_leader_electable_in_the_elr() -> None:
    s = GroupState(leader="n1", epoch=3, version=7, isr=("n1", "n2"), osr=("n3",), placement=("n1", "n2", "n3"),
                   leader_session=1, storage=_recorded("n1", "n2", "n3"))
    after = next_leadership(s, {"n2": 1, "n3": 1})  # n1 lost its session
    assert after is not None
    assert (after.leader, after.isr, after.osr, after.elr) == ("n2", ("n2",), ("n1", "n3"), ("n1",))
    assert GroupState.from_json(after.to_json(), after.version) == after  # the znode keeps the ELR


def test_elr_member_leads_when_the_last_isr_member_lost_its_storage() -> None:
    """The double fault of seeds 5251341 & co: the new leader's storage turns out lost before it applied anything."""
    s = GroupState(leader=None, epoch=4, version=9, isr=("n2",), osr=("n1", "n3"), placement=("n1", "n2", "n3"),
                   storage=(("n1", 100, 1), ("n2", STORAGE_LOST, 1), ("n3", 102, 1)), elr=("n1",))
    assert elect_leader(s, {"n1": 1, "n2": 1, "n3": 1}) is None  # no ISR member can lead
    after = next_leadership(s, {"n1": 1, "n2": 1, "n3": 1})
    assert after is not None
    assert (after.leader, after.epoch, after.isr, after.elr) == ("n1", 5, ("n1",), ())
    assert set(after.osr) == {"n2", "n3"}  # the lost replica rebuilds from n1; n3 was never promised anything


def test_elr_member_is_not_elected_while_an_isr_member_can_lead_or_before_it_confirmed_its_storage() -> None:
    s = GroupState(leader=None, epoch=4, isr=("n2",), osr=("n1", "n3"), placement=("n1", "n2", "n3"),
                   storage=_recorded("n1", "n2", "n3"), elr=("n1",))
    assert next_leadership(s, {"n1": 1, "n2": 1}).leader == "n2"  # type: ignore[union-attr]
    assert next_leadership(s, {"n1": 2}) is None  # n1 restarted (session 2) and has not confirmed its storage
    assert next_leadership(s, {"n3": 1}) is None  # never an OSR member outside the ELR


def test_new_storage_takes_a_replica_out_of_the_elr() -> None:
    s = GroupState(leader="n2", epoch=4, isr=("n2",), osr=("n1", "n3"), placement=("n1", "n2", "n3"),
                   storage=_recorded("n1", "n2", "n3"), elr=("n1",))
    assert record_storage(s, "n1", 100, 2).elr == ("n1",)  # type: ignore[union-attr]  # same storage, new session
    assert record_storage(s, "n1", 555, 2).elr == ()  # type: ignore[union-attr]  # replaced storage


def test_elr_must_be_osr_members() -> None:
    with pytest.raises(InvalidGroupState, match="eligible leader replicas"):
        GroupState(leader="n1", epoch=1, isr=("n1", "n2"), osr=(), elr=("n2",))


def test_deposed_leader_joins_the_elr_only_when_one_in_sync_replica_is_left() -> None:
    s = GroupState(leader="n1", epoch=3, version=7, isr=("n1", "n2", "n3"), osr=(), placement=("n1", "n2", "n3"),
                   leader_session=1, storage=_recorded("n1", "n2", "n3"))
    after = next_leadership(s, {"n2": 1, "n3": 1})
    assert after is not None and after.isr == ("n2", "n3") and after.elr == ()  # no wait before applying


def test_deposed_leader_joins_the_elr_when_only_one_live_in_sync_copy_is_left() -> None:
    """Two members left but one of them down (sim seed 9414234): that down member may have lost its disk
    unknown to the znode, so the live one is a lone copy and the deposed leader stays electable."""
    s = GroupState(leader="n1", epoch=3, version=7, isr=("n1", "n2", "n3"), osr=(), placement=("n1", "n2", "n3"),
                   leader_session=1, storage=_recorded("n1", "n2", "n3"))
    after = next_leadership(s, {"n2": 1})
    assert after is not None and (after.leader, after.isr, after.elr) == ("n2", ("n2", "n3"), ("n1",))
