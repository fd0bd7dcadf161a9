"""A replica's counters and latency histograms, written by its task thread and read by the metrics collector.

prometheus-client's ``Histogram`` takes a lock and a label lookup per ``observe`` (about 1 µs) and counts one
observation at a time. A task thread's drain applies hundreds of entries at once, all with the same apply
duration and the same creation time, so :class:`Buckets` takes a *weighted* observation instead
(``observe(seconds, n)``: n entries took that long, O(1) whatever n), without a lock: only the replica's task
thread writes (single writer), and a scrape reads the counters racily, which at worst splits one observation
between two scrapes. :mod:`conductor.worker.metrics` exports them as Prometheus histograms (prometheus-client's
``HistogramMetricFamily``), labelled by role, ack level or entry type.

``--metrics-detail off`` (:func:`configure`) makes :func:`new_timings` return None: the host then skips every
clock read and observation (the bench's ``--metrics off`` comparison measures what they cost).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING

from prometheus_client.utils import floatToGoString

from replog.errors import Backpressure, StalledGroup
from replog.messages import ReplicateAck
from topology.entries.requests import (
    BatchCommit,
    CodeSwitch,
    DepotAppend,
    DepotTrim,
    InboundHops,
    MigrationBatch,
    OutboxTrim,
    RetentionCheck,
)

if TYPE_CHECKING:
    from conductor.worker.pending_entry import PendingEntry

#: upper bounds (seconds) of latency buckets: 50 µs to 10 s, about x2.5 apart
LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 10.0)
#: upper bounds (bytes/s) of the far-horizon transfer rate buckets: 1 MB/s to 1 GB/s
RATE_BUCKETS = (1e6, 5e6, 1e7, 2.5e7, 5e7, 1e8, 2.5e8, 5e8, 1e9)

#: the entry type label of each request type (``topology.entries.requests``): what the leader built
ENTRY_TYPES: dict[type, str] = {
    DepotAppend: "client_append", InboundHops: "inbound_hops", BatchCommit: "microbatch_commit",
    CodeSwitch: "code_switch", MigrationBatch: "migration", OutboxTrim: "trim",
    DepotTrim: "depot_trim", RetentionCheck: "retention",
}
#: entries applied whose type this replica does not know: a follower's, or a new leader's inherited tail
UNKNOWN_TYPE = "replicated"

_DETAIL = True


def replica_counters() -> dict[str, int]:
    """A replica's counters, all zero (metrics and ``conductor status`` read them)."""
    return {"appends": 0, "entries_applied": 0, "flushes": 0, "far_horizon_installs": 0,
            "far_horizon_bytes": 0, "far_horizon_refetched_files": 0, "replog_deleted_bytes": 0,
            "replicate_failures_stalled": 0, "replicate_failures_backpressure": 0}


def measure_reply(stats: dict[str, int], timings: ReplicaTimings | None, error: Exception | None,
                  group: Sequence[PendingEntry]) -> None:
    """A leader answers ``group``: their append-to-ack latencies, or the replicate failures it counts.

    A replicate failure is an entry that could not reach min-ISR in time (StalledGroup) or was refused or timed
    out waiting for room (Backpressure); any other error (not the leader, a closing replica) is not one.
    """
    if error is None:
        if timings is not None and group:
            timings.acked(group)
    elif isinstance(error, StalledGroup):
        stats["replicate_failures_stalled"] += len(group)
    elif isinstance(error, Backpressure):
        stats["replicate_failures_backpressure"] += len(group)


def configure(detail: bool) -> None:
    """The worker's ``--metrics-detail``: whether replicas opened from now on time anything."""
    global _DETAIL
    _DETAIL = detail


def new_timings() -> ReplicaTimings | None:
    return ReplicaTimings() if _DETAIL else None


class Buckets:
    """A cumulative-at-export histogram: per-bucket counts and a sum; one writer, any number of racy readers."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        assert list(bounds) == sorted(bounds), bounds
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        """``n`` observations of ``value`` (n entries of one drain share a duration)."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        """Prometheus buckets (``le`` -> observations at or below it) and the sum."""
        counts, total, out = list(self.counts), 0, []
        for le, c in zip((*map(floatToGoString, self.bounds), "+Inf"), counts, strict=True):
            total += c
            out.append((le, float(total)))
        return out, self.sum


@dataclass
class _Run:
    """Entries ``[first, last]`` of one type, built at ``created`` (perf_counter seconds) by this leader."""

    first: int
    last: int
    kind: str
    created: float


class ReplicaTimings:
    """One replica's histograms, kept across its restarts like its counters (``HostedReplica``).

    Keys are (histogram name, label value(s)); a histogram appears on the first observation, so a replica
    exports only what it did. The label sets are small and fixed (role x entry type, ack level), so the dict
    is bounded by the vocabulary, not by traffic.
    """

    def __init__(self) -> None:
        self.histograms: dict[tuple[str, tuple[str, ...]], Buckets] = {}
        #: leader: the entries built and not yet applied, as runs of one type, in offset order. Bounded by the
        #: leader's unapplied entries (at most replication.max.unapplied.entries: the inbox refuses appends past
        #: it with Backpressure), popped as they apply, cleared once the replica no longer leads.
        self._built: deque[_Run] = deque()
        #: leader: per follower, the end of the first entries sent and not yet acknowledged, and when
        self._sent: dict[str, tuple[int, float]] = {}

    def get(self, name: str, *labels: str, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> Buckets:
        key = (name, labels)
        h = self.histograms.get(key)
        if h is None:
            h = self.histograms[key] = Buckets(bounds)
        return h

    def items(self) -> Iterator[tuple[str, tuple[str, ...], Buckets]]:
        for (name, labels), h in list(self.histograms.items()):
            yield name, labels, h

    # ------------------------------------------------------------------ task thread

    def built(self, first: int, requests: list[object], created: float) -> None:
        """The leader appended ``requests`` at offsets ``first...``: remember their types until they apply."""
        runs = self._built
        offset = first
        for r in requests:
            kind = ENTRY_TYPES.get(type(r), UNKNOWN_TYPE)
            last = runs[-1] if runs else None
            if last is not None and last.kind == kind and last.last == offset - 1 and last.created == created:
                last.last = offset
            else:
                runs.append(_Run(offset, offset, kind, created))
            offset += 1

    def acked(self, group: Sequence[PendingEntry]) -> None:
        """Entries answered at their ack level now: request reached the worker -> reply (one observe each)."""
        now = perf_counter()
        h = self.get("append_to_ack", group[0].ack.value)
        for p in group:
            if p.received:  # (0: not a client's request, e.g. an inbound hops entry)
                h.observe(now - p.received)

    def flushed(self, role: str, replog_s: float, marks_s: float) -> None:
        """A drain's writes were made durable: the replog's fsync, then the wait for the storage marks' (beside it)."""
        self.get("fsync", role).observe(replog_s)
        self.get("marks_fsync", role).observe(marks_s)

    def peer_sent(self, follower: str, end: int, now: float) -> None:
        """Leader: entries up to ``end`` left for ``follower``; the round trip is timed from the oldest unacked."""
        if follower not in self._sent:
            self._sent[follower] = (end, now)

    def peer_acked(self, ack: ReplicateAck, now: float) -> ReplicateAck:
        """Leader: ``ack`` arrived; if it covers the entries being timed, one peer round trip is observed."""
        sent = self._sent.get(ack.src)
        if sent is not None and ack.held >= sent[0] - 1:
            del self._sent[ack.src]
            self.get("peer_round_trip").observe(now - sent[1])
        return ack

    def transferred(self, nbytes: int, seconds: float) -> None:
        """A far-horizon transfer finished (its thread): its rate, bytes per second over the whole transfer."""
        self.get("far_horizon_rate", bounds=RATE_BUCKETS).observe(nbytes / max(seconds, 1e-6))

    def applied(self, role: str, first: int, last: int, started: float, now: float) -> None:
        """Entries ``[first, last]`` were applied from ``started`` to ``now``: the apply duration of each (the
        batch's time split evenly) and, for the entries this leader built, the replicate duration (built ->
        applied). A follower's apply forgets what it built as a leader: that leadership is over."""
        count = last - first + 1
        assert count > 0, (first, last)
        each = (now - started) / count
        runs = self._built
        if role != "leader":
            runs.clear()
            self._sent.clear()
        while runs and runs[0].last < first:  # refused or truncated before they applied
            runs.popleft()
        typed = 0
        while runs and runs[0].first <= last:
            run = runs[0]
            lo, hi = max(run.first, first), min(run.last, last)
            n = hi - lo + 1
            if n > 0:
                self.get("replicate", role, run.kind).observe(now - run.created, n)
                self.get("apply", role, run.kind).observe(each, n)
                typed += n
            if run.last <= last:
                runs.popleft()
            else:
                run.first = last + 1
                break
        if count > typed:
            self.get("apply", role, UNKNOWN_TYPE).observe(each, count - typed)
