"""One task group's part in the dataflow while its replica leads: the state a worker's task thread drives.

:class:`GroupDataflow` ties the pure rules together for one group: the
completion tracker (fed by applied entries and by the reports pulls carry),
the inlet (pulls, in-order acceptance, the queue for the next inbound entry),
the shipper (batches of applied envelopes for each destination's latest
pull), retries and trims. It does no I/O of its own: the caller applies
entries, builds the entries it asks for, and moves :class:`Pull` and
:class:`Batch` messages to other groups' leaders (a group's messages to
itself never leave it). The worker drives it from the replica's task thread;
``tests/unit/test_dataflow_exactly_once.py`` drives the same object over a
lossy network with crashing leaders.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pstate import outbox
from pstate.changes import ChangeSet
from pstate.store import ChangeSetBuilder, TaskGroupStore
from topology.dataflow.completion import CompletionTracker
from topology.dataflow.entries import (
    Inbound,
    InboundResult,
    build_inbound,
    rebuild_tracker,
    track_applied,
    trim_outbox,
)
from topology.dataflow.poison import RetryBook
from topology.dataflow.shipping import (
    BATCH_BYTES,
    KEEPALIVE_MS,
    TRIM_MIN_ENVELOPES,
    WINDOW_BYTES,
    Inlet,
    Pull,
    Shipper,
    trim_due,
)
from topology.stream import StreamRunner


@dataclass(frozen=True)
class Batch:
    """Envelopes ``src`` ships to a destination: ``(seq, bytes)`` in sequence order."""

    src: int
    envelopes: list[tuple[int, bytes]]


#: (the group whose leader must receive it, the node to send it to if known, the message): a batch goes to the
#: node that pulled; a pull to whoever leads the source group
Outgoing = tuple[int, Any, Pull | Batch]


class GroupDataflow:
    """The dataflow state of one task group's leader (see the module docstring)."""

    def __init__(self, store: Callable[[], TaskGroupStore], runner: StreamRunner, *, window: int = WINDOW_BYTES,
                 keepalive_ms: int = KEEPALIVE_MS, trim_min: int = TRIM_MIN_ENVELOPES,
                 retries: RetryBook | None = None) -> None:
        self._store = store  # a getter: a far-horizon install replaces the replica's store object
        self.runner = runner
        self.group = runner.group
        self.window = window
        self.keepalive_ms = keepalive_ms
        self.trim_min = trim_min
        self._retry_template = retries if retries is not None else RetryBook()  # (an empty book is falsy)
        self.leading = False
        self.epoch = -1
        self._reset()

    @property
    def store(self) -> TaskGroupStore:
        return self._store()

    def _reset(self) -> None:
        self.tracker = CompletionTracker()
        self.inlet = Inlet(self.group, self.epoch, self.window, self.keepalive_ms)
        self.shipper = Shipper()
        self.retries = RetryBook(self._retry_template.attempts, self._retry_template.backoff_ms,
                                 self._retry_template.factor)
        self._queued: dict[int, list[tuple[int, bytes]]] = {}
        self._incomplete: set[int] = set()  # applied root entries still waiting for their hops
        self._held: dict[int, int] = {}  # source -> when its envelope that failed may be retried
        self._rewind = False
        self._changed = True  # something happened that may call for a pull or a batch (see `outgoing`)
        #: the inbox positions the inbound entry built last moves to, until it is applied (see `inbound_due`)
        self._inflight: dict[int, int] = {}

    # ------------------------------------------------------------------------------ leadership

    def lead(self, epoch: int) -> None:
        """This replica leads (its inherited tail already staged): rebuild everything from the store."""
        self.leading, self.epoch = True, epoch
        self._reset()
        self.tracker = rebuild_tracker(self.store)
        reader = self.store.leader_reader()
        self.inlet.start({src: outbox.inbox_position(reader, src) for src in range(self.runner.groups)})

    def follow(self) -> list[int]:
        """Leadership ended: forget it all; returns the root entries whose appenders will not be answered here."""
        lost = sorted(self._incomplete)
        self.leading = False
        self._reset()
        return lost

    # ------------------------------------------------------------------------------ applied entries

    def applied(self, offset: int, cs: ChangeSet) -> None:
        """Entry ``offset`` was applied here (call for every one, in order, while leading)."""
        self._changed = True
        if not track_applied(self.tracker, offset, cs):
            self._incomplete.add(offset)
        if self._inflight and all(self.tracker.position(src) >= pos for src, pos in self._inflight.items()):
            self._inflight = {}

    def root_complete(self, offset: int) -> bool:
        """Whether applied entry ``offset``'s whole tree of hops is applied (its ``applied`` appender may go)."""
        return offset not in self._incomplete

    def completed_roots(self) -> list[int]:
        """Root entries whose tree completed since the last call."""
        self.tracker.settle_self(self.group)
        done = [o for o in self.tracker.take_roots_done() if o in self._incomplete]
        self._incomplete.difference_update(done)
        return done

    # ------------------------------------------------------------------------------ messages in

    def received(self, msg: Pull | Batch, peer: Any = None) -> None:
        """A pull from a destination (``peer`` is where batches for it go) or a batch from a source."""
        if not self.leading:
            return
        self._rewound()
        self._changed = True
        if isinstance(msg, Pull):
            self._pulled(msg, peer)
            return
        queue = self._queued.setdefault(msg.src, [])
        for seq, raw in msg.envelopes:
            if self.inlet.accept(msg.src, seq, len(raw)):
                queue.append((seq, raw))

    def _pulled(self, p: Pull, peer: Any) -> bool:
        """Take a pull for this group; True when its report completed something here."""
        return p.src == self.group and self.shipper.pulled(p, peer) and self.tracker.reported(
            p.dst, p.report[0], p.report[1])

    # ------------------------------------------------------------------------------ entries to build

    def inbound_due(self, now_ms: int) -> bool:
        """True when an inbound entry would consume something now.

        Never while the last one is not applied yet: what arrives during its
        replication round waits for the next entry, so a destination makes one
        entry (one replication round, one fsync per replica) per round however
        many sources ship to it, instead of one per batch that arrives.
        """
        self._rewound()
        return (self.leading and not self._inflight
                and any(q and now_ms >= self._held.get(src, 0) for src, q in self._queued.items()))

    def build_inbound(self, now_ms: int) -> ChangeSetBuilder | None:
        """The inbound entry for everything queued (None: nothing consumable); positions move on at once."""
        batch = [Inbound(src, seq, raw) for src in sorted(self._queued) for seq, raw in self._queued[src]]
        res = build_inbound(self.store, self.runner, batch, self.retries, now_ms)
        self._took(res)
        if res.builder is not None:
            self._inflight = dict(res.consumed)
        return res.builder

    def _took(self, res: InboundResult) -> None:
        self._changed = True
        reader = res.builder.reader if res.builder is not None else self.store.leader_reader()
        for src, queue in self._queued.items():
            pos = res.consumed.get(src)
            if pos is None:
                pos = outbox.inbox_position(reader, src)
            gone = [raw for seq, raw in queue if seq < pos]
            if gone:
                self._queued[src] = [(seq, raw) for seq, raw in queue if seq >= pos]
                self.inlet.consumed(src, sum(map(len, gone)))
        self._held = res.retry_at

    def dropped_inbound(self) -> None:
        """An inbound entry built here was refused before reaching the log: pull again from the staged truth.

        The refusal comes while the caller still holds the refused entry
        staged; the rewind reads positions at the next call, after it restaged.
        It never reaches the log, so it is no longer in flight.
        """
        self._rewind = True
        self._inflight = {}

    def _rewound(self) -> None:
        if not self._rewind:
            return
        self._rewind = False
        reader = self.store.leader_reader()
        for src, queue in self._queued.items():
            self.inlet.rewind(src, outbox.inbox_position(reader, src), sum(len(raw) for _s, raw in queue))
        self._queued = {}

    def trims_due(self) -> dict[int, int]:
        """Where to trim the outbox (destination -> new start), in batches, from what destinations completed."""
        if not self.leading:
            return {}
        out = {}
        for dst, b in outbox.destinations(self.store.leader_reader()).items():
            at = trim_due(b.start, b.end, self.tracker.complete_prefix(dst), self.trim_min)
            if at is not None:
                out[dst] = at
        return out

    def build_trim(self) -> ChangeSetBuilder | None:
        """An entry trimming what destinations completed (None: nothing worth it yet)."""
        due = self.trims_due()
        if not due:
            return None
        b = self.store.changes()
        trim_outbox(b, due)
        return b

    # ------------------------------------------------------------------------------ messages out

    def outgoing(self, now_ms: int) -> list[Outgoing]:
        """Pulls and batches to send now; those for this group itself are handled here and never returned."""
        if not self.leading:
            return []
        self._rewound()
        # Called after every drain of the task thread: when nothing was applied, received or consumed since
        # the last call, only a keepalive can be due (and reading the outbox bounds would cost for nothing).
        if not self._changed and now_ms < self.inlet.next_keepalive():
            return []
        self._changed = False
        out: list[Outgoing] = []
        for p in self.inlet.pulls(now_ms, self.tracker.reports()):
            if p.src == self.group:  # answered below, in this round; another is owed only if roots completed
                if self._pulled(p, None):
                    self._changed = True
            else:
                out.append((p.src, None, p))
        reader = self.store.applied_reader()
        live = {dst: (b.start, b.end) for dst, b in outbox.destinations(reader).items()}
        for dst, peer, start, end, credit in self.shipper.due(live):
            envelopes = outbox.read_envelopes(reader, dst, start, end, max_bytes=min(credit, BATCH_BYTES))
            if not envelopes:
                continue
            self.shipper.shipped(dst, envelopes[-1][0] + 1, sum(len(raw) for _s, raw in envelopes))
            batch = Batch(self.group, envelopes)
            if dst == self.group:
                self.received(batch)
            else:
                out.append((dst, peer, batch))
        return out

    def next_due_ms(self, now_ms: int) -> int | None:
        """When the driver must call again with nothing arriving; None on a follower or with nothing to pull.

        * ``now_ms`` when a round has work now: something changed, or queued envelopes can go into an
          inbound entry (the last one applied, as happens at the end of a drain);
        * the time a held envelope may be retried (poison records back off);
        * 0 while waiting on others (an inbound entry replicating, envelopes out for completion): "at the
          usual cadence", a safety net, as what it waits for arrives as messages that wake the thread;
        * else the next keepalive pull.
        """
        if not self.leading:
            return None
        if self._changed or self._rewind:
            return now_ms
        # per source with envelopes queued: when they may go into an entry (a held poison retry waits)
        consumable_at = [self._held.get(src, 0) for src, q in self._queued.items() if q]
        if consumable_at and not self._inflight:
            return max(now_ms, min(consumable_at))
        if consumable_at or self._inflight or self.tracker.in_flight() > 0:
            return 0
        return self.inlet.next_keepalive() if self.inlet.feeds else None

    def busy(self) -> bool:
        """Anything queued, or sent and not yet known complete (tests settle on this)."""
        return self.leading and (any(self._queued.values()) or self.tracker.in_flight() > 0)

    def working(self) -> bool:
        """Busy, or something changed or is replicating since the last round: the driver owes a trim check
        once it settles (a keepalive falling due is not work)."""
        return self.busy() or (self.leading and (self._changed or self._rewind or bool(self._inflight)))
