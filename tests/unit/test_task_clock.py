"""When an idle replica's task thread must wake: the state machine's next tick and the driver's wake-up policy."""

from __future__ import annotations

from conductor.worker.task_clock import MAX_SLEEP_MS, next_wake_ms
from replog.config import ReplicationConfig
from replog.messages import Ack, ClientAppend, GroupState, LocalFlushed, MetastoreChanged, ReplicateAck, Tick
from replog.replica import Replica

ISR3 = GroupState("a", 1, ("a", "b", "c"), (), 1, 1)


def leader() -> Replica:
    r = Replica("a", "g", ReplicationConfig(heartbeat_interval_ms=200), session=1)
    r.handle(MetastoreChanged(ISR3), 0)
    return r


def test_a_leader_with_unreconciled_followers_ticks_at_the_drivers_cadence() -> None:
    r = leader()
    assert r.next_tick_ms() == 0  # "now": followers have not answered yet


def test_a_quiescent_leader_waits_only_for_its_next_heartbeat_and_a_tick_before_it_does_nothing() -> None:
    r = leader()
    r.handle(ClientAppend(1, 1, 10, Ack.APPLIED, data=[b"x"]), 10)
    r.handle(LocalFlushed(1), 11)
    assert r.next_tick_ms() == 11  # entries in flight, a client waiting: busy
    for f in ("b", "c"):
        r.handle(ReplicateAck(f, "a", r.epoch, 0, 1, False), 20)
    assert r.apply_offset == 0
    if r.next_tick_ms() == 20:  # the apply offset is not announced to every follower yet: the next tick does
        assert r.handle(Tick(), 21)
    due = r.next_tick_ms()
    assert due is not None and due > 21
    assert r.handle(Tick(), due - 1) == []
    beats = r.handle(Tick(), due)
    assert beats, "the heartbeat is due then"
    assert (r.next_tick_ms() or 0) > due  # the next follower's beat, at most an interval on


def test_an_in_sync_follower_needs_no_tick() -> None:
    r = Replica("b", "g", ReplicationConfig(), session=1)
    r.handle(MetastoreChanged(ISR3), 0)
    # Not reconciled yet: it asks the leader for its epoch's end and retries after request.timeout.
    assert r.next_tick_ms() in (None, 0 + ReplicationConfig().request_timeout_ms)


def test_the_wake_up_is_the_earliest_deadline_with_ticks_no_faster_than_the_cadence() -> None:
    assert next_wake_ms(1000, 1050, None, None, None, None, 1050) == 1000 + MAX_SLEEP_MS
    assert next_wake_ms(1000, 1050, 0, None, None, None, 0) == 1050  # busy: the usual cadence
    assert next_wake_ms(1000, 1050, 1700, None, None, None, 0) == 1700  # a heartbeat due later
    assert next_wake_ms(1000, 1050, 1700, 1005, None, None, 0) == 1005  # a held beat leaves first
    assert next_wake_ms(1000, 1050, None, None, 0, 2000, 1040) == 1040  # the flow at its own cadence
    assert next_wake_ms(1000, 1050, None, None, 1900, 1800, 1040) == 1800
    assert next_wake_ms(1000, 1050, None, None, 1000, None, 1040) == 1000  # a round with work now


def test_a_busy_flow_waits_for_its_own_cadence_when_no_tick_ran_lately() -> None:
    """The tick's cadence is stale (no tick was due for a while) while the flow waits on other groups: the
    wake-up is a flow round's cadence away, not now (which made the thread spin)."""
    assert next_wake_ms(1000, 400, None, None, 0, None, 1050) == 1050
