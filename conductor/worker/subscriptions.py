"""Reactive subscriptions on one replica (:class:`AppliedFeed`): diffs computed once per topic, fanned out.

Every replica's store keeps a feed (leaders and followers alike, so that a follower made leader can
replay what a subscriber missed):

* **The ring**: the change sets of the replica's last applied entries, bounded by entries and bytes
  (:data:`RING_ENTRIES`, :data:`RING_BYTES`). A subscriber resuming from offset ``o`` on a new leader gets
  the diffs of the ring's entries after ``o``; when the ring no longer reaches back to ``o + 1`` it gets a
  resync (the value and its applied offset) instead. docs/subscriptions.md states the rule.
* **Topics**: one per watched node (a PState and a top-level key, or a whole PState), with its subscribers.
  The task thread computes a topic's diffs once per applied entry, right after the apply, from the entry's
  writes (:mod:`pstate.diffs`), encodes them once, and posts the burst's events to the event loop in one
  call; there each subscriber's queue gets a reference to the same bytes.
* **Subscribers**: a queue each, bounded by :data:`SUBSCRIBER_QUEUE` events. A subscriber whose queue is
  full loses its queue and is marked for a resync: its stream then sends the current value and its offset
  and goes on from there. A slow reader costs the leader at most its bounded queue, never more.

Threads: the task thread calls :meth:`AppliedFeed.applied` and :meth:`AppliedFeed.flush`; the event loop
subscribes, unsubscribes and delivers. ``_lock`` orders topic registration (and the ring's replay) with the
task thread's applies, so that a new subscriber misses no entry between its first value and its first diff.
Offsets carry the rest: a subscriber drops every event at or below the offset it already covers.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from pstate.changes import ChangeSet
from pstate.diffs import DIFFS, RESYNC, VALUE, WHOLE, Watch, diffs_of, pack_event
from replog.errors import Backpressure

#: applied entries a replica remembers for resuming subscribers (and their payload bytes, at most)
RING_ENTRIES = 4096
RING_BYTES = 4 << 20
#: events (and their bytes) a subscriber's queue holds before the subscriber is resynchronised
SUBSCRIBER_QUEUE = 1024
SUBSCRIBER_BYTES = 1 << 20
#: subscribers one replica serves at most (a new one past it is refused with Backpressure)
MAX_SUBSCRIBERS = 20_000

#: (PState, encoded top-level key or None for the whole PState)
TopicKey = tuple[str, Any]
#: reads the watched node's value from applied state: (pstate, key or WHOLE) -> value
ReadValue = Callable[[str, Any], Any]


class Subscriber:
    """One subscription stream's bounded queue of encoded events (event loop only)."""

    __slots__ = ("bound", "bound_bytes", "last", "nbytes", "queue", "resync", "topic", "wake")

    def __init__(self, topic: Topic, last: int, bound: int = SUBSCRIBER_QUEUE,
                 bound_bytes: int = SUBSCRIBER_BYTES) -> None:
        self.topic = topic
        #: the highest applied offset this subscriber's stream covers: events at or below it are dropped
        self.last = last
        self.bound = bound
        self.bound_bytes = bound_bytes
        self.queue: deque[tuple[int, bytes]] = deque()
        self.nbytes = 0
        #: the queue overflowed: the next thing the stream sends is a fresh value
        self.resync = False
        self.wake = asyncio.Event()

    def offer(self, offset: int, event: bytes) -> None:
        if self.resync or offset <= self.last:
            return
        if len(self.queue) >= self.bound or self.nbytes + len(event) > self.bound_bytes:
            self.drop()
            self.resync = True  # a resync replaces all of it: the leader never holds more for a slow reader
        else:
            self.queue.append((offset, event))
            self.nbytes += len(event)
        self.wake.set()

    def drop(self) -> None:
        self.queue.clear()
        self.nbytes = 0

    def take(self, limit: int) -> list[bytes]:
        """Up to ``limit`` queued events after ``last``, in offset order; ``last`` moves past them."""
        out: list[bytes] = []
        q = self.queue
        while q and len(out) < limit:
            offset, event = q.popleft()
            self.nbytes -= len(event)
            if offset > self.last:
                self.last = offset
                out.append(event)
        return out


class Topic:
    """One watched node and its subscribers; its diffs are computed once per entry, whatever their number."""

    __slots__ = ("key", "pstate", "subscribers", "watch")

    def __init__(self, pstate: str, key: Any, watch: Watch) -> None:
        self.pstate = pstate
        self.key = key
        self.watch = watch
        self.subscribers: set[Subscriber] = set()


class AppliedFeed:
    """One replica's ring of applied entries and its topics (see the module docstring)."""

    def __init__(self, read_value: ReadValue, ring_entries: int = RING_ENTRIES, ring_bytes: int = RING_BYTES) -> None:
        self._read_value = read_value
        self._lock = threading.Lock()
        self._ring: deque[tuple[int, ChangeSet | None, int]] = deque()
        self._ring_bytes = 0
        self.ring_entries = ring_entries
        self.ring_bytes = ring_bytes
        self._topics: dict[TopicKey, Topic] = {}
        self._subscribers = 0
        #: this burst's events, task thread only: (topic, offset, event)
        self._out: list[tuple[Topic, int, bytes]] = []
        #: runs a function on the event loop (set by the first subscription)
        self._post: Callable[..., None] | None = None

    # ------------------------------------------------------------------ task thread

    def applied(self, offset: int, cs: ChangeSet | None, nbytes: int) -> None:
        """Entry ``offset`` is applied (``cs`` None: it wrote nothing, a replayed microbatch)."""
        with self._lock:
            ring = self._ring
            assert not ring or ring[-1][0] < offset, (ring[-1][0], offset)
            ring.append((offset, cs, nbytes))
            self._ring_bytes += nbytes
            while len(ring) > self.ring_entries or (self._ring_bytes > self.ring_bytes and len(ring) > 1):
                self._ring_bytes -= ring.popleft()[2]
            if not self._topics or cs is None:
                return
            for t in self._topics.values():
                if t.watch.cf not in cs.cfs:
                    continue
                d = None if cs.topology is not None else diffs_of(cs, t.watch)
                if d is None:  # a microbatch or code entry, or writes no diff says exactly: the value itself
                    self._out.append((t, offset, pack_event(RESYNC, offset, self._read_value(t.pstate, t.key))))
                elif d:
                    self._out.append((t, offset, pack_event(DIFFS, offset, d)))

    def flush(self) -> None:
        """Hand this burst's events to the event loop in one call."""
        if self._out:
            out, self._out = self._out, []
            post = self._post
            if post is not None:
                post(_deliver, out)

    def reset(self) -> None:
        """The store jumped (a far-horizon checkpoint): the ring no longer leads to its state."""
        with self._lock:
            self._ring.clear()
            self._ring_bytes = 0

    # ------------------------------------------------------------------ event loop

    def subscribe(self, pstate: str, key: Any, watch: Watch, from_offset: int,
                  read_applied: Callable[[], tuple[Any, int]], post: Callable[..., None]) -> tuple[Subscriber, list[bytes]]:
        """A new subscriber of ``(pstate, key)`` and the events it starts with.

        ``from_offset`` < 0: the value now. Otherwise the subscriber holds the value at ``from_offset``
        (it resumes): the diffs of the ring's entries after it, or a resync when the ring does not reach
        back that far. ``read_applied`` reads the value and the applied offset it reflects, atomically.
        """
        with self._lock:
            if self._subscribers >= MAX_SUBSCRIBERS:
                raise Backpressure(pstate, f"{MAX_SUBSCRIBERS} subscriptions on this replica")
            self._post = post
            value, applied = read_applied()
            events: list[bytes] = []
            if from_offset < 0:
                events.append(pack_event(VALUE, applied, value))
                last = applied
            elif from_offset >= applied:
                last = from_offset  # this replica has not applied all the subscriber saw yet: it will
            else:
                replay = self._replay(watch, from_offset)
                if replay is None:
                    events.append(pack_event(RESYNC, applied, value))
                    last = applied
                else:
                    events, last = replay
            t = self._topics.get((pstate, key))
            if t is None:
                t = self._topics[(pstate, key)] = Topic(pstate, key, watch)
            s = Subscriber(t, last)
            t.subscribers.add(s)
            self._subscribers += 1
            return s, events

    def _replay(self, watch: Watch, after: int) -> tuple[list[bytes], int] | None:
        """The diffs of the ring's entries after ``after`` and the last offset they cover; None: resync."""
        ring = self._ring
        if not ring or ring[0][0] > after + 1:
            return None
        events: list[bytes] = []
        last = after
        for offset, cs, _ in ring:
            if offset <= after:
                continue
            last = offset
            if cs is None or watch.cf not in cs.cfs:
                continue
            d = None if cs.topology is not None else diffs_of(cs, watch)
            if d is None:
                return None
            if d:
                events.append(pack_event(DIFFS, offset, d))
        return events, last

    def unsubscribe(self, s: Subscriber) -> None:
        with self._lock:
            t = s.topic
            if s in t.subscribers:
                t.subscribers.discard(s)
                self._subscribers -= 1
            if not t.subscribers and self._topics.get((t.pstate, t.key)) is t:
                del self._topics[(t.pstate, t.key)]

    def stats(self) -> dict[str, int]:
        return {"topics": len(self._topics), "subscribers": self._subscribers, "ring_entries": len(self._ring)}


def _deliver(out: list[tuple[Topic, int, bytes]]) -> None:
    """On the event loop: each event to each subscriber of its topic (a reference, not a copy)."""
    for t, offset, event in out:
        for s in t.subscribers:
            s.offer(offset, event)


__all__ = ["WHOLE", "AppliedFeed", "Subscriber", "Topic"]
