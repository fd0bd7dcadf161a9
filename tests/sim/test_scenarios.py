"""Named regression scenarios: scripted schedules of the simulator, each deterministic.

Every scenario runs with all safety invariants checked after every step (see
``tests/sim/sim.py``), then asserts its own expected outcome and, after
healing, liveness. Several also run a mutant replica that breaks the rule the
scenario is about, and expect the simulator to catch it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from replog import election
from replog.election import leaderless_reason
from replog.eligibility import unsure_of
from replog.messages import (
    STORAGE_LOST,
    Ack,
    EpochRequest,
    EpochResponse,
    Replicate,
    ReplicateAck,
    ResignRequested,
    Role,
)
from replog.replica import Replica
from tests.sim.membership import PlanRules, Reassigner
from tests.sim.mutants import (
    AppliesWhileCopiesRetired,
    CountsRemovingTowardMinIsr,
    DeletesAtCompletion,
    DropsEarlyResetAcks,
    ElectsUnsureAtOnce,
    HandOffWithoutCatchUp,
    KeepsWhatAnUnsureFollowerAcked,
    ReasksOnlyAfterTheTimeout,
    SingleRoundEpochExchange,
    TruncateToHighWatermark,
    up_to_date_without_waiting,
)
from tests.sim.sim import ClientRequest, InvariantViolation, Sim, sim_config


def scripted(nodes: int, replica_cls: type[Replica] = Replica, **config: int) -> Sim:
    sim = Sim(7, nodes=nodes, config=sim_config(nodes, **config), replica_cls=replica_cls, trace=True)
    sim.auto_elect = False
    sim.start()
    sim.run_until_true(lambda: all(n.replica.registered for n in sim.nodes.values()))  # storage recorded
    return sim


def durable(sim: Sim, nid: str) -> list[tuple[int, str]]:
    d = sim.nodes[nid].disk
    return d.entries[:d.durable_end]


# ------------------------------------------------------------------------------------------------ KIP-101


def kip101_fast_failover(replica_cls: type[Replica]) -> Sim:
    """KIP-101 scenario 1: a follower holds an applied entry but not the news that it was applied
    (its high watermark is stale). It restarts; the leader fails right after. Truncating to the
    high watermark on restart would lose the entry; truncating by epoch keeps it."""
    sim = scripted(2, replica_cls, min_isr=1)
    sim.elect("a")
    sim.run_for(20)
    sim.append(1, Ack.APPLIED)
    sim.run_for(30)
    b = sim.nodes["b"]
    m2 = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: b.disk.durable_end == 2)
    sim.cut_link("a", "b")  # b will not hear the new apply offset
    sim.run_until_true(lambda: m2.outcome == "ok")
    assert b.replica.apply_offset == 0 and b.disk.durable_end == 2  # holds m2, believes HW is 0
    sim.crash("b")
    sim.heal()
    sim.restart("b")
    sim.run_until_true(lambda: b.replica.reconciled)
    sim.crash("a")  # fast failover: before b learns anything more
    sim.elect("b")
    sim.run_until_true(lambda: b.replica.is_leader)
    assert durable(sim, "b")[1] == (1, m2.payloads[0])
    return sim


def test_kip101_fast_failover_after_high_watermark_truncation() -> None:
    sim = kip101_fast_failover(Replica)
    after = sim.append(1, Ack.APPLIED)  # b shrinks the ISR to itself (min-ISR 1) and carries on
    sim.run_until_true(lambda: after.outcome == "ok")
    sim.heal_and_settle()


def test_kip101_fast_failover_catches_high_watermark_truncation() -> None:
    with pytest.raises(InvariantViolation, match="truncates to 1, below the committed end 2"):
        kip101_fast_failover(TruncateToHighWatermark)


def test_kip101_divergence_after_both_replicas_crash() -> None:
    """KIP-101 scenario 2: both replicas crash; the one that missed m2 comes back first and is
    elected, writing m3 at m2's offset. The other returns with m2 and must replace it by m3
    (its epoch 1 ends at offset 1 in the new leader's log), not keep a divergent log."""
    sim = scripted(2, min_isr=1)
    sim.elect("a")
    sim.run_for(20)
    m1 = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: m1.outcome == "ok")
    sim.cut_link("a", "b")
    m2 = sim.append(1, Ack.APPEND)
    sim.run_until_true(lambda: m2.outcome == "ok")
    sim.crash("a")
    sim.crash("b")
    sim.heal()
    sim.restart("b")
    sim.elect("b")
    sim.run_for(20)
    m3 = sim.append(1, Ack.NONE, to="b")
    sim.run_until_true(lambda: sim.nodes["b"].disk.durable_end == 2)
    sim.restart("a")
    sim.run_until_true(lambda: sim.nodes["a"].replica.reconciled and sim.nodes["a"].disk.durable_end == 2)
    assert durable(sim, "a") == [(1, m1.payloads[0]), (2, m3.payloads[0])]
    assert durable(sim, "a") == durable(sim, "b")
    sim.heal_and_settle()


# ------------------------------------------------------------------------------------------------ KIP-279


def kip279_rapid_leader_changes(replica_cls: type[Replica]) -> Sim:
    """Leadership alternates a, b, a, b through crashes, each leader writing in its own epoch, so
    the last follower's log differs from the leader's in two epochs. One round of the epoch
    exchange only removes the newest difference; KIP-279 iterates until the logs agree."""
    sim = scripted(2, replica_cls, min_isr=1, max_time_lag_ms=10_000)
    a, b = sim.nodes["a"], sim.nodes["b"]
    sim.elect("a")
    sim.run_for(20)
    x0 = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: x0.outcome == "ok")
    sim.crash("b")
    sim.append(1, Ack.NONE, to="a")  # x1 at offset 1, epoch 1
    sim.run_until_true(lambda: a.disk.durable_end == 2)
    sim.crash("a")
    sim.restart("b")
    sim.elect("b")  # epoch 2
    sim.run_until_true(lambda: b.replica.is_leader)
    y1 = sim.append(1, Ack.NONE, to="b")  # offset 1, epoch 2
    sim.run_until_true(lambda: b.disk.durable_end == 2)
    sim.crash("b")
    sim.restart("a")
    sim.elect("a")  # epoch 3
    sim.run_until_true(lambda: a.replica.is_leader)
    sim.append(1, Ack.NONE, to="a")  # z2 at offset 2, epoch 3
    sim.run_until_true(lambda: a.disk.durable_end == 3)
    sim.crash("a")
    sim.restart("b")
    sim.elect("b")  # epoch 4
    sim.run_until_true(lambda: b.replica.is_leader)
    w2 = sim.append(1, Ack.NONE, to="b")  # offset 2, epoch 4
    sim.run_until_true(lambda: b.disk.durable_end == 3)
    asked_before = len([m for _, _, m in sim.sent if isinstance(m, EpochRequest) and m.src == "a"])
    sim.restart("a")
    sim.run_until_true(lambda: a.replica.reconciled)
    asked = [m.requested_epoch for _, _, m in sim.sent if isinstance(m, EpochRequest) and m.src == "a"]
    sim.run_until_true(lambda: a.disk.durable_end == 3 and a.replica.applied == 2)
    assert durable(sim, "a") == [(1, x0.payloads[0]), (2, y1.payloads[0]), (4, w2.payloads[0])]
    assert asked[asked_before:] == [3, 1]  # two rounds: epoch 3, then epoch 1
    return sim


def test_kip279_rapid_leader_changes() -> None:
    kip279_rapid_leader_changes(Replica).heal_and_settle()


def test_kip279_catches_single_round_exchange() -> None:
    with pytest.raises(InvariantViolation, match="ISR member a holds"):
        kip279_rapid_leader_changes(SingleRoundEpochExchange)


def test_deposed_leader_with_empty_epoch_reconciles() -> None:
    """Found by seed 430: a replica elected and deposed before writing anything keeps
    ``(epoch, log end)`` in its cache. That epoch has no entries; the exchange must drop it
    or it never agrees with the new leader and the replica never follows again."""
    sim = scripted(3)
    b = sim.nodes["b"]
    sim.elect("a")
    sim.run_for(20)
    r = sim.append(2, Ack.APPLIED)
    sim.run_until_true(lambda: r.outcome == "ok")
    sim.expire_session("a", notify_after_ms=1)
    sim.elect("b")
    sim.run_until_true(lambda: b.replica.is_leader)
    assert b.replica.epochs.to_pairs()[-1] == (2, 2)  # empty epoch at the log end
    sim.expire_session("b", notify_after_ms=1)
    sim.run_for(5)
    sim.elect("c")
    sim.run_until_true(lambda: b.replica.reconciled and b.replica.leader == "c", max_ms=500)
    assert b.replica.epochs.to_pairs() == [(1, 0)]
    sim.heal_and_settle()


# ------------------------------------------------------------------------------------------------ ISR


def test_isr_shrink_racing_a_commit() -> None:
    """A lagging ISR member is removed by a slow CAS while an append waits to be applied: the
    leader must not apply it by the shrunk ISR before the metastore has the shrunk ISR (the
    checker fails on any entry applied while a znode-ISR member lacks it)."""
    sim = scripted(3, min_isr=2)
    sim.metastore_ms = (80, 80)
    sim.elect("a")
    sim.run_for(200)
    r0 = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: r0.outcome == "ok")
    sim.isolate("c")
    r1 = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: r1.outcome != "pending")
    assert r1.outcome == "ok"
    assert "c" not in sim.znode.isr and "c" in sim.znode.osr
    # c comes back, catches up and rejoins (again a CAS first).
    sim.heal()
    sim.run_until_true(lambda: "c" in sim.znode.isr, max_ms=1_000)
    sim.heal_and_settle()


def test_isr_shrink_cas_lost_to_an_election() -> None:
    """The shrink CAS races the controller deposing the leader: the CAS fails (session expired),
    so the waiting append is never applied by the shrunk ISR and fails with NotLeader; the new
    leader still counts the lagging member until it removes it itself."""
    sim = scripted(3, min_isr=2)
    sim.metastore_ms = (40, 40)
    sim.elect("a")
    sim.run_for(200)
    sim.isolate("c")
    r1 = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: sim.nodes["a"].replica._ls is not None
                       and sim.nodes["a"].replica._ls.pending_change is not None, max_ms=1_000)
    sim.expire_session("a", notify_after_ms=60)
    sim.elect("b")
    sim.run_until_true(lambda: r1.outcome != "pending")
    assert r1.outcome == "NotLeader"
    assert "c" in sim.znode.isr or sim.znode.leader == "b"
    sim.heal_and_settle()


def test_zombie_leader_after_session_expiry() -> None:
    """The leader's session expires but it hears of it late: meanwhile it still takes appends.
    None may be acknowledged as applied (the new leader's ISR drops its messages), and once it
    hears, it fails the waiting clients and truncates its zombie entries as a follower."""
    sim = scripted(3)
    a = sim.nodes["a"]
    sim.elect("a")
    sim.run_for(20)
    r0 = sim.append(2, Ack.APPLIED)
    sim.run_until_true(lambda: r0.outcome == "ok")
    sim.expire_session("a", notify_after_ms=300)
    sim.cut_link("b", "a")  # a frame of epoch 2 would tell a at once; keep it a zombie
    sim.elect("b")
    sim.run_for(20)
    zombie = [sim.append(1, ack, to="a") for ack in (Ack.APPLIED, Ack.APPEND, Ack.APPLIED)]
    fresh = sim.append(1, Ack.APPLIED, to="b")
    sim.run_for(250)
    assert a.replica.is_leader  # still a zombie: has not heard
    assert fresh.outcome == "ok"
    assert zombie[0].outcome == zombie[2].outcome == "pending"
    assert zombie[1].outcome == "ok"  # ack=append: durable on the zombie only, may be lost
    sim.run_until_true(lambda: not a.replica.is_leader)
    assert zombie[0].outcome == zombie[2].outcome == "NotLeader"
    sim.heal()
    sim.run_until_true(lambda: a.replica.reconciled and a.disk.durable_end == 3, max_ms=500)
    assert durable(sim, "a") == durable(sim, "b")
    assert all(p not in {x for _, x in durable(sim, "a")} for z in zombie for p in z.payloads)
    sim.heal_and_settle()


def test_delayed_messages_from_an_old_epoch_are_dropped() -> None:
    """Frames, acks and epoch answers of epoch 1 arrive after epoch 2 started: all are dropped."""
    sim = scripted(3)
    c = sim.nodes["c"]
    sim.elect("a")
    sim.run_for(20)
    r0 = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: r0.outcome == "ok")
    sim.cut_link("a", "b")
    sim.cut_link("a", "c")
    old = sim.append(1, Ack.NONE)
    sim.run_until_true(lambda: any(isinstance(m, Replicate) and m.dst == "c" and m.entry_epochs
                                   and m.start == 1 for _, _, m in sim.sent))
    stale = next(m for _, _, m in sim.sent
                 if isinstance(m, Replicate) and m.dst == "c" and m.entry_epochs and m.start == 1)
    assert stale.data == old.payloads
    sim.crash("a")
    sim.heal()
    sim.elect("b")
    sim.run_until_true(lambda: sim.nodes["b"].replica.accepts_appends)
    new = sim.append(1, Ack.APPLIED, to="b")
    sim.run_until_true(lambda: new.outcome == "ok" and c.replica.applied == 1)
    before = list(c.disk.entries)
    sim.inject("c", stale)
    sim.inject("b", ReplicateAck("c", "b", 1, 5, 6))
    sim.inject("c", EpochResponse("b", "c", 1, 1, 1, 0))
    sim.run_for(50)
    assert c.disk.entries[:2] == before[:2] == [(1, r0.payloads[0]), (2, new.payloads[0])]
    sim.heal_and_settle()


def test_last_isr_member_loses_its_unflushed_tail() -> None:
    """ISR = {a} (b lagged out). a's disk is slow; b, catching up as OSR, holds entries a has not
    flushed. a crashes and loses them, comes back as the only electable replica, and writes new
    entries at those offsets: b must drop what a lost (it was never applied), nothing applied
    may be lost, and acknowledged-appended entries survive."""
    sim = scripted(2, min_isr=1)
    a, b = sim.nodes["a"], sim.nodes["b"]
    sim.elect("a")
    sim.run_for(20)
    r0 = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: r0.outcome == "ok")
    sim.isolate("b")
    r1 = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: r1.outcome == "ok", max_ms=1_000)
    assert sim.znode.isr == ("a",)
    appended = sim.append(1, Ack.APPEND)
    sim.run_until_true(lambda: appended.outcome == "ok")
    sim.metastore_ms = (400, 400)  # b may not rejoin before the crash
    a.flush_ms = 500
    sim.heal()
    lost = [sim.append(1, Ack.NONE) for _ in range(3)]
    sim.run_until_true(lambda: b.disk.durable_end == 6)
    assert a.disk.durable_end == 3
    sim.crash("a")
    sim.metastore_ms = (1, 5)
    a.flush_ms = 2
    sim.restart("a")
    # Its marks claimed the flush the crash cut: a is unsure of its log (replog.eligibility), registers it in
    # the leaderless epoch its registration starts, and is elected as the most up-to-date (the only) ISR member.
    sim.run_until_true(lambda: a.replica.registered and sim.znode.leader is None)
    assert sim.znode.unsure == (("a", 1, 3, sim.znode.epoch),)
    sim.elect("a")
    sim.run_until_true(lambda: a.replica.is_leader)
    after = sim.append(1, Ack.APPLIED, to="a")
    sim.run_until_true(lambda: after.outcome == "ok" and b.replica.applied == 3, max_ms=1_000)
    assert durable(sim, "b") == durable(sim, "a")
    assert [p for _, p in durable(sim, "a")] == [*r0.payloads, *r1.payloads, *appended.payloads,
                                                  *after.payloads]
    assert all(req.outcome == "ok" for req in lost)  # ack=none promised nothing
    sim.heal_and_settle()


# ------------------------------------------------------------------------------------------------ retention


def test_follower_behind_the_retained_log_catches_up_by_far_horizon() -> None:
    """A follower is cut off while the leader appends far past the near-horizon window and deletes
    segments below it. Entries it needs are gone, so it must install a checkpoint (not replay),
    and then hold exactly the committed log; the leader never sends entries below its log start."""
    sim = scripted(3, max_time_lag_ms=60)
    sim.retention = True
    sim.elect("a")
    sim.run_for(30)
    sim.isolate("c")
    for _ in range(60):
        sim.append(3, Ack.APPLIED)
        sim.run_for(4)
    a, c = sim.nodes["a"], sim.nodes["c"]
    sim.run_until_true(lambda: "c" in sim.znode.osr and a.disk.start > c.replica.log_end)
    before = c.replica.log_end
    sim.heal()
    sim.run_until_true(lambda: c.disk.start > before and c.replica.reconciled)
    assert c.disk.start > 0 and c.disk.applied >= c.disk.start - 1  # installed, not replayed
    sim.run_until_true(lambda: "c" in sim.znode.isr, max_ms=3_000)
    sim.run_for(200)
    sim.check_liveness()
    assert all(r.outcome == "ok" for r in sim.requests.values())


# ------------------------------------------------------------------------------------------------ hand-off


def hand_off_under_load(replica_cls: type[Replica]) -> tuple[Sim, list[ClientRequest]]:
    """Clients append every 2 ms (ack=applied) to whoever the metastore names; mid-stream the balancer
    asks leader a to hand off to b. Refused appends are retried, as the client does on NotLeader."""
    sim = scripted(3, replica_cls)
    sim.elect("a")
    sim.run_for(20)
    a = sim.nodes["a"]
    stale = ResignRequested("c", sim.nodes["c"].session, epoch=0)
    sim.inject("a", stale)  # a request of an older epoch is ignored
    sim.run_for(5)
    assert a.replica.resigning_to is None
    reqs: list[ClientRequest] = []
    for i in range(150):
        reqs.append(sim.append(2, Ack.APPLIED))
        if i == 60:
            sim.request_resign("b")
        sim.run_for(2)
        for r in [r for r in reqs if r.outcome == "NotLeader"]:
            r.outcome = "retried"
            reqs.append(sim.append(2, Ack.APPLIED))
    sim.run_until_true(lambda: all(r.outcome in ("ok", "retried") for r in reqs)
                       and not any(r.outcome == "NotLeader" for r in reqs), max_ms=1_000)
    return sim, reqs


def test_hand_off_under_load_loses_and_fails_nothing() -> None:
    sim, reqs = hand_off_under_load(Replica)
    assert sim.hand_offs == 1 and sim.znode.leader == "b" and sim.znode.epoch == 2
    assert sim.znode.isr == ("a", "b", "c"), "a hand-off is not a failover: the old leader stays in sync"
    assert sim.resign_request is None
    refused = [r for r in reqs if r.outcome == "retried"]
    assert refused, "appends arriving while a resigns must be refused (and retried)"
    assert all(r.first == -1 for r in refused), "only appends refused on arrival may fail, never accepted ones"
    assert sum(r.outcome == "ok" for r in reqs) == 150  # every original append, directly or by its retry
    sim.heal_and_settle()  # every acknowledged append is applied on every replica


def test_hand_off_before_catch_up_is_caught() -> None:
    with pytest.raises(AssertionError, match="hands off"):
        hand_off_under_load(HandOffWithoutCatchUp)


def test_hand_off_to_a_follower_leaving_the_isr_is_given_up() -> None:
    """b is cut off just as a resigns to it: b leaves the ISR, a gives up and takes appends again."""
    sim = scripted(3, min_isr=2)
    sim.elect("a")
    sim.run_for(20)
    sim.append(1, Ack.APPLIED)
    sim.isolate("b")
    pending = sim.append(1, Ack.APPLIED)  # b never acks it, so a cannot hand off
    sim.run_for(5)
    sim.request_resign("b")
    sim.run_until_true(lambda: sim.nodes["a"].replica.resigning_to == "b")
    refused = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: refused.outcome == "NotLeader")
    sim.run_until_true(lambda: sim.znode.isr == ("a", "c") and sim.nodes["a"].replica.resigning_to is None)
    assert pending.outcome == "ok" and sim.znode.leader == "a" and sim.hand_offs == 0
    after = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: after.outcome == "ok")
    sim.heal_and_settle()


SLOW_WATCH_REQUEST_TIMEOUT_MS = 200


def hand_off_to_a_successor_with_a_slow_watch(replica_cls: type[Replica]) -> int:
    """a hands off to b, whose watch fires late: a (from its own CAS) and c ask b for their epoch's end before
    b knows it leads, and b drops the questions. The ms from the hand-off's znode to the first append through
    b being applied (the request timeout is 200 ms here, well above the network's delays)."""
    sim = scripted(3, replica_cls, request_timeout_ms=SLOW_WATCH_REQUEST_TIMEOUT_MS)
    sim.elect("a")
    first = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: first.outcome == "ok")
    sim.watch_lag_ms["b"] = 10  # a few network delays
    sim.request_resign("b")
    sim.run_until_true(lambda: sim.hand_offs == 1)
    handed = sim.now
    sim.run_until_true(lambda: sim.nodes["b"].replica.is_leader)
    after = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: after.outcome == "ok", max_ms=10 * SLOW_WATCH_REQUEST_TIMEOUT_MS)
    waited = sim.now - handed
    sim.heal_and_settle()
    return waited


def test_a_hand_off_does_not_wait_for_the_request_timeout() -> None:
    """The followers re-ask on the new leader's first frame of the epoch (replog.replica_follower._reask_epoch_end),
    so the new leader applies within a few network delays, not after replication.request.timeout.millis."""
    assert hand_off_to_a_successor_with_a_slow_watch(Replica) < SLOW_WATCH_REQUEST_TIMEOUT_MS // 4


def test_re_asking_only_after_the_timeout_is_caught() -> None:
    assert hand_off_to_a_successor_with_a_slow_watch(ReasksOnlyAfterTheTimeout) >= SLOW_WATCH_REQUEST_TIMEOUT_MS


# ------------------------------------------------------------------------------------------------ live options


def test_min_isr_changed_live_unstalls_and_stalls_the_group() -> None:
    """`conductor set-option replication.min.isr`: with two of three replicas cut off the group stalls at
    min-ISR 2; lowering it to 1 lets the leader shrink the ISR and apply alone; raising it to 3 stalls
    the group again (nothing is applied with fewer copies). Once the followers return they install a
    checkpoint of what was applied alone, then must *replay* the stalled entries (a checkpoint of a
    stalled group skips nothing: offering it again forever was a livelock), rejoin, and it resumes."""
    from dataclasses import replace

    sim = scripted(3, min_isr=2, max_time_lag_ms=60, max_near_sync_message_lag=10)
    sim.elect("a")
    sim.run_for(30)
    a = sim.nodes["a"]
    first = sim.append(2, Ack.APPLIED)
    sim.run_until_true(lambda: first.outcome == "ok")
    sim.isolate("b")
    sim.isolate("c")
    stalled = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: stalled.outcome != "pending", max_ms=1_000)
    assert stalled.outcome == "StalledGroup" and len(sim.znode.isr) >= 2  # never below min-ISR 2
    applied = a.replica.applied

    sim.set_config(replace(sim.config, min_isr=1))
    alone = [sim.append(1, Ack.APPLIED) for _ in range(15)]
    sim.run_until_true(lambda: all(r.outcome != "pending" for r in alone), max_ms=1_000)
    assert all(r.outcome == "ok" for r in alone) and sim.znode.isr == ("a",) and a.replica.applied > applied

    sim.set_config(replace(sim.config, min_isr=3))
    sim.run_for(10)
    applied = a.replica.applied
    for _ in range(15):
        sim.append(1, Ack.APPLIED)
        sim.run_for(2)
    sim.run_for(60)
    assert a.replica.applied == applied and a.replica.log_end > applied + 12  # stalled: one copy, min-ISR 3

    sim.heal()
    sim.run_until_true(lambda: set(sim.znode.isr) == {"a", "b", "c"} and a.replica.applied == a.replica.log_end - 1,
                       max_ms=3_000)
    assert sim.nodes["b"].disk.start > 0 or sim.nodes["c"].disk.start > 0  # a checkpoint was installed
    sim.run_for(200)
    sim.check_liveness()


def test_options_set_while_the_session_is_down_arrive_with_the_new_session() -> None:
    """`set-option` while the leader's session is expired: the module watch died with the session, so the
    leader hears the options only when the driver re-reads the module znode on its new session (the
    worker's kazoo DataWatch does on reconnect). Seed 7804's leader never did, kept max-inflight 8 and
    replayed a follower too slowly to catch up within the quiet period."""
    from dataclasses import replace

    sim = scripted(3, max_inflight_entries=8)
    sim.elect("a")
    sim.run_for(30)
    a = sim.nodes["a"]
    sim.expire_session("a", notify_after_ms=100)
    sim.set_config(replace(sim.config, max_inflight_entries=60))
    sim.run_for(50)
    assert a.replica.config.max_inflight_entries == 8  # not heard: no watch without a session
    sim.run_until_true(lambda: a.replica.session == a.session and a.replica.config == sim.config, max_ms=200)
    sim.elect("b")
    sim.heal_and_settle()


def test_far_horizon_install_while_the_session_is_down_keeps_the_new_session() -> None:
    """A deposed leader hears of its session's expiry late; meanwhile it follows the new leader and installs a
    far-horizon checkpoint, which rebuilds the replica but not the process: the new session still comes, and
    the replica records its storage under it (so it is electable again)."""
    sim = scripted(3, max_time_lag_ms=60)
    sim.retention = True
    sim.elect("a")
    sim.run_for(30)
    a, b = sim.nodes["a"], sim.nodes["b"]
    sim.expire_session("a", notify_after_ms=800)
    sim.isolate("a")
    sim.elect("b")
    for _ in range(60):
        sim.append(3, Ack.APPLIED)
        sim.run_for(4)
    sim.run_until_true(lambda: "a" in sim.znode.osr and b.disk.start > a.replica.log_end)
    rebuilt = a.incarnation
    sim.heal()
    sim.run_until_true(lambda: a.incarnation != rebuilt)  # installed a checkpoint
    assert not a.session_live
    sim.run_until_true(lambda: a.session_live and sim.znode.storage_session("a") == a.session, max_ms=1_000)
    sim.heal_and_settle()


# ------------------------------------------------------------------------------------------------ storage faults


def test_last_isr_member_losing_its_disk_stalls_the_group_and_says_why() -> None:
    """With min-ISR 1 the ISR shrank to the leader alone; its disk is then replaced. It must not be
    elected again empty (nor may the OSR members, which lack applied entries): it marks its storage
    lost and the group stalls with a reason, instead of electing an empty replica."""
    sim = scripted(3, min_isr=1)
    sim.elect("a")
    first = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: first.outcome == "ok")
    sim.crash("b")
    sim.crash("c")
    second = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: second.outcome == "ok" and sim.znode.isr == ("a",))
    sim.lose_disk("a", restart_after_ms=5)
    sim.restart("b")
    sim.restart("c")
    sim.auto_elect = True
    sim.run_for(1_000)
    z = sim.znode
    assert z.leader is None and z.isr == ("a",) and z.incarnation_of("a") == STORAGE_LOST
    reason = leaderless_reason(z, {m: n.session for m, n in sim.nodes.items()})
    assert reason is not None and "no intact in-sync replica" in reason and "['a']" in reason


def test_emptied_follower_leaves_the_isr_then_rebuilds_and_rejoins() -> None:
    """A follower's disk is replaced while it is in the ISR: it leaves the ISR before acknowledging
    anything (the leader meanwhile counts none of its acks), catches up and is re-admitted."""
    sim = scripted(3, min_isr=2)
    sim.elect("a")
    for _ in range(5):
        sim.append(3, Ack.APPLIED)
    sim.run_for(100)
    sim.lose_disk("b", restart_after_ms=20)
    sim.run_until_true(lambda: "b" in sim.znode.osr)
    assert sim.znode.incarnation_of("b") == sim.nodes["b"].disk.incarnation
    sim.append(2, Ack.APPLIED)
    sim.run_until_true(lambda: "b" in sim.znode.isr, max_ms=1_000)
    sim.heal_and_settle()


def test_restarted_follower_is_not_flooded_by_the_beats_queued_while_it_was_down() -> None:
    """Fault campaign seed 2016: a follower's disk was emptied; while it was down the leader kept beating it
    (one beat per apply-offset advance, queued by the real transport until it was back). Each of those beats,
    past the end of its empty log, got a reset ack, and each reset ack made the leader resend its whole window
    from the follower's end: tens of seconds of duplicate windows before the follower rejoined the ISR. Now a
    gap asks for a resend at most once per request timeout, and the follower rejoins at once."""
    sim = scripted(3, min_isr=2)
    sim.elect("a")
    for _ in range(5):
        sim.append(3, Ack.APPLIED)
    sim.run_for(100)
    sim.crash("c")
    down = sim.now
    for _ in range(20):  # c misses these; the leader beats it after each apply
        sim.append(2, Ack.APPLIED)
        sim.run_for(5)
    sim.run_until_true(lambda: sim.znode.isr == ("a", "b"))
    sim.run_for(100)
    queued = [m for t, dst, m in sim.sent if t >= down and dst == "c" and isinstance(m, Replicate)]
    assert len(queued) >= 20
    c = sim.nodes["c"]
    sim.lose_disk("c", restart_after_ms=1)
    sim.run_until_true(lambda: c.alive and c.replica.log_end == 0 and c.replica.reconciled)
    back = sim.now
    for m in queued:  # the transport's backlog arrives before the leader's resend from c's end
        sim.inject("c", m)
    sim.run_until_true(lambda: "c" in sim.znode.isr, max_ms=500)
    resets = [m for t, dst, m in sim.sent if t >= back and dst == "a" and isinstance(m, ReplicateAck)
              and m.src == "c" and m.reset]
    assert len(resets) <= 2, resets  # one per queued beat (over 20) before the fix
    sim.heal_and_settle()


# ------------------------------------------------------------------------------------------------ membership


def membership_sim(nodes: int, spares: int, replica_cls: type[Replica] = Replica,
                   **config: int) -> tuple[Sim, Reassigner]:
    """A group of ``nodes`` replicas led by a, ``spares`` more workers, and the conductor's reassignment loop."""
    sim = Sim(7, nodes=nodes, spares=spares, config=sim_config(nodes, **config), replica_cls=replica_cls,
              trace=True)
    sim.auto_elect = False
    sim.start()
    sim.run_until_true(lambda: all(sim.nodes[m].replica.registered for m in sim.znode.replicas))
    sim.elect("a")
    sim.run_until_true(lambda: sim.nodes["a"].replica.is_leader)
    sim.auto_elect = True  # failovers as the conductor does them
    return sim, Reassigner(sim, random.Random(1))


def write_until(sim: Sim, done: Callable[[], bool], reqs: list[ClientRequest], max_ms: int = 3_000,
                settle: bool = True) -> None:
    """A writer appending (ack=applied) every 3 ms to the leader the metastore names, retrying refused appends
    (NotLeader, as the client does) until ``done()``; then (``settle``) every accepted append must be answered
    ok."""
    deadline = sim.now + max_ms
    while not done():
        if sim.now > deadline:
            sim.fail(f"not done within {max_ms} ms: {sim.znode}")
        reqs.append(sim.append(1, Ack.APPLIED))
        sim.run_for(3)
        for r in [r for r in reqs if r.outcome != "ok" and r.outcome != "pending" and r.first == -1]:
            r.outcome = "retried"
            reqs.append(sim.append(1, Ack.APPLIED))
    if settle:
        sim.run_until_true(lambda: all(r.outcome in ("ok", "retried") for r in reqs), max_ms=1_000)


def plan_done(sim: Sim, re: Reassigner) -> Callable[[], bool]:
    """The plan ended and the copies it retired are released (or taken back)."""
    return lambda: re.completed + re.cancelled > 0 and not sim.znode.reassigning and not sim.znode.retired


def test_rf_1_to_3_while_writing_fails_no_append() -> None:
    sim, re = membership_sim(1, 2)
    sim.retention = True  # a deletes what it applied beyond the near-horizon window: b and c need far horizon
    reqs: list[ClientRequest] = []
    write_until(sim, lambda: sim.nodes["a"].disk.start > 0, reqs)
    assert re.start(["a", "b", "c"])
    write_until(sim, plan_done(sim, re), reqs)
    z = sim.znode
    assert set(z.replicas) == set(z.isr) == {"a", "b", "c"} and z.leader == "a"
    assert sim.nodes["a"].replica.min_isr == 2  # min-ISR's default follows the new replication factor
    assert any("b installs a checkpoint" in line for line in sim.log)
    write_until(sim, lambda: len(reqs) > 200, reqs)
    sim.heal_and_settle()  # every replica holds and applied the same log


SLOW_LEADER_WATCH_REQUEST_TIMEOUT_MS = 200


def replica_added_under_a_slow_leader_watch(replica_cls: type[Replica]) -> int:
    """RF 1 to 2 while the leader's watch lags a few network delays: b records its storage (its own CAS tells it
    at once), follows, and sends its reset ack, which reaches a before the znode recording b's storage does.
    The ms from b following to a counting it as reconciled (the request timeout is 200 ms here)."""
    sim, re = membership_sim(1, 1, replica_cls, request_timeout_ms=SLOW_LEADER_WATCH_REQUEST_TIMEOUT_MS)
    sim.retention = True  # a's log starts past offset 0: its beats tell b frames went missing
    reqs: list[ClientRequest] = []
    write_until(sim, lambda: sim.nodes["a"].disk.start > 0, reqs)
    sim.watch_lag_ms["a"] = 10
    b = sim.nodes["b"]
    assert re.start(["a", "b"])
    sim.run_until_true(lambda: b.hosting and b.replica.role is Role.FOLLOWER and b.replica.reconciled)
    followed = sim.now

    def counted() -> bool:
        ls = sim.nodes["a"].replica._ls
        return ls is not None and "b" in ls.peers and ls.peers["b"].reconciled

    sim.run_until_true(counted, max_ms=10 * SLOW_LEADER_WATCH_REQUEST_TIMEOUT_MS)
    waited = sim.now - followed
    write_until(sim, plan_done(sim, re), reqs)
    assert set(sim.znode.isr) == {"a", "b"}
    sim.heal_and_settle()
    return waited


def test_an_added_replica_does_not_wait_for_the_request_timeout() -> None:
    """The leader keeps a reset ack that came before its storage's record and takes it when the record comes
    (replog.replica_leader._adopt_znode), so it offers the new replica what it lacks within a few network
    delays, not after replication.request.timeout.millis."""
    assert replica_added_under_a_slow_leader_watch(Replica) < SLOW_LEADER_WATCH_REQUEST_TIMEOUT_MS // 4


def test_dropping_early_reset_acks_is_caught() -> None:
    assert replica_added_under_a_slow_leader_watch(DropsEarlyResetAcks) >= SLOW_LEADER_WATCH_REQUEST_TIMEOUT_MS


def test_rf_3_to_5_and_back_to_3() -> None:
    sim, re = membership_sim(3, 2)
    reqs: list[ClientRequest] = []
    assert re.start(["a", "b", "c", "d", "e"])
    write_until(sim, plan_done(sim, re), reqs)
    assert set(sim.znode.isr) == {"a", "b", "c", "d", "e"} and sim.nodes["a"].replica.min_isr == 4
    assert re.start(["a", "d", "e"])
    write_until(sim, lambda: re.completed == 2 and not sim.znode.reassigning and not sim.znode.retired, reqs)
    assert set(sim.znode.replicas) == {"a", "d", "e"}
    for m in "bc":
        assert not sim.nodes[m].hosting and sim.nodes[m].disk.entries == []
    sim.heal_and_settle()


def test_rf_3_to_2_deletes_the_removed_replicas_data() -> None:
    sim, re = membership_sim(3, 0)
    reqs: list[ClientRequest] = []
    write_until(sim, lambda: len(reqs) > 30, reqs)
    assert sim.nodes["c"].disk.entries
    assert re.start(["a", "b"])
    write_until(sim, plan_done(sim, re), reqs)
    sim.run_until_true(lambda: not sim.nodes["c"].hosting)
    assert sim.nodes["c"].disk.entries == [] and sim.nodes["a"].replica.min_isr == 1
    assert set(sim.nodes["a"].replica.follower_offsets()) == {"b"}
    assert any("c is removed" in line for line in sim.log)
    sim.heal_and_settle()


def test_replacing_the_leader_hands_off_first_and_fails_no_accepted_append() -> None:
    sim, re = membership_sim(3, 1)
    reqs: list[ClientRequest] = []
    assert re.start(["b", "c", "d"])
    write_until(sim, plan_done(sim, re), reqs)
    assert sim.hand_offs == 1 and set(sim.znode.replicas) == {"b", "c", "d"} and sim.znode.leader in ("b", "c", "d")
    assert all(r.outcome in ("ok", "retried") for r in reqs)
    assert all(r.first == -1 for r in reqs if r.outcome == "retried"), "only appends refused on arrival may fail"
    sim.heal_and_settle()


def test_leader_crash_in_the_middle_of_a_reassignment() -> None:
    """RF 3 -> 5; the leader crashes while d and e catch up: a failover, and the plan completes once the old
    leader is back in sync (it is a target replica). Nothing acknowledged is lost."""
    sim, re = membership_sim(3, 2)
    reqs: list[ClientRequest] = []
    assert re.start(["a", "b", "c", "d", "e"])
    write_until(sim, lambda: sim.znode.reassigning and len(reqs) > 20, reqs)
    sim.crash("a")  # (the appends it had accepted are never answered: a client retries them elsewhere)
    sim.at(sim.now + 150, sim.restart, "a")
    write_until(sim, plan_done(sim, re), reqs, settle=False)
    assert sim.znode.leader != "a" and set(sim.znode.isr) == {"a", "b", "c", "d", "e"}
    sim.heal_and_settle()


def test_a_removed_replica_that_keeps_talking_is_ignored_then_deletes_its_data() -> None:
    """c's session expires just before the plan removes it; it hears nothing of the removal for 300 ms and
    keeps acknowledging; the leader ignores it and sends it nothing. Its new session reads the znode: it says
    Removed and the driver deletes its data."""
    sim, re = membership_sim(3, 0)
    reqs: list[ClientRequest] = []
    write_until(sim, lambda: len(reqs) > 30, reqs)
    sim.expire_session("c", notify_after_ms=300)
    assert re.start(["a", "b"])
    write_until(sim, plan_done(sim, re), reqs)
    c = sim.nodes["c"]
    assert c.hosting and not c.replica.removed  # it has not heard yet
    a = sim.nodes["a"]
    sim.run_until_true(lambda: "c" not in a.replica.follower_offsets())
    sim.run_for(sim.config.heartbeat_interval_ms)  # (beats queued for c before the removal leave the outbox)
    sent_before = len(sim.sent)
    talk = ReplicateAck("c", "a", sim.znode.epoch, c.replica.held, c.replica.log_end, reset=True,
                        incarnation=c.disk.incarnation)
    sim.inject("a", talk)
    sim.inject("a", EpochRequest("c", "a", sim.znode.epoch, sim.znode.epoch))
    sim.run_for(10)
    assert "c" not in a.replica.follower_offsets()
    assert not [m for _, dst, m in sim.sent[sent_before:] if dst == "c"], "nothing is sent to a removed replica"
    sim.run_until_true(lambda: not c.hosting, max_ms=500)
    assert c.disk.entries == []
    sim.heal_and_settle()


def test_cancel_rolls_back_an_added_replica_that_joined_the_isr() -> None:
    sim, re = membership_sim(3, 2)
    reqs: list[ClientRequest] = []
    assert re.start(["a", "b", "c", "d", "e"])
    write_until(sim, lambda: "d" in sim.znode.isr or "e" in sim.znode.isr, reqs)
    re.cancel()
    write_until(sim, plan_done(sim, re), reqs)
    assert re.cancelled == 1 and set(sim.znode.replicas) == {"a", "b", "c"}
    sim.run_until_true(lambda: not sim.nodes["d"].hosting and not sim.nodes["e"].hosting)
    sim.heal_and_settle()


def replace_with_a_lagging_survivor(replica_cls: type[Replica]) -> Sim:
    """b is cut off and leaves the ISR (a, c: min-ISR 2); then c is to be replaced by d. Applying with a and c
    would need c's vote, and c's data is deleted at the end: the joint rule stalls the group until d has
    joined the ISR (a, d then meet the target's min-ISR)."""
    sim, re = membership_sim(3, 1, replica_cls, min_isr=2)
    reqs: list[ClientRequest] = []
    write_until(sim, lambda: len(reqs) > 20, reqs)
    sim.isolate("b")
    before = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: "b" not in sim.znode.isr and before.outcome == "ok")
    assert re.start(["a", "b", "d"])
    sim.cut_link("a", "d")  # d catches up once this heals (else it holds what c holds as soon as c does)
    sim.run_for(20)
    stalled = [sim.append(1, Ack.APPLIED) for _ in range(3)]
    sim.run_for(60)
    assert all(r.outcome == "pending" for r in stalled), "applied before d joined: c's vote was needed"
    sim.cut.discard(("a", "d"))
    sim.run_until_true(lambda: "d" in sim.znode.isr or any(r.outcome == "ok" for r in stalled))
    assert all(r.outcome == "pending" for r in stalled), "applied before d joined: c's vote was needed"
    sim.run_until_true(lambda: all(r.outcome == "ok" for r in stalled))
    sim.heal()
    write_until(sim, plan_done(sim, re), reqs)
    return sim


def test_joint_min_isr_does_not_count_a_removed_replica_for_the_target() -> None:
    sim = replace_with_a_lagging_survivor(Replica)
    assert set(sim.znode.replicas) == {"a", "b", "d"}
    sim.heal_and_settle()


def test_joint_min_isr_catches_counting_removed_replicas() -> None:
    with pytest.raises(InvariantViolation, match="deletes was needed"):
        replace_with_a_lagging_survivor(CountsRemovingTowardMinIsr)


# ------------------------------------------------------------------------------------------------ retired copies


def shrink_onto_a_replica_that_finds_damage(rules: type[PlanRules] = PlanRules, replica_cls: type[Replica] = Replica,
                                            before_confirmed: bool = False) -> Sim:
    """The window of replog.retirement: a plan shrinks (a, b) to b. b finds its applied entries damaged and reopens
    in place, same session, with a new storage; the conductor's completing write, computed from the znode that
    still records b's old storage under its live session, lands first. (``before_confirmed``: b finds the damage
    only after the completion landed, while b, leading alone, takes appends, before its reconfirmation lands.)
    a's copy, retired instead of deleted, is taken back once b records the loss, and nothing acknowledged is
    lost."""
    sim, _ = membership_sim(2, 0, replica_cls)
    reqs: list[ClientRequest] = []
    write_until(sim, lambda: len(reqs) > 30, reqs)

    def live() -> dict[str, int]:
        return {m: n.session for m, n in sim.nodes.items() if n.alive and n.session_live}

    sim._write_znode(rules.start(sim.znode, ["b"]))
    sim.request_resign("b")
    write_until(sim, lambda: sim.znode.leader == "b" and sim.nodes["b"].replica.is_leader, reqs)
    step = rules.advance(sim.znode, live(), ["b"])
    assert step.new is not None and not step.new.reassigning and set(step.new.replicas) == {"b"}, step
    if before_confirmed:
        sim._write_znode(step.new)
        sim.metastore_ms = (30, 30)  # b's reconfirmation, proposed when it reads that znode, takes 30 ms to land
        b = sim.nodes["b"].replica
        sim.run_until_true(lambda: b._ls is not None and bool(b._ls.retired))
        late = [sim.append(1, Ack.APPLIED) for _ in range(3)]
        sim.run_for(10)  # b holds them (flushed): a leader that applied them now would have acknowledged them
        assert replica_cls is not Replica or all(r.outcome == "pending" for r in late), [r.outcome for r in late]
        sim.find_corruption("b", 0)
        sim.metastore_ms = (1, 5)
    else:
        sim.find_corruption("b", 0)  # its RecordStorage is on its way
        sim._write_znode(step.new)  # the completion computed a moment before lands first
    for _ in range(30):  # the conductor's passes
        sim.run_for(10)
        if sim.znode.retired:
            step = rules.advance(sim.znode, live(), ["a", "b"])
            if step.new is not None:
                sim._write_znode(step.new)
    sim.heal_and_settle()
    return sim


@pytest.mark.parametrize("before_confirmed", [False, True], ids=["before-completion", "before-reconfirmation"])
def test_a_retired_copy_is_taken_back_when_the_kept_replica_lost_its_storage(before_confirmed: bool) -> None:
    sim = shrink_onto_a_replica_that_finds_damage(before_confirmed=before_confirmed)
    assert any("a is removed" in line and "keeps its data (retired)" in line for line in sim.log)
    assert any("a reopens its retired copy" in line for line in sim.log)
    assert set(sim.znode.replicas) == {"a", "b"} and sim.znode.leader == "a" and not sim.znode.reassigning


def test_deleting_at_completion_is_caught() -> None:
    """The rule before retired copies: the completion deletes a's copy, the last intact one."""
    with pytest.raises(InvariantViolation, match="no working leader after healing"):
        shrink_onto_a_replica_that_finds_damage(DeletesAtCompletion)


def test_applying_while_copies_are_retired_is_caught() -> None:
    """A leader applying before the retired copies are released: the copy taken back lacks what it applied."""
    with pytest.raises(InvariantViolation, match="lacks applied entry"):
        shrink_onto_a_replica_that_finds_damage(replica_cls=AppliesWhileCopiesRetired, before_confirmed=True)


def test_copies_are_released_once_the_kept_replicas_reconfirm() -> None:
    """RF 3 -> 2 with nothing wrong: c's copy is retired, kept until a and b record their storage again after
    the completing write (nothing is applied meanwhile), then deleted; appends go on."""
    sim, re = membership_sim(3, 0)
    reqs: list[ClientRequest] = []
    write_until(sim, lambda: len(reqs) > 20, reqs)
    assert re.start(["a", "b"])
    write_until(sim, lambda: bool(sim.znode.retired), reqs, settle=False)
    z = sim.znode
    assert [r[0] for r in z.retired] == ["c"] and set(z.reconfirming) == {"a", "b"}
    assert not re.start(["a", "b", "c"]), "no plan starts while copies are retired"
    write_until(sim, plan_done(sim, re), reqs)
    assert any("c deletes its retired copy" in line for line in sim.log) and sim.nodes["c"].disk.entries == []
    sim.heal_and_settle()


# ------------------------------------------------------------- unsure storage: the marks beside the log (issue 32)


def leads(sim: Sim) -> str | None:
    """The leader the znode names, if it is up and leading."""
    n = sim.nodes.get(sim.znode.leader or "")
    return n.id if n is not None and n.alive and n.replica.is_leader else None


def every_isr_member_loses_power(mutant: type[Sim] = Sim, lying: str | None = None, lying_back_first: bool = False,
                                 **config: int) -> tuple[Sim, list[ClientRequest]]:
    """ISR {a, b, c}, a leading: entries are applied, then the next ones are in flight on every disk (their marks
    claimed them) when every machine loses power at once. ``lying``: that replica's disk also drops the last
    flush it acknowledged, and (``lying_back_first``) it restarts well before the others."""
    sim = mutant(7, nodes=3, config=sim_config(3, **config), trace=True)
    sim.auto_elect = False
    sim.start()
    sim.run_until_true(lambda: all(n.replica.registered for n in sim.nodes.values()))
    sim.elect("a")
    applied = [sim.append(2, Ack.APPLIED) for _ in range(3)]
    sim.run_until_true(lambda: all(r.outcome == "ok" for r in applied))
    if lying is not None:
        sim.cut_link("a", lying)  # its last flush is the one it acknowledged: no later one claims more
    for n in sim.nodes.values():
        n.flush_ms = 40
    in_flight = [sim.append(1, Ack.APPLIED) for _ in range(2)]
    sim.run_for(15)  # the followers received them and started flushing
    for m in "abc":
        if m == lying:
            sim.lose_tail(m, 2, restart_after_ms=5 if lying_back_first else 60)
        else:
            sim.power_loss(m, restart_after_ms=(150 if lying_back_first else 60) + 10 * "abc".index(m))
    sim.heal()
    for n in sim.nodes.values():
        n.flush_ms = 2
    sim.auto_elect = True
    sim._elect_later(sim.session_timeout_ms)  # the conductor notices the leader's session is gone
    return sim, applied + in_flight


def test_every_isr_member_losing_power_during_a_flush_elects_the_most_up_to_date() -> None:
    """`always` mode survives a power loss of every ISR member at once without a stall: each comes back unsure
    (its marks claimed a flush the loss cut), registers its log in the leaderless epoch, and once all have the
    most up-to-date is elected; nothing applied is lost, every replica stays in the ISR."""
    sim, reqs = every_isr_member_loses_power()
    sim.run_for(100)  # all back
    sim.run_until_true(lambda: leads(sim), max_ms=1_000)
    assert sum("opens unsure storage" in line for line in sim.log) == 3
    assert set(sim.znode.isr) == {"a", "b", "c"} and STORAGE_LOST not in [r[1] for r in sim.znode.storage]
    sim.run_until_true(lambda: not sim.znode.unsure, max_ms=1_000)  # the leader vouched for the others
    sim.heal_and_settle()
    assert all(r.outcome == "ok" for r in reqs[:3])


def test_a_lying_disk_back_first_waits_for_the_witnesses() -> None:
    """Every machine loses power and b's disk also drops the flush it acknowledged (applied entries): b comes
    back first, unsure, and is not elected; once a and c registered their logs the most up-to-date of them is,
    and b catches up from it and is vouched for."""
    sim, reqs = every_isr_member_loses_power(lying="b", lying_back_first=True)
    z = lambda: sim.znode  # noqa: E731
    sim.run_until_true(lambda: z().leader is None and (unsure_of(z(), "b") or (0, 0, -1))[2] == z().epoch)
    assert not sim.nodes["a"].alive and not sim.nodes["c"].alive
    reason = leaderless_reason(sim.znode, {m: n.session for m, n in sim.nodes.items() if n.alive})
    assert reason is not None and "waiting for ['a', 'c']" in reason
    sim.run_until_true(lambda: leads(sim) in ("a", "c"), max_ms=1_000)
    assert any("b opens unsure storage" in line and "damaged" in line for line in sim.log)
    sim.run_until_true(lambda: not sim.znode.unsure and "b" in sim.znode.isr, max_ms=1_000)
    sim.heal_and_settle()
    assert all(r.outcome == "ok" for r in reqs[:3])


@pytest.mark.parametrize("how", ["at once", "without waiting"])
def test_electing_the_lying_disk_is_caught(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same with the election not waiting for the witnesses: b, back first, leads without what it lost."""
    mutant: type[Sim] = ElectsUnsureAtOnce if how == "at once" else Sim
    if how == "without waiting":
        monkeypatch.setattr(election, "most_up_to_date", up_to_date_without_waiting)
    with pytest.raises(InvariantViolation, match="lacks applied entry"):
        sim, _ = every_isr_member_loses_power(mutant, lying="b", lying_back_first=True)
        sim.run_for(500)


def unsure_follower(replica_cls: type[Replica] = Replica) -> tuple[Sim, ClientRequest]:
    """min-ISR 3. b acknowledged an entry c has not (a -> c is cut), then b's disk drops that flush: b comes back
    unsure, with a new incarnation. The entry must not be applied on b's old acknowledgement when c catches up."""
    sim = Sim(7, nodes=3, config=sim_config(3, min_isr=3), replica_cls=replica_cls, trace=True)
    sim.auto_elect = False
    sim.start()
    sim.run_until_true(lambda: all(n.replica.registered for n in sim.nodes.values()))
    sim.elect("a")
    first = sim.append(1, Ack.APPLIED)
    sim.run_until_true(lambda: first.outcome == "ok")
    sim.cut_link("a", "c")
    held = sim.append(1, Ack.APPLIED)
    b = sim.nodes["b"]
    sim.run_until_true(lambda: b.disk.durable_end == 2)
    sim.run_for(5)  # b's ack reached a
    sim.lose_tail("b", 1, restart_after_ms=5)
    sim.run_until_true(lambda: sim.znode.unsure != () and sim.nodes["b"].replica.registered)
    sim.cut_link("a", "b")  # b cannot fetch it again yet
    sim.heal_link("a", "c")
    sim.run_for(60)
    return sim, held


def test_an_unsure_follower_s_old_acks_do_not_count() -> None:
    sim, held = unsure_follower()
    assert held.outcome == "pending" and sim.nodes["c"].disk.durable_end == 2
    assert sim.znode.unsure[0][:3] == ("b", 1, 1)
    sim.heal()
    sim.run_until_true(lambda: held.outcome == "ok" and not sim.znode.unsure)
    sim.heal_and_settle()


def test_counting_an_unsure_follower_s_old_acks_is_caught() -> None:
    """A leader keeping what it knew of b: it vouches for b on b's old ack, of an entry b's disk dropped, and
    applies that entry without b."""
    with pytest.raises(InvariantViolation, match="applied while ISR member b holds None"):
        unsure_follower(KeepsWhatAnUnsureFollowerAcked)


def test_a_hand_off_to_an_unsure_follower_waits_for_its_catch_up() -> None:
    """The balancer asks a to hand leadership to b while b is unsure and behind: a hands off once b holds its
    whole log, and the hand-off write drops b's unsure record (the simulator checks b then holds every applied
    entry)."""
    sim, held = unsure_follower()
    sim.request_resign("b")
    sim.run_for(50)
    assert sim.znode.leader == "a"
    sim.heal()
    sim.run_until_true(lambda: sim.znode.leader == "b" and sim.nodes["b"].replica.is_leader)
    assert not sim.znode.unsure and held.outcome == "ok"
    sim.heal_and_settle()


def test_a_plan_keeps_its_retired_copies_until_an_unsure_replica_is_vouched_for() -> None:
    """RF 3 -> 2 while b is unsure of its log (its disk dropped the flush it acknowledged): c's copy is retired
    and kept; b's unsure registration does not reconfirm it, the leader's vouching does, then c's copy goes."""
    sim, re = membership_sim(3, 0)
    reqs: list[ClientRequest] = []
    write_until(sim, lambda: len(reqs) > 20, reqs)
    sim.cut_link("a", "b")
    write_until(sim, lambda: len(reqs) > 22, reqs, settle=False)
    sim.lose_tail("b", 1, restart_after_ms=5)
    sim.run_until_true(lambda: bool(sim.znode.unsure))
    assert re.start(["a", "b"])
    write_until(sim, lambda: bool(sim.znode.retired) or not sim.znode.reassigning, reqs, settle=False)
    sim.heal()
    write_until(sim, plan_done(sim, re), reqs)
    assert set(sim.znode.replicas) == {"a", "b"} and not sim.znode.unsure
    assert any("c is removed" in line and "keeps its data (retired)" in line for line in sim.log)
    sim.heal_and_settle()
