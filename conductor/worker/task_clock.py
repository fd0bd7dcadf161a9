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
                 flow_due: int | None, retain_due: int | None, next_flow_ms: int, sync_due: int | None = None,
                 apply_due: int | None = None) -> int:
    """The time to wake at: the earliest deadline, ticks and dataflow rounded up to their cadences.

    ``next_tick_ms`` is the earliest the cadence allows the next tick; a
    ``tick_due`` already past means "at the cadence" (busy). ``flow_due`` 0
    means the dataflow waits on others and polls at its own cadence,
    ``next_flow_ms`` (each step runs a dataflow round, so a step plus
    ``TICK_MS``); any other ``flow_due`` is a deadline, ``now_ms`` for a round
    with work now. The two cadences are apart because a step that ticks nothing
    leaves the tick's where it was: a waiting flow rounded to that stale
    cadence made its thread spin (thousands of idle steps a second). ``sync_due`` is the interval durability
    mode's next fsync, ``apply_due`` a follower's deferred apply (:class:`FollowerApply`).
    """
    due = now_ms + MAX_SLEEP_MS
    if tick_due is not None:
        due = min(due, max(tick_due, next_tick_ms))
    if flow_due is not None:
        due = min(due, next_flow_ms if flow_due == 0 else flow_due)
    for d in (beat_due, retain_due, sync_due, apply_due):
        if d is not None:
            due = min(due, d)
    return due


#: how long a follower's apply of committed entries waits after the drain that learnt of them (see FollowerApply):
#: 1 to 2 ms, since this clock counts whole milliseconds (1 would sometimes be due at once, before the ack left)
FOLLOWER_APPLY_DELAY_MS = 2


class FollowerApply:
    """When a follower applies the entries its leader says are committed: shortly after the drain, not in it.

    Nobody reads a follower's store (queries go to leaders), so its apply is off every path but one: it holds
    the GIL. Run at the end of the drain that fsynced a new entry, it ran while that drain's ack waited for
    the event loop to write it (the loop needs the GIL), which put a RocksDB apply on the path of the
    leader's commit in every sequential append. Deferred by ``FOLLOWER_APPLY_DELAY_MS``, the task thread
    sleeps first, so the ack leaves at once; the apply runs when the thread wakes for it (or later drains
    take it, applying more at once under load). Truncations, role changes and far-horizon installs take it
    whatever its time (:meth:`take` without a clock). Task thread only.
    """

    __slots__ = ("_at", "_up_to")

    def __init__(self) -> None:
        self._up_to = -1  # the highest offset to apply (-1: nothing deferred)
        self._at = 0  # when it is due (task_clock milliseconds)

    def defer(self, up_to: int, now: int) -> None:
        """Entries up to ``up_to`` are committed: apply them ``FOLLOWER_APPLY_DELAY_MS`` after the first one."""
        if self._up_to < 0:
            self._at = now + FOLLOWER_APPLY_DELAY_MS
        self._up_to = max(self._up_to, up_to)

    def due_ms(self) -> int | None:
        """When the task thread must wake for it (None: nothing deferred)."""
        return self._at if self._up_to >= 0 else None

    def take(self, now: int | None = None) -> int:
        """The offset to apply up to now, and forget it; -1 if nothing is deferred or (given ``now``) not yet due."""
        if self._up_to < 0 or (now is not None and now < self._at):
            return -1
        up_to, self._up_to = self._up_to, -1
        return up_to

    def clear(self) -> None:
        """Drop what is deferred (a far-horizon install replaces the store it was for)."""
        self._up_to = -1
