"""When is a record's whole tree of hops applied? The completion rule, kept by each group's leader.

Definitions (see :mod:`topology.dataflow` for the protocol around them):

* An envelope ``e`` that group ``g`` consumed is **complete** when the entry
  that consumed it is applied on ``g`` and every envelope that entry sent *on
  e's behalf* (its children: envelopes listing ``e`` among their parents) is
  complete at its own destination.
* A **root** (an entry's own input: a client append, a microbatch commit) is
  complete when its entry is applied and every envelope it sent directly is
  complete. By induction, a complete root's every descendant effect is applied,
  which is what ``ack="applied"`` promises the appender.
* Group ``g`` reports to each source ``s`` a **completion report**
  ``(position, incomplete)``: every envelope ``s`` sent with ``seq`` below
  ``position`` (the applied inbox position) is complete except the few in
  ``incomplete`` (consumed, still waiting for children). A bare watermark
  ("complete below w") would not do: in a chain A -> B -> A -> B, B's first
  envelope waits for A's answer, which waits for B's *next* envelope, which
  such a watermark would hide behind the first one forever. Every report
  states facts about applied entries (even a deposed leader's is true), so a
  source only ever adds completions; it resolves its own parents with them and
  trims its outbox below the complete prefix, ``min(position, incomplete)``.

Cost: O(1) per envelope and per entry, nothing per message; the state is the
envelopes in flight. Why not per message: Python pays per object, and a fanout
entry carries thousands of messages in a few envelopes. Why not "everything
this group sent before" (a vector of outbox ends): with traffic both ways,
group A's envelope would wait on B's later ones, which wait on A's later ones,
and under steady load nothing would ever complete. Parent links follow only
real causality, so a tree completes as soon as its own hops are applied.

A new leader rebuilds the tracker from applied state (:meth:`rebuild`): its
inbox positions, and the live (untrimmed) envelopes of its outbox with their
parents. Trimming only complete envelopes is what makes that enough.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from topology.envelope import ROOT

Parent = tuple[int, int]  # (source group, envelope seq), or (ROOT, entry offset)


class CompletionTracker:
    """One group leader's view: what it consumed, what it sent on whose behalf, what came back complete."""

    def __init__(self) -> None:
        #: per destination: envelopes sent (applied here) not yet known complete, ascending seq
        self._live: dict[int, deque[tuple[int, tuple[Parent, ...]]]] = {}
        #: per destination: its last report for us (position, incomplete seqs) and the complete prefix heard
        self._heard: dict[int, tuple[int, frozenset[int]]] = {}
        self._prefix: dict[int, int] = {}
        #: incomplete children per parent
        self._children: dict[Parent, int] = {}
        #: per source: applied inbox position (everything below consumed)
        self._consumed: dict[int, int] = {}
        #: per source: consumed envelopes that had children outstanding when consumed, ascending seq (lazy)
        self._waiting: dict[int, deque[int]] = {}
        self._roots_done: list[int] = []

    # ------------------------------------------------------------------------------------ events

    def applied(self, offset: int, consumed: dict[int, int], sent: Iterable[tuple[int, int, list[int]]]) -> bool:
        """Entry ``offset`` was applied: it moved the inbox positions to ``consumed`` and sent ``sent``.

        ``sent`` is ``(destination, seq, flat parents)`` per envelope. Returns
        True when the entry, as a root, is already complete (it sent nothing
        on its own behalf that is still pending); otherwise its offset comes
        out of :meth:`take_roots_done` once it is.
        """
        waiting: list[Parent] = []
        for dst, seq, flat in sent:
            parents = tuple((ROOT, offset) if flat[i] == ROOT else (flat[i], flat[i + 1])
                            for i in range(0, len(flat), 2))
            self._send(dst, seq, parents, waiting)
        # envelopes consumed by this entry that now wait for children, in order (they come from all destinations)
        for src, seq in sorted(waiting):
            q = self._waiting.get(src)
            if q is None:
                q = self._waiting[src] = deque()
            assert not q or q[-1] < seq, (src, seq, q[-1])
            q.append(seq)
        for src, pos in consumed.items():
            assert pos >= self._consumed.get(src, 0), (src, pos, self._consumed.get(src))
            self._consumed[src] = pos
        return (ROOT, offset) not in self._children

    def _send(self, dst: int, seq: int, parents: tuple[Parent, ...], waiting: list[Parent]) -> None:
        heard = self._heard.get(dst)
        if heard is not None and seq < heard[0] and seq not in heard[1]:
            return  # already reported complete (a new leader's report can overtake its apply)
        live = self._live.get(dst)
        if live is None:
            live = self._live[dst] = deque()
        assert not live or live[-1][0] < seq, (dst, seq, live[-1][0])
        live.append((seq, parents))
        for p in parents:
            n = self._children.get(p, 0)
            self._children[p] = n + 1
            if n == 0 and p[0] != ROOT:
                waiting.append(p)

    def reported(self, dst: int, position: int, incomplete: Iterable[int] = ()) -> bool:
        """``dst`` says: every envelope we sent it below ``position`` is complete, except ``incomplete``.

        Returns True when this resolved anything (a group reporting to itself
        repeats until it does not: see :meth:`settle_self`).
        """
        inc = frozenset(incomplete)
        old = self._heard.get(dst)
        if old is None or position >= old[0]:
            self._heard[dst] = (position, inc)
        self._prefix[dst] = max(self._prefix.get(dst, 0), min(position, min(inc, default=position)))
        live = self._live.get(dst)
        if not live or live[0][0] >= position:
            return False
        kept: list[tuple[int, tuple[Parent, ...]]] = []
        resolved = False
        while live and live[0][0] < position:
            item = live.popleft()
            if item[0] in inc:
                kept.append(item)
                continue
            resolved = True
            for p in item[1]:
                n = self._children[p] - 1
                if n:
                    self._children[p] = n
                    continue
                del self._children[p]
                if p[0] == ROOT:
                    self._roots_done.append(p[1])
        live.extendleft(reversed(kept))
        return resolved

    def settle_self(self, group: int) -> None:
        """Feed this group's report for itself back in until nothing moves (envelopes a group sends itself)."""
        while self.reported(group, *self.report(group)):
            pass

    # ------------------------------------------------------------------------------------ queries

    def report(self, src: int) -> tuple[int, list[int]]:
        """What to tell ``src``: ``(position, incomplete)`` (see the module docstring)."""
        waiting = self._waiting.get(src)
        pos = self._consumed.get(src, 0)
        if not waiting:
            return pos, []
        children = self._children
        live = [seq for seq in waiting if (src, seq) in children]
        if len(live) != len(waiting):
            self._waiting[src] = deque(live)
        return pos, live

    def position(self, src: int) -> int:
        """The applied inbox position for ``src``: every envelope below it was consumed by an applied entry."""
        return self._consumed.get(src, 0)

    def reports(self) -> dict[int, tuple[int, list[int]]]:
        return {src: self.report(src) for src in self._consumed}

    def complete_prefix(self, dst: int) -> int:
        """Every envelope to ``dst`` below this is complete: the outbox to ``dst`` may be trimmed below it."""
        return self._prefix.get(dst, 0)

    def take_roots_done(self) -> list[int]:
        """Offsets of root entries that completed since the last call (their appenders may be answered)."""
        out, self._roots_done = self._roots_done, []
        return out

    def in_flight(self) -> int:
        """Envelopes sent and not yet known complete (for status and tests)."""
        return sum(len(q) for q in self._live.values())

    # ------------------------------------------------------------------------------------ new leader

    @classmethod
    def rebuild(cls, positions: dict[int, int], live: dict[int, tuple[int, list[tuple[int, list[int]]]]]
                ) -> CompletionTracker:
        """The tracker of a leader that just took over, from applied state alone.

        ``positions``: inbox position per source. ``live``: per destination, the
        outbox start (everything below was reported complete, or it would not
        have been trimmed) and its live envelopes ``(seq, flat parents)`` in
        seq order. Roots of earlier leaderships have nobody waiting for them:
        their envelopes are followed only so the reports that resolve them
        resolve nothing else.
        """
        t = cls()
        t._consumed = dict(positions)
        children: dict[Parent, int] = {}
        for dst, (start, envelopes) in live.items():
            t._prefix[dst] = start
            q = t._live[dst] = deque()
            for seq, flat in envelopes:
                parents = tuple((flat[i], flat[i + 1]) for i in range(0, len(flat), 2) if flat[i] != ROOT)
                q.append((seq, parents))
                for p in parents:
                    children[p] = children.get(p, 0) + 1
        t._children = children
        for src, seq in sorted(children):
            t._waiting.setdefault(src, deque()).append(seq)
        return t
