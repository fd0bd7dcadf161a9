"""Replication telemetry: scrape every worker's Prometheus endpoint and keep chart series in memory.

The workers already export what a chart needs (``conductor/worker/metrics.py``: role, offsets, ISR size,
counters); the conductor finds each endpoint in the worker's znode (``NodeInfo.metrics``) and scrapes them
all every ``interval_s`` on one thread. What it keeps is not the raw samples (dozens per replica) but the
few series the charts draw, per module and per module and worker (:data:`CHARTS`), in a
:class:`~conductor.ui.series.SeriesStore` sized for ``history_s``.

A chart is data (:class:`Chart`: series names and how to draw them), so a new one is a new entry and a line
in :meth:`Telemetry.ingest`, not a new page. The workers' duration histograms (replicate and apply duration,
``conductor/worker/timings.py``) become the mean over each scrape interval (the growth of ``_sum`` over the
growth of ``_count``), per role and entry type: the module page's leaders/followers and entry-type selectors
pick one of those series (:data:`ROLES`, the ``type`` label, ``all`` for every type together).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from conductor.metastore import Metastore, MetastoreError, ModuleNotFound
from conductor.metastore.module_spec import MIN_ISR
from conductor.security.identity import Identity
from conductor.security.tls import LinkContexts
from conductor.ui.series import Point, SeriesStore
from conductor.wire.http import http_get

log = logging.getLogger("millrace.conductor.ui")

#: seconds one scrape of one worker may take before it counts as failed
SCRAPE_TIMEOUT_S = 2.0
_MAX_PARALLEL_SCRAPES = 8


@dataclass(frozen=True)
class Chart:
    """One chart of the module page: its series (name -> legend) drawn over time on one y axis.

    A ``selectable`` chart has a series per role and entry type (labels ``role`` and ``type``); the page's
    selectors say which one it draws."""

    id: str
    title: str
    unit: str
    series: dict[str, str]
    selectable: bool = False


#: the roles a selectable chart is split by (Rama's leaders / ISR followers)
ROLES = ("leader", "follower")
#: the ``type`` of a selectable chart's series that sums every entry type
ALL_TYPES = "all"
#: the worker histograms drawn as means: Prometheus name -> chart series name
DURATIONS = {"millrace_replicate_duration_seconds": "replicate_ms", "millrace_apply_duration_seconds": "apply_ms"}


CHARTS = (
    Chart("isr", "ISR count: the smallest ISR across task groups, against min-ISR", "replicas",
          {"isr_min": "smallest ISR", "min_isr": "min-ISR"}),
    Chart("appends", "Appends answered per second (leaders)", "appends/s", {"appends_per_s": "appends/s"}),
    Chart("apply_lag", "Apply lag: entries written but not yet applied (largest replica)", "entries",
          {"apply_lag_max": "largest"}),
    Chart("replog", "Replog entries per replica (average and largest)", "entries",
          {"replog_entries_avg": "average", "replog_entries_max": "largest"}),
    Chart("dead_letters", "Dead letters (leaders, total)", "records", {"dead_letters": "dead letters"}),
    Chart("replicate", "Replicate duration: entry built -> applied by the leader (mean per entry)", "ms",
          {"replicate_ms": "mean"}, selectable=True),
    Chart("apply", "Apply duration per entry (mean)", "ms", {"apply_ms": "mean"}, selectable=True),
    Chart("replicate_failures", "Replicate failures per second: entries that could not reach min-ISR or were "
          "refused (leaders)", "entries/s", {"replicate_failures_per_s": "failures/s"}),
)


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition (a counter ``x`` is sampled as ``x_total``)."""
    return [Sample(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]


def scrape(address: str, timeout_s: float = SCRAPE_TIMEOUT_S, tls: LinkContexts | None = None,
           expect: Identity | None = None) -> list[Sample]:
    """One worker's samples: over HTTPS with ``tls`` (checking it is ``expect``), else plain HTTP."""
    return parse_metrics(http_get(address, "/metrics", timeout_s, tls, expect).decode())


@dataclass
class _Replica:
    """What one scrape says about one replica (node, module, group)."""

    leader: bool = False
    log_start: float = 0.0
    log_end: float = 0.0
    applied: float = -1.0
    isr: float | None = None
    appends: float = 0.0
    dead_letters: float = 0.0
    failures: float = 0.0
    #: (histogram, role, type) -> [sum, count] of the duration histograms
    durations: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)


def _duration(r: _Replica, s: Sample) -> None:
    """A duration histogram's ``_sum`` or ``_count`` sample, into ``r.durations``; others are ignored."""
    base, _, part = s.name.rpartition("_")
    if base in DURATIONS and part in ("sum", "count"):
        key = (base, s.labels.get("role", ""), s.labels.get("type", ""))
        r.durations.setdefault(key, [0.0, 0.0])[part == "count"] = s.value


def _replicas(samples_by_node: Mapping[str, Iterable[Sample]]) -> dict[tuple[str, str, int], _Replica]:
    out: dict[tuple[str, str, int], _Replica] = defaultdict(_Replica)
    for node, samples in samples_by_node.items():
        for s in samples:
            if "module" not in s.labels or "group" not in s.labels:
                continue
            r = out[(node, s.labels["module"], int(s.labels["group"]))]
            if s.name == "millrace_replica_role" and s.labels.get("role") == "leader":
                r.leader = s.value == 1.0
            elif s.name == "millrace_replog_start_offset":
                r.log_start = s.value
            elif s.name == "millrace_replog_end_offset":
                r.log_end = s.value
            elif s.name == "millrace_applied_offset":
                r.applied = s.value
            elif s.name == "millrace_isr_size":
                r.isr = s.value
            elif s.name == "millrace_appends_total":
                r.appends = s.value
            elif s.name == "millrace_dead_letters_total":
                r.dead_letters = s.value
            elif s.name == "millrace_replicate_failures_total":
                r.failures += s.value
            else:
                _duration(r, s)
    return out


def _grown(now: float, before: float) -> float:
    """A counter's growth between two scrapes (a worker restart resets it: then all of it is new)."""
    return now - before if now >= before else now


def _grown_histograms(now: dict[tuple[str, str, str], list[float]],
                      before: dict[tuple[str, str, str], list[float]]) -> dict[tuple[str, str, str], list[float]]:
    out = {}
    for key, (s, c) in now.items():
        ps, pc = before.get(key, (0.0, 0.0))
        out[key] = [s - ps, c - pc] if c >= pc else [s, c]
    return out


@dataclass
class ScrapeState:
    """The last scrape of one worker, for the cluster page."""

    address: str
    at: float = 0.0
    error: str | None = None
    samples: int = 0


class Telemetry:
    """The chart series of every module, fed by :meth:`ingest` (one call per scrape round)."""

    def __init__(self, history_s: float = 3600.0, interval_s: float = 5.0, max_series: int = 2000) -> None:
        assert history_s > 0 and interval_s > 0, (history_s, interval_s)
        self.history_s = history_s
        self.interval_s = interval_s
        self.store = SeriesStore(points=math.ceil(history_s / interval_s) + 1, max_series=max_series)
        #: the previous scrape of each replica, for rates and interval means: key -> (time, replica)
        self._previous: dict[tuple[str, str, int], tuple[float, _Replica]] = {}

    def ingest(self, t: float, samples_by_node: Mapping[str, Iterable[Sample]], min_isr: Mapping[str, int]) -> None:
        """Turn one round of scrapes into a point of every chart series, per module and per module and node."""
        replicas = _replicas(samples_by_node)
        rates: dict[tuple[str, str, int], float] = {}
        failure_rates: dict[tuple[str, str, int], float] = {}
        #: per replica: (histogram, role, type) -> [sum, count] grown since the previous scrape
        grown_durations: dict[tuple[str, str, int], dict[tuple[str, str, str], list[float]]] = {}
        for key, r in replicas.items():
            prev = self._previous.get(key)
            if prev is not None and t > prev[0]:
                rates[key] = _grown(r.appends, prev[1].appends) / (t - prev[0])
                failure_rates[key] = _grown(r.failures, prev[1].failures) / (t - prev[0])
                grown_durations[key] = _grown_histograms(r.durations, prev[1].durations)
            self._previous[key] = (t, r)
        for key in set(self._previous) - set(replicas):
            del self._previous[key]
        scopes: dict[tuple[tuple[str, str], ...], list[tuple[str, str, int]]] = defaultdict(list)
        for key in replicas:
            node, module, _ = key
            scopes[(("module", module),)].append(key)
            scopes[(("module", module), ("node", node))].append(key)
        for scope, keys in scopes.items():
            labels = dict(scope)
            module = labels["module"]
            leaders = [replicas[k] for k in keys if replicas[k].leader]
            isrs = [r.isr for r in leaders if r.isr is not None]
            if isrs:
                self.store.record("isr_min", labels, t, min(isrs))
            if module in min_isr:
                self.store.record("min_isr", labels, t, float(min_isr[module]))
            if any(k in rates for k in keys):
                self.store.record("appends_per_s", labels, t, sum(rates.get(k, 0.0) for k in keys))
            lags = [max(0.0, r.log_end - 1 - r.applied) for r in (replicas[k] for k in keys)]
            self.store.record("apply_lag_max", labels, t, max(lags))
            sizes = [max(0.0, replicas[k].log_end - replicas[k].log_start) for k in keys]
            self.store.record("replog_entries_avg", labels, t, sum(sizes) / len(sizes))
            self.store.record("replog_entries_max", labels, t, max(sizes))
            self.store.record("dead_letters", labels, t, sum(r.dead_letters for r in leaders))
            if any(k in failure_rates for k in keys):
                self.store.record("replicate_failures_per_s", labels, t, sum(failure_rates.get(k, 0.0) for k in keys))
            self._record_durations(labels, t, [grown_durations[k] for k in keys if k in grown_durations])
        for module in self.modules() - set(min_isr):  # destroyed: its series go with it
            self.store.forget(module=module)

    def _record_durations(self, labels: dict[str, str], t: float,
                          grown: list[dict[tuple[str, str, str], list[float]]]) -> None:
        """The mean duration of the entries of this interval, per histogram, role and type (and all types)."""
        totals: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        for g in grown:
            for (metric, role, typ), (dsum, dcount) in g.items():
                for key in ((metric, role, typ), (metric, role, ALL_TYPES)):
                    totals[key][0] += dsum
                    totals[key][1] += dcount
        for (metric, role, typ), (dsum, dcount) in totals.items():
            if dcount > 0 and role in ROLES:
                self.store.record(DURATIONS[metric], {**labels, "role": role, "type": typ}, t, 1000.0 * dsum / dcount)

    def modules(self) -> set[str]:
        return self.store.label_values("module")

    def chart_data(self, module: str, node: str | None = None, since: float = 0.0, role: str = "leader",
                   entry_type: str = ALL_TYPES) -> list[dict[str, Any]]:
        """Every chart of ``module`` (or of its replicas on ``node``) as plain data: the API's telemetry.

        Selectable charts draw the series of ``role`` and ``entry_type``."""
        labels = {"module": module, **({"node": node} if node else {})}
        chosen = {**labels, "role": role, "type": entry_type}
        return [{"id": c.id, "title": c.title, "unit": c.unit,
                 "series": [{"name": name, "legend": legend,
                             "points": [[p.t, p.v] for p in self.store.get(name, chosen if c.selectable else labels,
                                                                          since)]}
                            for name, legend in c.series.items()]}
                for c in CHARTS]

    def entry_types(self, module: str) -> list[str]:
        """The entry types some selectable series of ``module`` has points for (the page's selector)."""
        return sorted({dict(k).get("type", ALL_TYPES) for name in DURATIONS.values()
                       for k in self.store.select(name, module=module)} | {ALL_TYPES})

    def points(self, name: str, labels: Mapping[str, str]) -> list[Point]:
        return self.store.get(name, labels)


class Scraper:
    """A daemon thread that scrapes every live worker each ``telemetry.interval_s`` and feeds ``telemetry``."""

    def __init__(self, ms: Metastore, telemetry: Telemetry, tls: LinkContexts | None = None) -> None:
        self.ms = ms
        self.telemetry = telemetry
        #: the conductor's certificate: workers that serve TLS (their znode's ``secure``) are read over HTTPS
        self.tls = tls
        #: node id -> its last scrape (address, time, error)
        self.last: dict[str, ScrapeState] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conductor-ui-scraper", daemon=True)

    def start(self) -> Scraper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=SCRAPE_TIMEOUT_S * 2)

    def _run(self) -> None:
        while not self._stop.wait(self.telemetry.interval_s):
            try:
                self.scrape_once()
            except (MetastoreError, OSError) as e:  # ZooKeeper away: the charts get a gap, the thread lives on
                log.warning("telemetry scrape failed: %s", e)
            except Exception:
                log.exception("telemetry scrape failed")

    def scrape_once(self) -> None:
        """One round: read the workers' metrics addresses and every module's min-ISR, scrape, ingest."""
        addresses: dict[str, str] = {}
        secure: set[str] = set()
        for node in self.ms.nodes.live():
            info = self.ms.nodes.get(node)
            if info is not None and info.metrics:
                addresses[node] = info.metrics
                if info.secure:
                    secure.add(node)
        min_isr: dict[str, int] = {}
        for module in self.ms.modules.names():
            try:
                min_isr[module] = int(self.ms.modules.get(module)[0].option(MIN_ISR))
            except ModuleNotFound:
                continue
        results: dict[str, list[Sample]] = {}
        states: dict[str, ScrapeState] = {}
        if addresses:
            with ThreadPoolExecutor(max_workers=min(_MAX_PARALLEL_SCRAPES, len(addresses))) as pool:
                futures = {n: pool.submit(scrape, a, SCRAPE_TIMEOUT_S, *((self.tls, Identity("worker", n))
                                                                          if n in secure else (None, None)))
                           for n, a in addresses.items()}
                for node, f in futures.items():
                    state = ScrapeState(addresses[node], at=time.time())
                    try:
                        results[node] = f.result()
                        state.samples = len(results[node])
                    except (OSError, ValueError) as e:
                        state.error = f"{type(e).__name__}: {e}"
                    states[node] = state
        self.last = states
        self.telemetry.ingest(time.time(), results, min_isr)
