"""The leader side of the replication state machine, event by event (no simulator, no mocks)."""

from __future__ import annotations

from typing import Any

import pytest

from replog.config import ReplicationConfig
from replog.errors import Backpressure, NotLeader, StalledGroup
from replog.messages import (
    Ack,
    Action,
    AppendLocal,
    Apply,
    ChangeIsr,
    ClientAppend,
    ConfigChanged,
    EpochRequest,
    EpochResponse,
    GroupState,
    HandOff,
    InvalidGroupState,
    IsrChanged,
    IsrChangeFailed,
    LocalFlushed,
    MetastoreChanged,
    PersistEpochs,
    RecordStorage,
    ReplicateAck,
    Reply,
    ResignRequested,
    Role,
    RoleChanged,
    Send,
    SendEntries,
    SessionExpired,
    SessionStarted,
    StartFarHorizon,
    Tick,
)
from replog.replica import Replica

ISR3 = GroupState("a", 1, ("a", "b", "c"), (), 1, 1)


def make_leader(state: GroupState = ISR3, **cfg: Any) -> tuple[Replica, list[Action]]:
    opts: dict[str, Any] = {"replication_factor": len(state.replicas), "max_time_lag_ms": 100,
                            "append_timeout_ms": 500, "heartbeat_interval_ms": 50}
    opts.update(cfg)
    r = Replica("a", "g", ReplicationConfig(**opts), session=1)
    return r, r.handle(MetastoreChanged(state), 0)


def of(actions: list[Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def ack(r: Replica, src: str, held: int, now: int = 1, reset: bool = False) -> list[Action]:
    return r.handle(ReplicateAck(src, "a", r.epoch, held, held + 1, reset), now)


def test_becoming_leader_records_the_epoch_at_the_log_end_and_announces_it() -> None:
    r = Replica("a", "g", ReplicationConfig(), session=1, log_end=5, epoch_pairs=[(0, 0)], applied=2)
    out = r.handle(MetastoreChanged(GroupState("a", 4, ("a", "b"), (), 3, 1)), 0)
    assert r.is_leader and r.epochs.to_pairs() == [(0, 0), (4, 5)]
    assert PersistEpochs(((0, 0), (4, 5))) in out
    assert RoleChanged(Role.LEADER, 4, "a") in out
    assert {a.dst for a in of(out, SendEntries)} == {"b"}  # heartbeat: tells b about epoch 4


def test_leader_elected_outside_the_isr_is_a_bug() -> None:
    # The group state refuses it when built, so no replica (or metastore write) ever sees one.
    with pytest.raises(InvalidGroupState, match="not in the ISR"):
        GroupState("a", 1, ("b", "c"), ("a",), 1, 1)


def test_leadership_of_another_session_is_not_taken() -> None:
    r = Replica("a", "g", ReplicationConfig(), session=2)
    r.handle(MetastoreChanged(GroupState("a", 1, ("a", "b", "c"), (), 1, 1)), 0)
    assert r.role is Role.UNATTACHED


def test_ack_levels() -> None:
    r, _ = make_leader()
    out = r.handle(ClientAppend(1, 2, 20, Ack.NONE), 1)
    assert of(out, AppendLocal) == [AppendLocal(0, (1, 1), None, 0)]
    assert of(out, Reply) == [Reply(1, 0, 2)]  # none: at once
    r.handle(ClientAppend(2, 1, 10, Ack.APPEND), 1)
    r.handle(ClientAppend(3, 1, 10, Ack.APPLIED), 1)
    out = r.handle(LocalFlushed(3), 2)
    assert of(out, Reply) == [Reply(2, 2, 1)]  # append: once durable on the leader
    assert not of(out, Apply)
    out = ack(r, "b", 3)
    assert not of(out, Apply)  # c has not confirmed
    out = ack(r, "c", 2)
    assert of(out, Apply) == [Apply(2)]
    assert not of(out, Reply)  # request 3 is offset 3
    out = ack(r, "c", 3)
    assert not of(out, Apply)  # the leader itself does not hold offset 3 yet
    out = r.handle(LocalFlushed(4), 3)
    assert of(out, Apply) == [Apply(3)] and of(out, Reply) == [Reply(3, 3, 1)]


def test_apply_never_passes_the_leaders_own_durable_end() -> None:
    r, _ = make_leader()
    r.handle(ClientAppend(1, 3, 30, Ack.APPLIED), 1)
    r.handle(LocalFlushed(1), 1)
    ack(r, "b", 2)
    out = ack(r, "c", 2)
    assert of(out, Apply) == [Apply(0)]


def test_entries_are_sent_to_followers_with_the_apply_offset() -> None:
    r, _ = make_leader()
    ack(r, "b", -1, reset=True)
    out = r.handle(ClientAppend(1, 3, 30, Ack.APPLIED), 1)
    assert SendEntries("b", 1, 0, 3, -1) in out


def test_lagging_member_is_removed_by_cas_before_anything_relies_on_it() -> None:
    r, _ = make_leader()
    r.handle(ClientAppend(1, 1, 10, Ack.APPLIED), 0)
    r.handle(LocalFlushed(1), 1)
    ack(r, "b", 0, now=2)
    out = r.handle(Tick(), 101)
    (change,) = of(out, ChangeIsr)
    assert change.expected_version == 1 and change.new.isr == ("a", "b") and change.new.osr == ("c",)
    assert not of(out, Apply)
    out = r.handle(Tick(), 150)  # still waiting for the metastore: no apply, no second CAS
    assert not of(out, Apply) and not of(out, ChangeIsr)
    out = r.handle(IsrChanged(change.new), 160)
    assert of(out, Apply) == [Apply(0)] and of(out, Reply) == [Reply(1, 0, 1)]
    assert r.isr == ("a", "b")


def test_failed_isr_cas_applies_nothing_and_expiry_fences() -> None:
    r, _ = make_leader()
    r.handle(ClientAppend(1, 1, 10, Ack.APPLIED), 0)
    r.handle(LocalFlushed(1), 1)
    ack(r, "b", 0, now=2)
    (change,) = of(r.handle(Tick(), 101), ChangeIsr)
    out = r.handle(IsrChangeFailed("session_expired", change.new), 110)
    assert not of(out, Apply)
    (reply,) = of(out, Reply)
    assert isinstance(reply.error, NotLeader)
    assert r.role is Role.UNATTACHED
    out = r.handle(ClientAppend(2, 1, 10, Ack.NONE), 111)
    assert isinstance(of(out, Reply)[0].error, NotLeader) and not of(out, AppendLocal)


def test_conflicting_cas_from_a_new_epoch_deposes_the_leader() -> None:
    r, _ = make_leader()
    r.handle(ClientAppend(1, 1, 10, Ack.APPLIED), 0)
    r.handle(LocalFlushed(1), 1)
    ack(r, "b", 0, now=2)
    (change,) = of(r.handle(Tick(), 101), ChangeIsr)
    newer = GroupState("b", 2, ("a", "b", "c"), (), 2, 7)
    out = r.handle(IsrChangeFailed("conflict", change.new, newer), 110)
    assert r.role is Role.FOLLOWER and r.leader == "b" and r.epoch == 2
    assert Send(EpochRequest("a", "b", 2, 1)) in out


def test_late_cas_answer_of_an_earlier_leadership_is_ignored() -> None:
    """Found by seed 4164 (2 s of faults): a session-expired answer to the CAS of epoch 5 arrived
    after the replica led epoch 6 under a new session, and fenced the new leadership."""
    r, _ = make_leader()
    r.handle(ClientAppend(1, 1, 10, Ack.APPLIED), 0)
    r.handle(LocalFlushed(1), 1)
    ack(r, "b", 0, now=2)
    (old,) = of(r.handle(Tick(), 101), ChangeIsr)
    r.handle(SessionExpired(), 102)
    r.handle(SessionStarted(2), 103)
    r.handle(MetastoreChanged(GroupState("a", 2, ("a", "b", "c"), (), 2, 2)), 104)
    assert r.is_leader
    assert r.handle(IsrChangeFailed("session_expired", old.new), 105) == []
    assert r.handle(IsrChanged(old.new), 105) == []
    assert r.is_leader and r.epoch == 2


def test_group_stalls_instead_of_shrinking_below_min_isr() -> None:
    r, _ = make_leader(min_isr=3)
    r.handle(ClientAppend(1, 1, 10, Ack.APPLIED), 0)
    r.handle(LocalFlushed(1), 1)
    ack(r, "b", 0, now=2)
    out = r.handle(Tick(), 200)
    assert not of(out, ChangeIsr) and r.stalled
    out = r.handle(Tick(), 500)
    (reply,) = of(out, Reply)
    assert isinstance(reply.error, StalledGroup)
    assert reply.error.isr == ["a", "b"] and reply.error.min_isr == 3


def test_backpressure_bounds_the_unapplied_lead() -> None:
    r, _ = make_leader(max_unapplied_entries=5)
    r.handle(ClientAppend(1, 4, 40, Ack.NONE), 0)
    out = r.handle(ClientAppend(2, 2, 20, Ack.NONE), 0)
    (reply,) = of(out, Reply)
    assert isinstance(reply.error, Backpressure) and "replication.max.unapplied.entries=5" in str(reply.error)
    assert not of(out, AppendLocal)


def test_inflight_entries_per_follower_are_bounded() -> None:
    r, _ = make_leader(max_inflight_entries=4, max_batch_entries=3)
    ack(r, "b", -1, reset=True)
    out = r.handle(ClientAppend(1, 10, 100, Ack.NONE), 1)
    sends = [(s.start, s.end) for s in of(out, SendEntries) if s.dst == "b" and s.end > s.start]
    assert sends == [(0, 3), (3, 4)]
    out = r.handle(ReplicateAck("b", "a", 1, -1, 2), 2)
    assert [(s.start, s.end) for s in of(out, SendEntries) if s.end > s.start] == [(4, 6)]


def test_caught_up_osr_member_rejoins_by_cas() -> None:
    r, _ = make_leader(GroupState("a", 1, ("a", "b"), ("c",), 1, 1))
    r.handle(ClientAppend(1, 2, 20, Ack.NONE), 0)
    out = ack(r, "c", 0, reset=True)
    assert not of(out, ChangeIsr)
    out = ack(r, "c", 1)
    (change,) = of(out, ChangeIsr)
    assert change.new.isr == ("a", "b", "c") and change.new.osr == ()


def test_a_resign_request_naming_the_member_its_cas_in_flight_admits_is_kept_until_the_cas_lands() -> None:
    """Sim seed 14013316: the conductor asks for the hand-off after reading the znode the leader's own CAS wrote;
    the request may arrive before that CAS's answer. The leader keeps it and hands off once the CAS lands, never
    before the successor is in its ISR."""
    for outcome in ("landed", "failed"):
        r, _ = make_leader(GroupState("a", 1, ("a",), ("b",), 1, 1))
        r.handle(ClientAppend(1, 1, 10, Ack.NONE), 0)
        r.handle(LocalFlushed(1), 0)
        (change,) = of(ack(r, "b", 0, reset=True), ChangeIsr)
        assert change.new.isr == ("a", "b")
        r.handle(ResignRequested("b", 2, 1), 2)
        assert r.resigning_to == "b", "the request names the member the CAS in flight admits"
        if outcome == "landed":
            out = r.handle(IsrChanged(change.new), 3)
            (hand_off,) = of(out, HandOff)
            assert hand_off.new.leader == "b" and hand_off.new.epoch == 2
        else:  # not admitted: no hand-off to a replica outside the ISR (the leader proposes the admission again)
            out = r.handle(IsrChangeFailed("conflict", change.new, None), 3)
            out += r.handle(Tick(), 10)
            assert not of(out, HandOff) and [c.new.isr for c in of(out, ChangeIsr)] == [("a", "b")]


def test_far_behind_osr_member_gets_far_horizon_catchup() -> None:
    r, _ = make_leader(GroupState("a", 1, ("a", "b"), ("c",), 1, 1), max_near_sync_message_lag=5)
    r.handle(ClientAppend(1, 20, 200, Ack.NONE), 0)
    r.handle(LocalFlushed(20), 0)
    ack(r, "b", 19, reset=True)  # applied through 19: a checkpoint now skips more than the near window
    assert r.apply_offset == 19
    out = r.handle(ReplicateAck("c", "a", 1, -1, 0, True), 1)
    assert of(out, StartFarHorizon) == [StartFarHorizon("c", 1, 19)]
    assert not [s for s in of(out, SendEntries) if s.dst == "c" and s.end > s.start]
    out = r.handle(ReplicateAck("c", "a", 1, 16, 17), 2)  # the checkpoint arrived
    assert [(s.start, s.end) for s in of(out, SendEntries) if s.dst == "c"] == [(17, 20)]


def test_stalled_group_offers_no_checkpoint_that_skips_nothing() -> None:
    """Below min-ISR nothing is applied, so a checkpoint holds nothing the follower lacks: it replays."""
    r, _ = make_leader(GroupState("a", 1, ("a", "b"), ("c",), 1, 1), max_near_sync_message_lag=5, min_isr=3)
    r.handle(ClientAppend(1, 20, 200, Ack.NONE), 0)
    r.handle(LocalFlushed(20), 0)
    ack(r, "b", 19, reset=True)  # every ISR member holds it all, but the ISR (2) is below min-ISR (3)
    assert r.apply_offset == -1
    out = r.handle(ReplicateAck("c", "a", 1, -1, 0, True), 1)
    assert not of(out, StartFarHorizon)
    assert [(s.start, s.end) for s in of(out, SendEntries) if s.dst == "c" and s.end > s.start]


def test_epoch_request_is_answered_from_the_cache() -> None:
    r = Replica("a", "g", ReplicationConfig(), session=1, log_end=8, epoch_pairs=[(1, 0), (3, 5)])
    r.handle(MetastoreChanged(GroupState("a", 4, ("a", "b"), (), 5, 1)), 0)
    out = r.handle(EpochRequest("b", "a", 4, 2), 1)
    assert out == [Send(EpochResponse("a", "b", 4, 2, 1, 5))]
    assert r.handle(EpochRequest("b", "a", 3, 2), 1) == []  # wrong epoch: ignored


def test_session_expiry_stops_writes_and_applies() -> None:
    r, _ = make_leader()
    r.handle(ClientAppend(1, 1, 10, Ack.APPLIED), 0)
    r.handle(LocalFlushed(1), 1)
    out = r.handle(SessionExpired(), 2)
    assert isinstance(of(out, Reply)[0].error, NotLeader)
    assert ack(r, "b", 0) == [] and ack(r, "c", 0) == []
    assert r.applied == -1


def test_lowering_min_isr_live_unstalls_the_group() -> None:
    """`conductor set-option ... replication.min.isr` reaches a running leader as ConfigChanged."""
    r, _ = make_leader(min_isr=3)
    r.handle(ClientAppend(1, 1, 10, Ack.APPLIED, data=[b"x"]), 1)
    r.handle(LocalFlushed(1), 2)
    ack(r, "b", 0, now=3)
    r.handle(Tick(), 300)  # c lags beyond max_time_lag_ms, but dropping it would break min-ISR 3
    assert r.stalled and r.apply_offset == -1
    out = r.handle(ConfigChanged(ReplicationConfig(replication_factor=3, min_isr=2, max_time_lag_ms=100,
                                                   append_timeout_ms=500, heartbeat_interval_ms=50)), 301)
    (cas,) = of(out, ChangeIsr)
    assert cas.new.isr == ("a", "b") and cas.new.osr == ("c",)
    out = r.handle(IsrChanged(cas.new), 302)
    assert r.apply_offset == 0 and not r.stalled
    assert [x.request_id for x in of(out, Reply) if x.error is None] == [1]
    # The placed replication factor may change too (a reassignment is what changes the replicas): min-ISR's
    # default follows the group's replica count, not the option.
    r.handle(ConfigChanged(ReplicationConfig(replication_factor=5)), 303)
    assert r.min_isr == 2 and not r.stalled


def test_a_silent_follower_of_a_quiet_group_is_dropped_on_the_first_append_after_the_lag() -> None:
    """A follower that died holding the whole log lags from its last acknowledgement, not from the next entry:
    every group it followed drops it as soon as an entry needs it, not max_time_lag_ms after that entry (which
    stalled `applied` appends one group after another, max_time_lag_ms each, after a worker was killed)."""
    r, _ = make_leader(min_isr=2)
    r.handle(ClientAppend(1, 1, 10, Ack.APPLIED, data=[b"x"]), 1)
    r.handle(LocalFlushed(1), 2)
    ack(r, "b", 0, now=3)
    ack(r, "c", 0, now=3)  # c's last word: it holds everything, then goes silent
    for t in range(10, 200, 20):
        ack(r, "b", 0, now=t)  # b answers heartbeats; the group is quiet
    out = r.handle(Tick(), 200)
    assert not of(out, ChangeIsr), "holding everything, c is not lagging however long it was silent"
    r.handle(ClientAppend(2, 1, 1000, Ack.APPLIED, data=[b"y"]), 201)
    r.handle(LocalFlushed(2), 202)
    out = ack(r, "b", 1, now=203) + r.handle(Tick(), 204)
    (cas,) = of(out, ChangeIsr)
    assert cas.new.isr == ("a", "b") and cas.new.osr == ("c",)
    out = r.handle(IsrChanged(cas.new), 205)
    assert [x.request_id for x in of(out, Reply) if x.error is None] == [2]


def test_a_follower_that_acknowledges_in_time_is_not_dropped_for_a_short_lag() -> None:
    r, _ = make_leader(min_isr=2)
    for i in range(5):
        t = 1000 + 40 * i
        r.handle(ClientAppend(i + 1, 1, 10_000, Ack.APPLIED, data=[b"x"]), t)
        r.handle(LocalFlushed(i + 1), t + 1)
        ack(r, "b", i, now=t + 2)
        ack(r, "c", i - 1, now=t + 2)  # c trails by one entry, but answers every frame
        assert not of(r.handle(Tick(), t + 3), ChangeIsr)


def test_storage_is_recorded_before_leading_and_only_acks_of_recorded_storage_count() -> None:
    """replog.eligibility: no leading before the znode records this storage; a follower's acks count only
    from the incarnation the znode records, and a new incarnation makes the leader forget the old one's."""
    cfg = ReplicationConfig(replication_factor=3, max_time_lag_ms=100, append_timeout_ms=500)
    st = GroupState("a", 1, ("a", "b", "c"), (), 1, 1, storage=(("b", 20, 2), ("c", 30, 3)))
    r = Replica("a", "g", cfg, session=1, incarnation=10)
    out = r.handle(MetastoreChanged(st), 0)
    (rec,) = of(out, RecordStorage)
    assert not r.is_leader and rec.expected_version == 1 and rec.new.incarnation_of("a") == 10
    r.handle(IsrChanged(rec.new), 1)
    assert r.is_leader
    r.handle(ClientAppend(1, 1, 10, Ack.APPLIED), 2)
    r.handle(LocalFlushed(1), 3)
    r.handle(ReplicateAck("b", "a", 1, 0, 1, incarnation=99), 4)  # a storage the znode does not record
    r.handle(ReplicateAck("c", "a", 1, 0, 1, incarnation=30), 4)
    assert r.follower_offsets() == {"b": -1, "c": 0} and r.apply_offset == -1
    out = r.handle(ReplicateAck("b", "a", 1, 0, 1, incarnation=20), 5)
    assert r.apply_offset == 0 and Reply(1, 0, 1) in of(out, Reply)
    # b's disk is replaced: it records its new storage, leaving the ISR; the leader forgets what b held.
    moved = GroupState("a", 1, ("a", "c"), ("b",), rec.new.version + 1, 1,
                       storage=(("a", 10, 1), ("b", 21, 2), ("c", 30, 3)))
    r.handle(MetastoreChanged(moved), 6)
    assert r.isr == ("a", "c") and r.follower_offsets()["b"] == -1


def test_leader_applies_nothing_until_its_cas_empties_the_elr() -> None:
    """An ELR member is electable because it holds every applied entry: the leader keeps that true."""
    st = GroupState("a", 2, ("a", "b"), ("c",), 1, 1, elr=("c",))
    r, out = make_leader(st)
    (change,) = of(out, ChangeIsr)  # the first thing it does: empty the ELR, ISR unchanged
    assert (change.new.isr, change.new.osr, change.new.elr) == (("a", "b"), ("c",), ())
    r.handle(ClientAppend(1, 1, 10, Ack.APPLIED), 1)
    r.handle(LocalFlushed(1), 2)
    out = ack(r, "b", 0, now=3)
    assert not of(out, Apply) and not of(out, Reply)  # every ISR member holds it, yet c may lack it
    out = r.handle(IsrChanged(change.new), 5)
    assert of(out, Apply) == [Apply(0)] and of(out, Reply) == [Reply(1, 0, 1)]


def test_a_follower_that_has_not_reconciled_gets_beats_per_heartbeat_not_per_apply() -> None:
    """It ignores apply offsets; a beat for each apply-offset advance only piled up in the transport while it was
    down, and each cost a reset ack and a resend of the whole window when it came back (campaign seed 2016)."""
    r, _ = make_leader(GroupState("a", 1, ("a", "b"), ("c",), 1, 1), min_isr=2)
    ack(r, "b", -1, reset=True)
    to_c = []
    for t in range(2, 40, 2):
        out = r.handle(ClientAppend(t, 1, 10, Ack.APPLIED), t)
        out += r.handle(LocalFlushed(t // 2), t)
        out += ack(r, "b", t // 2 - 1, now=t)
        assert of(out, Apply) == [Apply(t // 2 - 1)]
        to_c += [a for a in of(out, SendEntries) if a.dst == "c"]
    assert to_c == []  # c was beaten at 0; the next beat is due at 50
    out = r.handle(Tick(), 50)
    assert [a for a in of(out, SendEntries) if a.dst == "c"] == [SendEntries("c", 1, 19, 19, 18)]
