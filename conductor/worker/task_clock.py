"""When a replica's task thread wakes with nothing in its inbox: at its next real deadline, never by polling.

An idle cluster used to cost CPU in proportion to its replicas: every task
thread woke every ``TICK_MS`` to feed the state machine a tick that, for an
in-sync group with nothing in flight, did nothing but decide no heartbeat was
due yet (54 replicas: over a thousand wake-ups a second). The state machine
now says when a tick can next matter (``Replica.next_tick_ms``), the dataflow
when its next pull or trim is due, the outbox when a held beat must leave;
the thread sleeps until the earliest of those or an inbox item. Ticks stay at
most one per ``TICK_MS`` (a busy replica ticks as before), so only their
timing changes, which the replication rules already tolerate.
"""

from __future__ import annotations

import time

TICK_MS = 50
#: how often a replica looks for replog segments that retention may delete (while it has had work)
RETAIN_INTERVAL_MS = 1_000
#: the longest a task thread sleeps with nothing due (a bound, not a poll: nothing depends on it)
MAX_SLEEP_MS = 5_000


def now_ms() -> int:
    """The task threads' clock (monotonic milliseconds)."""
    return int(time.monotonic() * 1000)


def next_wake_ms(now_ms: int, next_tick_ms: int, tick_due: int | None, beat_due: int | None,
                 flow_due: int | None, retain_due: int | None, next_flow_ms: int, sync_due: int | None = None) -> int:
    """The time to wake at: the earliest deadline, ticks and dataflow rounded up to their cadences.

    ``next_tick_ms`` is the earliest the cadence allows the next tick; a
    ``tick_due`` already past means "at the cadence" (busy). ``flow_due`` 0
    means the dataflow waits on others and polls at its own cadence,
    ``next_flow_ms`` (each step runs a dataflow round, so a step plus
    ``TICK_MS``); any other ``flow_due`` is a deadline, ``now_ms`` for a round
    with work now. The two cadences are apart because a step that ticks nothing
    leaves the tick's where it was: a waiting flow rounded to that stale
    cadence made its thread spin (thousands of idle steps a second). ``sync_due`` is the interval durability
    mode's next fsync.
    """
    due = now_ms + MAX_SLEEP_MS
    if tick_due is not None:
        due = min(due, max(tick_due, next_tick_ms))
    if flow_due is not None:
        due = min(due, next_flow_ms if flow_due == 0 else flow_due)
    for d in (beat_due, retain_due, sync_due):
        if d is not None:
            due = min(due, d)
    return due
