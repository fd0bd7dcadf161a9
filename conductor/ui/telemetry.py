"""Replication telemetry: scrape every worker's Prometheus endpoint and keep chart series in memory.

The workers already export what a chart needs (``conductor/worker/metrics.py``: role, offsets, ISR size,
counters); the conductor finds each endpoint in the worker's znode (``NodeInfo.metrics``) and scrapes them
all every ``interval_s`` on one thread. What it keeps is not the raw samples (dozens per replica) but the
few series the charts draw, per module and per module and worker (:data:`CHARTS`), in a
:class:`~conductor.ui.series.SeriesStore` sized for ``history_s``.

A chart is data (:class:`Chart`: series names and how to draw them), so a new one (the workers' latency
histograms, when they come) is a new entry and a line in :meth:`Telemetry.ingest`, not a new page.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from conductor.metastore import Metastore, MetastoreError, ModuleNotFound
from conductor.metastore.module_spec import MIN_ISR
from conductor.ui.series import Point, SeriesStore

log = logging.getLogger("millrace.conductor.ui")

#: seconds one scrape of one worker may take before it counts as failed
SCRAPE_TIMEOUT_S = 2.0
_MAX_PARALLEL_SCRAPES = 8


@dataclass(frozen=True)
class Chart:
    """One chart of the module page: its series (name -> legend) drawn over time on one y axis."""

    id: str
    title: str
    unit: str
    series: dict[str, str]


CHARTS = (
    Chart("isr", "ISR count: the smallest ISR across task groups, against min-ISR", "replicas",
          {"isr_min": "smallest ISR", "min_isr": "min-ISR"}),
    Chart("appends", "Appends answered per second (leaders)", "appends/s", {"appends_per_s": "appends/s"}),
    Chart("apply_lag", "Apply lag: entries written but not yet applied (largest replica)", "entries",
          {"apply_lag_max": "largest"}),
    Chart("replog", "Replog entries per replica (average and largest)", "entries",
          {"replog_entries_avg": "average", "replog_entries_max": "largest"}),
    Chart("dead_letters", "Dead letters (leaders, total)", "records", {"dead_letters": "dead letters"}),
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


def scrape(address: str, timeout_s: float = SCRAPE_TIMEOUT_S) -> list[Sample]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as reply:
        return parse_metrics(reply.read().decode())


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
        #: the previous appends counter of each replica, for rates: key -> (time, value)
        self._previous: dict[tuple[str, str, int], tuple[float, float]] = {}

    def ingest(self, t: float, samples_by_node: Mapping[str, Iterable[Sample]], min_isr: Mapping[str, int]) -> None:
        """Turn one round of scrapes into a point of every chart series, per module and per module and node."""
        replicas = _replicas(samples_by_node)
        rates: dict[tuple[str, str, int], float] = {}
        for key, r in replicas.items():
            prev = self._previous.get(key)
            if prev is not None and t > prev[0]:
                grown = r.appends - prev[1] if r.appends >= prev[1] else r.appends  # a restart resets it
                rates[key] = grown / (t - prev[0])
            self._previous[key] = (t, r.appends)
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
        for module in self.modules() - set(min_isr):  # destroyed: its series go with it
            self.store.forget(module=module)

    def modules(self) -> set[str]:
        return self.store.label_values("module")

    def chart_data(self, module: str, node: str | None = None, since: float = 0.0) -> list[dict[str, Any]]:
        """Every chart of ``module`` (or of its replicas on ``node``) as plain data: the API's telemetry."""
        labels = {"module": module, **({"node": node} if node else {})}
        return [{"id": c.id, "title": c.title, "unit": c.unit,
                 "series": [{"name": name, "legend": legend,
                             "points": [[p.t, p.v] for p in self.store.get(name, labels, since)]}
                            for name, legend in c.series.items()]}
                for c in CHARTS]

    def points(self, name: str, labels: Mapping[str, str]) -> list[Point]:
        return self.store.get(name, labels)


class Scraper:
    """A daemon thread that scrapes every live worker each ``telemetry.interval_s`` and feeds ``telemetry``."""

    def __init__(self, ms: Metastore, telemetry: Telemetry) -> None:
        self.ms = ms
        self.telemetry = telemetry
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
        for node in self.ms.nodes.live():
            info = self.ms.nodes.get(node)
            if info is not None and info.metrics:
                addresses[node] = info.metrics
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
                futures = {n: pool.submit(scrape, a) for n, a in addresses.items()}
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
