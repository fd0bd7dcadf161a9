"""Who ships which envelopes when: the pull rules of both ends, without I/O (see :mod:`topology.dataflow`).

:class:`Inlet` is a destination group's leader: it pulls from every source
group with a byte window, accepts envelopes only in sequence per source, and
carries its completion reports on the pulls. :class:`Shipper` is a source
group's leader: it answers each destination's latest pull with applied
envelopes from the pull's position, as they are applied, within the window.
The worker moves the pulls and batches over streams and calls these; a test
drives them over a lossy, reordering network instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: bytes a destination accepts from one source beyond what its entries consumed
WINDOW_BYTES = 8 << 20
#: a source ships within its latest pull's credit, overshooting by at most one envelope, so what one
#: source has queued stays about one window; past this many windows (a misjudged credit, a bug) the
#: destination drops the envelope, counts it and pulls it again once its entries consumed some
MAX_QUEUED_WINDOWS = 2
#: most bytes of envelopes in one batch message (several go out when a window allows more)
BATCH_BYTES = 1 << 20
#: a destination repeats its pull this often even when nothing changed (repairs lost pulls and batches)
KEEPALIVE_MS = 1_000
#: a source trims its outbox to a destination once this many envelopes there are complete (or all are)
TRIM_MIN_ENVELOPES = 256


@dataclass(frozen=True)
class Pull:
    """Destination ``dst`` (leader in ``epoch``) wants envelopes from ``position`` on, ``window`` bytes of them.

    ``report`` is its completion report for the source (see
    :mod:`topology.dataflow.completion`).
    """

    src: int
    dst: int
    epoch: int
    position: int
    window: int
    report: tuple[int, tuple[int, ...]]


@dataclass
class _Feed:
    expected: int
    queued: int = 0  # bytes accepted, not yet consumed by an entry
    since_pull: int = 0  # bytes accepted since the last pull
    pulled_at: int | None = None
    report: tuple[int, tuple[int, ...]] | None = None
    repull: bool = True


class Inlet:
    """Destination side, one group leader: in-order acceptance and pulls, per source group."""

    def __init__(self, dst: int, epoch: int, window: int = WINDOW_BYTES, keepalive_ms: int = KEEPALIVE_MS) -> None:
        self.dst = dst
        self.epoch = epoch
        self.window = window
        self.keepalive_ms = keepalive_ms
        self._feeds: dict[int, _Feed] = {}
        #: envelopes dropped because their source's queue was full (MAX_QUEUED_WINDOWS); pulled again
        self.over_window = 0

    def start(self, positions: dict[int, int]) -> None:
        """Begin (a leadership, or after a rebuild) from the inbox positions the group's entries hold, staged included."""
        self._feeds = {src: _Feed(pos) for src, pos in positions.items()}

    def expected(self, src: int) -> int:
        return self._feeds[src].expected

    def accept(self, src: int, seq: int, nbytes: int) -> bool:
        """An envelope arrived: True to queue it for an entry (it is the next one), False to drop it.

        What one source has queued stays within ``MAX_QUEUED_WINDOWS`` windows,
        or one envelope when nothing else is queued (a larger one must go too).
        """
        f = self._feeds[src]
        if seq != f.expected:
            if seq > f.expected:
                f.repull = True  # something was lost: ask again from where we are
            return False
        if f.queued and f.queued + nbytes > MAX_QUEUED_WINDOWS * self.window:
            self.over_window += 1
            f.repull = True
            return False
        f.expected += 1
        f.queued += nbytes
        f.since_pull += nbytes
        return True

    def consumed(self, src: int, nbytes: int) -> None:
        """An entry took ``nbytes`` of queued envelopes from ``src``: the window opens again."""
        f = self._feeds[src]
        f.queued = max(0, f.queued - nbytes)

    def rewind(self, src: int, position: int, dropped_bytes: int) -> None:
        """Queued envelopes from ``position`` on were dropped (a leadership change, a build that refused them)."""
        f = self._feeds[src]
        f.expected = position
        f.queued = max(0, f.queued - dropped_bytes)
        f.repull = True

    @property
    def feeds(self) -> int:
        """How many source groups this inlet pulls from."""
        return len(self._feeds)

    def next_keepalive(self) -> int:
        """When the next pull is due even if nothing changes (0: one is due now)."""
        return min((0 if f.repull or f.pulled_at is None else f.pulled_at + self.keepalive_ms
                    for f in self._feeds.values()), default=0)

    def pulls(self, now_ms: int, reports: dict[int, tuple[int, list[int]]]) -> list[Pull]:
        """The pulls to send now: first ones, repairs, window refills, new reports and keepalives."""
        out = []
        for src, f in self._feeds.items():
            pos, inc = reports.get(src, (0, []))
            report = (pos, tuple(inc))
            due = (f.repull or f.pulled_at is None or report != f.report
                   or now_ms - f.pulled_at >= self.keepalive_ms
                   or (f.since_pull * 2 >= self.window and f.queued * 2 < self.window))
            if not due:
                continue
            out.append(Pull(src, self.dst, self.epoch, f.expected, max(0, self.window - f.queued), report))
            f.pulled_at, f.report, f.repull, f.since_pull = now_ms, report, False, 0
        return out


@dataclass
class _Sub:
    peer: Any
    epoch: int
    next: int
    credit: int


class Shipper:
    """Source side, one group leader: what to send to each destination, from its latest pull."""

    def __init__(self) -> None:
        self._subs: dict[int, _Sub] = {}

    def pulled(self, p: Pull, peer: Any) -> bool:
        """Take a pull that arrived from ``peer``; False when a newer leadership of ``p.dst`` already pulls."""
        s = self._subs.get(p.dst)
        if s is not None and p.epoch < s.epoch:
            return False
        self._subs[p.dst] = _Sub(peer, p.epoch, p.position, p.window)
        return True

    def due(self, live: dict[int, tuple[int, int]]) -> list[tuple[int, Any, int, int, int]]:
        """Reads to make now: ``(dst, peer, start, end, max_bytes)`` for each destination that has room.

        ``live`` is each outbox's applied ``(start, end)``. A pull from below the
        start (a late duplicate: those envelopes were completed and trimmed)
        is answered from the start; the destination drops what it holds.
        """
        out = []
        for dst, s in self._subs.items():
            start, end = live.get(dst, (0, 0))
            s.next = max(s.next, start)
            if s.next < end and s.credit > 0:
                out.append((dst, s.peer, s.next, end, s.credit))
        return out

    def shipped(self, dst: int, next_seq: int, nbytes: int) -> None:
        """Envelopes up to ``next_seq`` left for ``dst`` (their bytes use up the pull's window)."""
        s = self._subs[dst]
        s.next = max(s.next, next_seq)
        s.credit -= nbytes

    def disconnected(self, peer: Any) -> None:
        """A stream broke: its destinations pull again when they reconnect."""
        self._subs = {d: s for d, s in self._subs.items() if s.peer is not peer}


def trim_due(start: int, end: int, complete_prefix: int, min_envelopes: int = TRIM_MIN_ENVELOPES) -> int | None:
    """Where to trim an outbox ``[start, end)`` whose destination completed everything below ``complete_prefix``.

    None while it is not worth an entry's writes: trims go in batches, except
    the last one that empties the outbox (so an idle cluster holds nothing).
    """
    upto = min(complete_prefix, end)
    if upto <= start:
        return None
    if upto - start >= min_envelopes or upto == end:
        return upto
    return None
