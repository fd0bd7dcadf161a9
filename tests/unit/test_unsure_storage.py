"""Unsure storage (replog.eligibility, issue 32): marks written beside the log's fsync claim the flush in flight; a
replica whose log ends at or below the claim keeps its place with its log in the znode, and is elected only as the
most up-to-date once every ISR and ELR member has registered its log in the leaderless epoch."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from crc32c import crc32c

from conductor.worker.durability import LogDurability
from conductor.worker.replica_disk import open_disk
from replog.config import ReplicationConfig
from replog.election import leaderless_reason, next_leadership
from replog.eligibility import (
    StorageMarks,
    check_storage,
    most_up_to_date,
    record_storage,
    storage_unsure,
    sure,
    unsure_of,
)
from replog.marks_file import SIZE, MarksFile
from replog.messages import STORAGE_LOST, GroupState, InvalidGroupState
from replog.retirement import take_back

REPS = ("n1", "n2", "n3")
LIVE = {"n1": 11, "n2": 22, "n3": 33}


def _state(**kw: object) -> GroupState:
    base: dict[str, object] = dict(leader="n1", epoch=3, isr=REPS, osr=(), placement=REPS, version=5,
                                   leader_session=11, storage=(("n1", 100, 11), ("n2", 200, 22), ("n3", 300, 33)))
    base.update(kw)
    return GroupState(**base)  # type: ignore[arg-type]


def test_a_log_ending_within_the_claimed_flush_is_unsure_below_the_acked_mark_lost() -> None:
    marks = StorageMarks(7, acked=9, claimed=14)
    assert check_storage(marks, log_end=12, applied=4) is None and storage_unsure(marks, log_end=12)
    assert not storage_unsure(marks, log_end=15)  # the whole claimed flush is there: sure
    assert check_storage(marks, log_end=9, applied=4) is not None  # a reported flush is gone: lost
    assert not storage_unsure(StorageMarks(7, acked=9), log_end=10)  # serial marks (no claim) are never unsure
    assert not storage_unsure(None, log_end=0)


def test_an_unsure_isr_member_stays_with_its_log_and_a_leader_gives_up_leadership() -> None:
    s = _state()
    follower = record_storage(s, "n2", 201, 44, log=(3, 120))
    assert follower is not None and follower.isr == REPS and follower.leader == "n1" and follower.epoch == 3
    assert follower.incarnation_of("n2") == 201 and unsure_of(follower, "n2") == (3, 120, 3)
    assert not sure(follower, "n2") and sure(follower, "n1")
    assert record_storage(follower, "n2", 201, 44, log=(3, 125)) is None  # a leader exists: nothing to refresh
    leader = record_storage(s, "n1", 101, 12, log=(3, 130))
    assert leader is not None and leader.leader is None and leader.epoch == 4 and leader.isr == REPS
    assert unsure_of(leader, "n1") == (3, 130, 4)
    # In a later leaderless epoch the record is written again, with the log as it is then.
    later = GroupState.from_json(follower.to_json(), follower.version)
    later = GroupState(None, 5, REPS, (), later.version, 0, REPS, later.storage, unsure=later.unsure)
    again = record_storage(later, "n2", 201, 44, log=(3, 121))
    assert again is not None and unsure_of(again, "n2") == (3, 121, 5)
    # Never registered, or out of sync: nothing to doubt.
    osr = record_storage(_state(isr=("n1", "n3"), osr=("n2",)), "n2", 201, 44, log=(3, 120))
    assert osr is not None and osr.unsure == () and osr.incarnation_of("n2") == 201


def test_unsure_records_round_trip_and_are_dropped_outside_the_isr_and_elr() -> None:
    s = _state(unsure=(("n2", 3, 120, 3),))
    assert GroupState.from_json(s.to_json(), s.version) == s
    assert _state(isr=("n1", "n3"), osr=("n2",), unsure=(("n2", 3, 120, 3),)).unsure == ()
    with pytest.raises(InvalidGroupState, match="unsure records"):
        _state(unsure=(("n2", 3, 120, 3), ("n2", 3, 121, 3)))


def _leaderless(**kw: object) -> GroupState:
    return _state(leader=None, epoch=4, leader_session=0, **kw)


def test_a_sure_member_is_elected_before_any_unsure_one() -> None:
    s = _leaderless(unsure=(("n1", 3, 130, 4), ("n2", 3, 120, 4)))
    new = next_leadership(s, LIVE)
    assert new is not None and new.leader == "n3" and new.unsure == s.unsure


def test_an_unsure_member_waits_for_every_witness_then_the_most_up_to_date_is_elected() -> None:
    all_unsure = (("n1", 2, 140, 4), ("n2", 3, 120, 4), ("n3", 3, 125, 4))
    s = _leaderless(unsure=all_unsure[:2])  # n3 has not registered since it restarted
    assert next_leadership(s, {"n1": 11, "n2": 22}) is None
    why = leaderless_reason(s, {"n1": 11, "n2": 22})
    assert why is not None and "most up-to-date" in why and "waiting for ['n3']" in why
    s = _leaderless(unsure=all_unsure, storage=(("n1", 100, 11), ("n2", 200, 22), ("n3", 300, 34)))
    assert most_up_to_date(s, LIVE) is None  # n3 recorded its log under an older session
    s = _leaderless(unsure=all_unsure)
    assert most_up_to_date(s, LIVE) == ["n3"]  # epoch 3 beats epoch 2, then 125 beats 120
    new = next_leadership(s, LIVE)
    assert new is not None and new.leader == "n3" and new.epoch == 5 and unsure_of(new, "n3") is None
    assert unsure_of(new, "n1") is not None and new.isr == REPS
    stale = _leaderless(unsure=(*all_unsure[:2], ("n3", 3, 125, 3)))  # registered while an earlier leader led
    assert most_up_to_date(stale, LIVE) is None
    reason = leaderless_reason(stale, LIVE)
    assert reason is not None and "most up-to-date" in reason


def test_a_lost_member_is_no_witness_and_an_unsure_elr_member_is_one() -> None:
    s = _leaderless(isr=("n2",), osr=("n1", "n3"), elr=("n1",),
                    storage=(("n1", 100, 11), ("n2", STORAGE_LOST, 22), ("n3", 300, 33)),
                    unsure=(("n1", 3, 130, 4),))
    new = next_leadership(s, LIVE)
    assert new is not None and new.leader == "n1" and new.isr == ("n1",) and new.elr == () and new.unsure == ()


def test_retired_copies_are_taken_back_when_the_kept_replicas_are_unsure_which_stay_as_witnesses() -> None:
    s = GroupState(None, 4, ("n1",), (), 9, 0, ("n1",), (("n1", 100, 11),), retired=(("n2", 200, 22),),
                   reconfirming=("n1",), unsure=(("n1", 3, 130, 4),))
    assert most_up_to_date(s, {"n1": 11}) is None  # not while copies are retired
    back = take_back(s)
    assert back is not None and set(back.isr) == {"n1", "n2"} and back.retired == () and back.unsure == s.unsure
    assert take_back(GroupState(None, 4, ("n1",), (), 9, 0, ("n1",), (("n1", 100, 11),),
                                retired=(("n2", 200, 22),), reconfirming=("n1",))) is None


# ------------------------------------------------------------------------------------- the driver's marks and open


def test_marks_round_trip_their_claim_and_the_format_before_it_reads_as_none(tmp_path: Path) -> None:
    f = MarksFile(tmp_path / "marks")
    f.save(StorageMarks(9, acked=4, claimed=7))
    f.close()
    assert MarksFile(tmp_path / "marks").load() == StorageMarks(9, acked=4, claimed=7)
    assert (tmp_path / "marks").stat().st_size == SIZE
    body = struct.pack("<8sQqqqIIQ", b"MRMARKS3", 5, 30, -1, 12, 0, 0, 0)  # the format before the claim
    (tmp_path / "v3").write_bytes(body + struct.pack("<I", crc32c(body)))
    assert MarksFile(tmp_path / "v3").load() == StorageMarks(5, acked=30, applied=12)
    f = MarksFile(tmp_path / "marks")
    f.load()
    f.lower_to(3)
    assert f.current == StorageMarks(9, acked=2, claimed=2)
    f.close()


def test_a_flush_claims_its_entries_beside_the_log_and_an_open_within_the_claim_is_unsure(tmp_path: Path) -> None:
    d = open_disk("g", tmp_path, -1, 1 << 20, boot=1)
    assert not d.unsure and d.storage_lost is None
    durability = LogDurability(d.log, d.marks, boot=1)
    d.log.append(1, 0, [b"a", b"b", b"c"])
    durability.written(ReplicationConfig(), 0)
    assert d.marks.current is not None and (d.marks.current.acked, d.marks.current.claimed) == (-1, 2)
    d.log.append(1, 0, [b"d"])
    durability.written(ReplicationConfig(), 0)
    assert (d.marks.current.acked, d.marks.current.claimed) == (2, 3)
    inc = d.incarnation
    d.log.close()
    d.marks.close()
    # As a power loss during a flush of [3, 6) leaves it: the marks claimed up to 5, the replog holds [0, 4).
    MarksFile(tmp_path / "marks").save(StorageMarks(inc, acked=3, claimed=5))
    again = open_disk("g", tmp_path, -1, 1 << 20, boot=1)
    assert again.unsure and again.storage_lost is None and again.incarnation != inc
    assert again.marks.current == StorageMarks(again.incarnation, acked=3, claimed=5)  # unsure until it registers
    again.log.close()
    again.marks.close()
    MarksFile(tmp_path / "marks").save(StorageMarks(inc, acked=4, claimed=5))  # a reported flush is gone: lost
    lost = open_disk("g", tmp_path, -1, 1 << 20, boot=1)
    assert not lost.unsure and lost.storage_lost is not None
    lost.log.close()
    lost.marks.close()
