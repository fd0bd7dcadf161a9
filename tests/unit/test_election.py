"""The election rule's abdication and preference order (the rest is in test_placement.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from replog.election import abdicate, elect_leader, next_leadership
from replog.messages import GroupState

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


def test_failover_keeps_the_dead_leader_in_the_isr_when_dropping_it_would_go_below_min_isr() -> None:
    s = GroupState(leader="n1", epoch=4, isr=("n1", "n2"), osr=("n3",), placement=("n1", "n2", "n3"))
    kept = next_leadership(s, {"n2", "n3"}, min_isr=2)
    assert kept is not None and kept.leader == "n2" and kept.isr == ("n1", "n2") and kept.epoch == 5
    dropped = next_leadership(s, {"n2", "n3"}, min_isr=1)
    assert dropped is not None and dropped.isr == ("n2",) and "n1" in dropped.osr
    stays = abdicate(s, "n1", {"n1", "n2"}, min_isr=2)
    assert stays is not None and stays.leader == "n2" and stays.isr == ("n1", "n2")
