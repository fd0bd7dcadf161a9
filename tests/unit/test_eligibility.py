"""Storage eligibility (replog.eligibility): the open-time check, the znode records, who may be elected."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replog.election import elect_leader, leaderless_reason, next_leadership, unconfirmed_members
from replog.eligibility import StorageMarks, check_storage, eligible, record_storage
from replog.messages import STORAGE_LOST, GroupState, InvalidGroupState

REPS = ("n1", "n2", "n3")


def _state(**kw: object) -> GroupState:
    base: dict[str, object] = dict(leader="n1", epoch=3, isr=REPS, osr=(), placement=REPS, version=5,
                                   leader_session=11, storage=(("n1", 100, 11), ("n2", 200, 22), ("n3", 300, 33)))
    base.update(kw)
    return GroupState(**base)  # type: ignore[arg-type]


def test_check_storage_finds_lost_tails_and_a_store_ahead_of_its_log() -> None:
    assert check_storage(None, log_end=0, applied=-1) is None  # a new directory
    assert check_storage(StorageMarks(7, acked=9), log_end=10, applied=4) is None
    why = check_storage(StorageMarks(7, acked=12), log_end=10, applied=4)
    assert why is not None and "acknowledged entries up to offset 12" in why
    why = check_storage(StorageMarks(7, acked=3), log_end=2, applied=5)
    assert why is not None and "lost entries" in why  # not blamed on a checkpoint install
    # An interrupted far-horizon install (store swapped, log not reset yet) is finished, not lost.
    assert check_storage(StorageMarks(7, acked=3, installing=50), log_end=4, applied=50) is None
    assert check_storage(StorageMarks(7, acked=60, installing=50), log_end=4, applied=50) is not None


def test_json_round_trip_keeps_storage_records() -> None:
    s = _state()
    assert GroupState.from_json(s.to_json(), s.version) == s
    assert s.incarnation_of("n2") == 200 and s.storage_session("n2") == 22 and s.incarnation_of("x") is None
    with pytest.raises(InvalidGroupState, match="of a replica of"):
        _state(storage=(("n9", 1, 1),))
    with pytest.raises(InvalidGroupState, match="lost its storage"):
        _state(storage=(("n1", STORAGE_LOST, 11),))


def test_an_emptied_follower_leaves_the_isr_in_the_same_write_that_records_it() -> None:
    s = _state()
    new = record_storage(s, "n2", 201, 44)
    assert new is not None and new.isr == ("n1", "n3") and new.osr == ("n2",) and new.leader == "n1"
    assert new.epoch == s.epoch and new.version == s.version + 1 and new.incarnation_of("n2") == 201
    assert record_storage(new, "n2", 201, 44) is None


def test_an_emptied_leader_also_gives_up_leadership_with_an_epoch_bump() -> None:
    new = record_storage(_state(), "n1", 101, 11)
    assert new is not None and new.leader is None and new.epoch == 4 and "n1" not in new.isr
    after = next_leadership(new, {"n1": 11, "n2": 22, "n3": 33})
    assert after is not None and after.leader in ("n2", "n3")


def test_the_last_isr_member_with_lost_storage_stays_but_is_never_elected() -> None:
    s = _state(isr=("n1",), osr=("n2", "n3"))
    new = record_storage(s, "n1", 101, 12)
    assert new is not None and new.isr == ("n1",) and new.leader is None
    assert new.incarnation_of("n1") == STORAGE_LOST and not eligible(new, "n1", 12)
    assert record_storage(new, "n1", 102, 13) is None  # nothing more to write
    assert next_leadership(new, {"n1": 12, "n2": 22, "n3": 33}) is None
    reason = leaderless_reason(new, {"n1": 12, "n2": 22, "n3": 33})
    assert reason is not None and "no intact in-sync replica" in reason


def test_a_restarted_replica_is_elected_only_once_it_confirmed_its_storage_under_its_new_session() -> None:
    s = _state(leader=None, leader_session=0)
    assert elect_leader(s, {"n1": 99, "n2": 22}, order=("n1", "n2")) == "n2"  # n1 restarted: unconfirmed
    assert elect_leader(s, {"n1": 99}) is None
    reason = leaderless_reason(s, {"n1": 99})
    assert reason is not None and "have not confirmed their storage" in reason
    assert unconfirmed_members(s, {"n1": 99, "n2": 22}) == ["n1"]  # the conductor looks again soon
    confirmed = record_storage(s, "n1", 100, 99)  # intact storage: only the session changes
    assert confirmed is not None and confirmed.isr == s.isr and confirmed.storage_session("n1") == 99
    assert elect_leader(confirmed, {"n1": 99}) == "n1"


def test_groups_without_storage_records_are_not_checked() -> None:
    s = GroupState(leader=None, epoch=1, isr=REPS, osr=(), placement=REPS)
    assert elect_leader(s, {"n1": 5}) == "n1"
    first = record_storage(s, "n1", 7, 5)  # never recorded: recorded, whatever the ISR
    assert first is not None and first.isr == REPS and first.incarnation_of("n1") == 7


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_record_storage_never_empties_the_isr_nor_keeps_a_lost_replica_electable(data: st.DataObject) -> None:
    k = data.draw(st.integers(1, 3))
    isr, osr = REPS[:k], REPS[k:]
    leader = data.draw(st.sampled_from([None, *isr]))
    recs = tuple((n, data.draw(st.integers(1, 3)), 1) for n in REPS if data.draw(st.booleans()))
    s = GroupState(leader=leader, epoch=2, isr=isr, osr=osr, placement=REPS, storage=recs,
                   leader_session=1 if leader else 0)
    node = data.draw(st.sampled_from(REPS))
    inc = data.draw(st.integers(1, 3))
    new = record_storage(s, node, inc, 2)
    if new is None:
        return
    assert new.isr and set(new.isr) <= set(s.isr) and new.version == s.version + 1
    recorded = s.incarnation_of(node)
    if recorded not in (None, inc) and node in s.isr:  # lost what it acknowledged
        assert node not in new.isr or new.incarnation_of(node) == STORAGE_LOST
        assert new.leader != node and not (new.incarnation_of(node) == STORAGE_LOST and eligible(new, node, 2))
        assert new.epoch == s.epoch + (1 if s.leader == node else 0)
    else:
        assert (new.isr, new.leader, new.epoch) == (s.isr, s.leader, s.epoch)
