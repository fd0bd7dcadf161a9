"""The follower side: epoch exchange (KIP-101/279), fencing by epoch, appends and applies."""

from __future__ import annotations

from typing import Any

import pytest

from replog.config import ReplicationConfig
from replog.epochs import UNDEFINED_EPOCH
from replog.messages import (
    Action,
    AppendLocal,
    Apply,
    EpochRequest,
    EpochResponse,
    GroupState,
    LocalFlushed,
    MetastoreChanged,
    PersistEpochs,
    Replicate,
    ReplicateAck,
    Role,
    Send,
    Tick,
    Truncate,
)
from replog.replica import Replica


def of(actions: list[Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def follower(log_end: int = 0, pairs: tuple[tuple[int, int], ...] = (), applied: int = -1,
             epoch: int = 5) -> tuple[Replica, list[Action]]:
    r = Replica("b", "g", ReplicationConfig(request_timeout_ms=100), session=1, log_end=log_end,
                epoch_pairs=pairs, applied=applied)
    out = r.handle(MetastoreChanged(GroupState("a", epoch, ("a", "b"), (), 9, 1)), 0)
    return r, out


def answer(r: Replica, found: int, end: int, now: int = 1) -> list[Action]:
    assert r._requested_epoch is not None
    return r.handle(EpochResponse("a", "b", r.epoch, r._requested_epoch, found, end), now)


def test_empty_follower_is_reconciled_at_once() -> None:
    r, out = follower()
    assert r.reconciled and out[-1] == Send(ReplicateAck("b", "a", 5, -1, 0, True))


def test_every_epoch_change_starts_an_epoch_exchange_even_with_the_same_leader() -> None:
    r, out = follower(10, ((1, 0), (3, 6)), applied=4)
    assert not r.reconciled and Send(EpochRequest("b", "a", 5, 3)) in out
    answer(r, 3, 10)
    assert r.reconciled
    out = r.handle(MetastoreChanged(GroupState("a", 6, ("a", "b"), (), 10, 1)), 5)
    assert not r.reconciled and of(out, Send) == [Send(EpochRequest("b", "a", 6, 3))]


def test_truncates_to_the_leaders_end_of_the_common_epoch() -> None:
    r, _ = follower(10, ((1, 0), (3, 6)), applied=4)
    out = answer(r, 3, 8)
    assert of(out, Truncate) == [Truncate(8)]
    assert r.log_end == 8 and r.reconciled
    assert out[-1] == Send(ReplicateAck("b", "a", 5, 7, 8, True))


def test_never_truncates_to_the_high_watermark() -> None:
    """KIP-101: the leader holds everything we have, so nothing goes, whatever the apply offset."""
    r, out = follower(10, ((1, 0), (3, 6)), applied=2)
    out = answer(r, 3, 12)
    assert not of(out, Truncate) and r.log_end == 10


def test_iterates_when_the_leader_lacks_our_latest_epoch() -> None:
    """KIP-279: our epochs 1,3 vs leader's 1,2: first cut at our end of epoch 1 / the leader's end of
    epoch 2, then ask again for epoch 1 and cut where the leader's epoch 1 ends."""
    r, _ = follower(10, ((1, 0), (3, 6)), applied=1)
    out = answer(r, 2, 9)  # leader: largest epoch <= 3 is 2, ending at 9
    assert of(out, Truncate) == [Truncate(6)] and PersistEpochs(((1, 0),)) in out
    assert of(out, Send) == [Send(EpochRequest("b", "a", 5, 1))] and not r.reconciled
    out = answer(r, 1, 4)
    assert of(out, Truncate) == [Truncate(4)] and r.reconciled
    assert r.epochs.to_pairs() == [(1, 0)]


def test_undefined_answer_truncates_to_the_leaders_first_epoch() -> None:
    r, _ = follower(3, ((1, 0),))
    out = answer(r, UNDEFINED_EPOCH, 0)
    assert of(out, Truncate) == [Truncate(0)] and r.reconciled and r.epochs.to_pairs() == []


def test_truncating_an_applied_entry_is_a_bug() -> None:
    r, _ = follower(10, ((1, 0),), applied=7)
    with pytest.raises(AssertionError, match="truncate applied entries"):
        answer(r, 1, 5)


def test_stale_epoch_answers_are_ignored_and_requests_retried() -> None:
    r, _ = follower(10, ((1, 0),))
    assert r.handle(EpochResponse("a", "b", 4, 1, 1, 2), 1) == []
    assert r.handle(Tick(), 50) == []
    assert r.handle(Tick(), 100) == [Send(EpochRequest("b", "a", 5, 1))]


def test_asks_again_on_the_leaders_first_frame_of_the_epoch_once() -> None:
    """Told of the epoch before its leader was (a hand-off's CAS, a faster watch), the question may have been
    dropped: the leader's first beat proves it leads now, so ask at once rather than after the request timeout."""
    r, out = follower(10, ((1, 0),))
    assert of(out, Send) == [Send(EpochRequest("b", "a", 5, 1))]
    beat = Replicate("a", "b", 5, 10, (), 4)
    assert r.handle(beat, 3) == [Send(EpochRequest("b", "a", 5, 1))]
    assert r.handle(beat, 4) == [], "once per epoch: a later frame does not repeat it (the timer repairs losses)"
    assert r.handle(Tick(), 102) == [], "the request timeout runs from the second question"
    assert r.handle(Tick(), 103) == [Send(EpochRequest("b", "a", 5, 1))]
    answer(r, 1, 10, now=104)
    assert r.reconciled


def test_a_frame_that_brings_the_epoch_or_an_answer_means_no_second_question() -> None:
    r = Replica("b", "g", ReplicationConfig(request_timeout_ms=100), session=1, log_end=10, epoch_pairs=((1, 0),))
    out = r.handle(Replicate("a", "b", 5, 10, (), 4), 0)  # heard of the epoch from its leader itself
    assert of(out, Send) == [Send(EpochRequest("b", "a", 5, 1))]
    assert r.handle(Replicate("a", "b", 5, 10, (), 4), 1) == []
    r, _ = follower(10, ((1, 0), (3, 6)), applied=1)
    answer(r, 2, 8)  # KIP-279: the next question goes to a leader that has answered in this epoch
    assert r._requested_epoch == 1
    assert r.handle(Replicate("a", "b", 5, 6, (), 1), 2) == []


def test_appends_frames_and_acks_its_durable_offset() -> None:
    r, _ = follower()
    out = r.handle(Replicate("a", "b", 5, 0, (4, 5, 5), -1, "data"), 1)
    assert of(out, AppendLocal) == [AppendLocal(0, (4, 5, 5), "data", 0)]
    assert r.epochs.to_pairs() == [(4, 0), (5, 1)]
    # the epochs are durable before the entries are written: a kill in between keeps entries, not epochs
    assert out.index(PersistEpochs(((4, 0), (5, 1)))) < out.index(AppendLocal(0, (4, 5, 5), "data", 0))
    assert out[-1] == Send(ReplicateAck("b", "a", 5, -1, 3))  # nothing durable yet
    out = r.handle(LocalFlushed(3), 2)
    assert out == [Send(ReplicateAck("b", "a", 5, 2, 3))]


def test_overlapping_and_gapped_frames() -> None:
    r, _ = follower()
    r.handle(Replicate("a", "b", 5, 0, (5, 5), -1), 1)
    out = r.handle(Replicate("a", "b", 5, 1, (5, 5, 5), -1, "d"), 1)  # duplicate head
    assert of(out, AppendLocal) == [AppendLocal(2, (5, 5), "d", 1)]
    out = r.handle(Replicate("a", "b", 5, 9, (5,), -1), 100)  # a frame was lost
    assert not of(out, AppendLocal) and out == [Send(ReplicateAck("b", "a", 5, -1, 4, True))]


def test_a_gap_asks_for_a_resend_at_most_once_per_request_timeout() -> None:
    """Fault campaign seed 2016: a restarted follower got, before the leader's resend from its end, the beats
    queued for it while it was down; a reset ack for each made the leader resend its whole window each time,
    and the follower took 38-90 s to rejoin the ISR. Frames past our end wait for the resend already asked
    for (by the reconcile's reset ack, or an earlier gap's) until the request timeout (100 ms here)."""
    r, out = follower()
    assert out[-1] == Send(ReplicateAck("b", "a", 5, -1, 0, True))  # reconciled at 0: resend from 0
    for t in (1, 50, 99):
        assert r.handle(Replicate("a", "b", 5, 700, (), 3), t) == []  # a stale beat: the resend is coming
    assert r.handle(Replicate("a", "b", 5, 700, (), 3), 100) == [Send(ReplicateAck("b", "a", 5, -1, 0, True))]
    assert r.handle(Replicate("a", "b", 5, 700, (), 3), 150) == []
    out = r.handle(Replicate("a", "b", 5, 0, (5, 5), 3, "d"), 160)  # the resend: appended as usual
    assert of(out, AppendLocal) == [AppendLocal(0, (5, 5), "d", 0)]
    assert r.handle(Replicate("a", "b", 5, 9, (), 3), 200) == [Send(ReplicateAck("b", "a", 5, -1, 2, True))]


def test_applies_up_to_the_leaders_apply_offset_but_only_what_it_holds() -> None:
    r, _ = follower()
    r.handle(Replicate("a", "b", 5, 0, (5, 5, 5), -1), 1)
    out = r.handle(Replicate("a", "b", 5, 3, (), 2), 2)
    assert not of(out, Apply)  # holds nothing durably yet
    out = r.handle(LocalFlushed(2), 3)
    assert of(out, Apply) == [Apply(1)]
    out = r.handle(LocalFlushed(3), 4)
    assert of(out, Apply) == [Apply(2)]


def test_drops_frames_of_older_epochs_and_follows_newer_ones() -> None:
    r, _ = follower()
    assert r.handle(Replicate("z", "b", 4, 0, (4,), 0), 1) == []
    out = r.handle(Replicate("c", "b", 7, 0, (7,), 0), 1)
    assert r.role is Role.FOLLOWER and r.leader == "c" and r.epoch == 7
    assert not of(out, AppendLocal)  # reconcile first (empty log: at once), then take frames


def test_restarted_replica_follows_a_leader_of_its_recovered_epoch() -> None:
    r = Replica("b", "g", ReplicationConfig(), session=3, log_end=4, epoch_pairs=[(5, 0)], applied=1)
    assert r.epoch == 5 and r.role is Role.UNATTACHED
    out = r.handle(MetastoreChanged(GroupState("a", 5, ("a", "b"), (), 9, 1)), 0)
    assert r.role is Role.FOLLOWER and Send(EpochRequest("b", "a", 5, 5)) in out


def test_recovery_forgets_epochs_beyond_the_durable_log() -> None:
    r = Replica("b", "g", ReplicationConfig(), log_end=3, epoch_pairs=[(1, 0), (2, 3), (3, 5)])
    assert r.epochs.to_pairs() == [(1, 0)] and r.epoch == 1


def test_an_epoch_cut_at_open_is_persisted_before_older_epoch_entries_land_there() -> None:
    """Sim seed 9504344: b led epoch 4 without writing (its file: epoch 4 starts at 48 = its log end). Reopened,
    it cuts epoch 4 in memory; the file must be cut too before entries of epoch 3 land at 48, or after the next
    restart b would say those entries are epoch 4's, and a new follower would truncate applied entries."""
    r = Replica("b", "g", ReplicationConfig(request_timeout_ms=100), session=1, log_end=48,
                epoch_pairs=((2, 0), (3, 22), (4, 48)), applied=40)
    assert r.next_tick_ms() == 0  # a tick is due: it writes the file even when no other event comes
    out = r.handle(Tick(), 0)
    assert of(out, PersistEpochs) == [PersistEpochs(((2, 0), (3, 22)))]
    assert of(r.handle(Tick(), 1), PersistEpochs) == []  # once
