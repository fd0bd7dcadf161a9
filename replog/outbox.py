"""The outbox policy: which of a replica's peer messages leave now and which wait (pure, the caller's clock).

A driver collects the messages one drain of a replica produces and asks
:meth:`Outbox.take` what to hand the network. Two kinds of message may wait,
because a later one says the same, at least as new:

* **beats** (a leader's frame without entries: epoch, apply offset, where the
  leader stands) wait up to ``beat_hold_ms``; the next frame to the same
  follower replaces them, so under a stream of appends the apply offset rides
  on the next entries instead of costing each follower a frame, a wake-up and
  an ack per batch. A held beat is just a slower network, which the protocol
  tolerates; heartbeats stay far inside ``replication.request.timeout.millis``.
* **acks** wait while an fsync is about to produce a newer one
  (``hold_acks``), and an ack followed by a later one to the same peer in the
  same epoch is dropped (acks are cumulative; a reset ack is never dropped).

The state machines tolerate lost, delayed and reordered messages, so neither
changes what they decide; the worker and the simulator run this same policy.
"""

from __future__ import annotations

from typing import Any

from replog.messages import RawReplicate, Replicate, ReplicateAck

#: how long a leader may hold a frame without entries for a follower (see the module docstring)
BEAT_HOLD_MS = 5

Addressed = tuple[str, Any]


def is_beat(msg: Any) -> bool:
    """A leader's frame without entries, encoded (:class:`RawReplicate`) or not (:class:`Replicate`)."""
    if isinstance(msg, RawReplicate):
        return not msg.frames
    if isinstance(msg, Replicate):
        return not msg.entry_epochs
    return False


def coalesce_acks(out: list[Addressed]) -> list[Addressed]:
    """Drop every non-reset ReplicateAck followed by a later ack to the same peer in the same epoch."""
    latest: dict[str, int] = {}
    for i, (dst, m) in enumerate(out):
        if isinstance(m, ReplicateAck):
            latest[dst] = i
    if not latest:
        return out
    keep = []
    for i, (dst, m) in enumerate(out):
        if isinstance(m, ReplicateAck) and not m.reset and latest[dst] != i and out[latest[dst]][1].epoch == m.epoch:
            continue
        keep.append((dst, m))
    return keep


class Outbox:
    """One replica's outgoing peer messages: those of the current drain, and beats held per follower."""

    def __init__(self, beat_hold_ms: int = BEAT_HOLD_MS) -> None:
        self.beat_hold_ms = beat_hold_ms
        #: this drain's messages, in the order the state machine produced them
        self.pending: list[Addressed] = []
        #: held beats per follower: (due ms, message)
        self.beats: dict[str, tuple[int, Any]] = {}

    def add(self, dst: str, msg: Any) -> None:
        self.pending.append((dst, msg))

    def take(self, now_ms: int, leader: bool, hold_acks: bool = False) -> list[Addressed]:
        """The messages to send now; ``hold_acks`` when an fsync follows that will produce a newer ack."""
        out = self.pending
        if not out:
            return []
        if hold_acks:
            self.pending = [x for x in out if isinstance(x[1], ReplicateAck)]
            if self.pending:
                out = [x for x in out if not isinstance(x[1], ReplicateAck)]
        else:
            self.pending = []
            if len(out) > 1:
                out = coalesce_acks(out)
        if leader or self.beats:
            out = self._hold_beats(out, now_ms, leader)
        return out

    def _hold_beats(self, out: list[Addressed], now_ms: int, leader: bool) -> list[Addressed]:
        """Hold a leader's beats; a later frame to the same follower replaces the held one."""
        keep: list[Addressed] = []
        beats = self.beats
        for dst, m in out:
            if isinstance(m, RawReplicate | Replicate):
                old = beats.pop(dst, None)
                if leader and is_beat(m):
                    beats[dst] = (old[0] if old is not None else now_ms + self.beat_hold_ms, m)
                    continue
                # The held beat is superseded unless it says something the new frame does not.
                if old is not None and (old[1].epoch != m.epoch or old[1].apply_offset > m.apply_offset):
                    keep.append((dst, old[1]))
            keep.append((dst, m))
        return keep

    def next_due(self) -> int | None:
        """When the earliest held beat must leave (None: none held)."""
        return min(d for d, _m in self.beats.values()) if self.beats else None

    def due(self, now_ms: int) -> list[Addressed]:
        """The held beats whose time has come, removed from the outbox."""
        out = [(dst, m) for dst, (d, m) in self.beats.items() if d <= now_ms]
        for dst, _m in out:
            del self.beats[dst]
        return out

    def clear(self) -> None:
        """Forget everything (the replica was replaced, e.g. by a far-horizon install)."""
        self.pending.clear()
        self.beats.clear()
