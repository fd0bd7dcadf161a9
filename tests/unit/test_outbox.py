"""replog's driver rules that the worker and the simulator share: the outbox policy and the catchup round rule."""

from __future__ import annotations

from replog.catchup import MAX_ROUNDS, round_is_last
from replog.messages import FarHorizonOffer, RawReplicate, Replicate, ReplicateAck
from replog.outbox import BEAT_HOLD_MS, Outbox, coalesce_acks, is_beat


def beat(epoch: int = 3, apply_offset: int = 10) -> RawReplicate:
    return RawReplicate("L", epoch, 11, b"", apply_offset)


def frame(epoch: int = 3, apply_offset: int = 10) -> RawReplicate:
    return RawReplicate("L", epoch, 11, b"entries", apply_offset)


def test_beats_are_frames_without_entries_encoded_or_not() -> None:
    assert is_beat(beat()) and not is_beat(frame())
    assert is_beat(Replicate("L", "f", 3, 11, (), 10)) and not is_beat(Replicate("L", "f", 3, 11, (3,), 10))
    assert not is_beat(ReplicateAck("f", "L", 3, 10, 11)) and not is_beat(FarHorizonOffer("L", 3))


def test_a_leader_holds_a_beat_until_due_and_a_later_frame_replaces_it() -> None:
    ob = Outbox()
    ob.add("f1", beat())
    ob.add("f2", beat())
    assert ob.take(100, leader=True) == []
    assert ob.next_due() == 100 + BEAT_HOLD_MS
    ob.add("f1", frame(apply_offset=12))  # carries the same epoch and a newer apply offset: the beat is dropped
    assert ob.take(102, leader=True) == [("f1", frame(apply_offset=12))]
    assert ob.due(104) == []
    assert ob.due(105) == [("f2", beat())]
    assert ob.next_due() is None


def test_a_held_beat_that_says_more_than_the_next_frame_still_leaves() -> None:
    ob = Outbox()
    ob.add("f1", beat(epoch=3, apply_offset=20))
    ob.take(0, leader=True)
    ob.add("f1", frame(epoch=4, apply_offset=0))  # another epoch: the old beat is not superseded
    assert ob.take(1, leader=True) == [("f1", beat(epoch=3, apply_offset=20)), ("f1", frame(epoch=4, apply_offset=0))]


def test_followers_never_hold_beats_and_acks_wait_for_the_fsync() -> None:
    ob = Outbox()
    ack = ReplicateAck("f", "L", 3, 10, 11)
    ob.add("L", ack)
    offer = FarHorizonOffer("f", 3)
    ob.add("L", offer)
    assert ob.take(0, leader=False, hold_acks=True) == [("L", offer)]
    newer = ReplicateAck("f", "L", 3, 12, 13)
    ob.add("L", newer)
    assert ob.take(1, leader=False) == [("L", newer)]  # the superseded ack is dropped
    ob.add("L", beat())
    assert ob.take(2, leader=False) == [("L", beat())]


def test_coalescing_keeps_reset_acks_and_acks_of_other_epochs_or_peers() -> None:
    a1 = ReplicateAck("f", "L", 3, 10, 11)
    a2 = ReplicateAck("f", "L", 3, 12, 13)
    reset = ReplicateAck("f", "L", 3, 5, 6, reset=True)
    other_epoch = ReplicateAck("f", "L", 2, 9, 10)
    out = [("L", other_epoch), ("L", a1), ("L", reset), ("M", a1), ("L", a2)]
    assert coalesce_acks(out) == [("L", other_epoch), ("L", reset), ("M", a1), ("L", a2)]


def test_catchup_round_rule() -> None:
    assert round_is_last(behind=50, near_lag=100, rnd=1)
    assert not round_is_last(behind=51, near_lag=100, rnd=1)
    assert not round_is_last(behind=10_000, near_lag=100, rnd=MAX_ROUNDS - 1)
    assert round_is_last(behind=10_000, near_lag=100, rnd=MAX_ROUNDS)
