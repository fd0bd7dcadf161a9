"""Prometheus metrics of each hosted replica's depot partitions: start and end offsets, records and bytes held.

Apart from :mod:`conductor.worker.metrics` because they are per depot partition (labels ``depot`` and
``task``), read from the store's ``_meta`` at scrape time (pstate.retention: bytes are estimated between
retention marks after a trim at an arbitrary offset).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("millrace.node")


class DepotCollector(Collector):
    """``millrace_depot_{start_offset,end_offset,records,bytes}`` per (node, module, group, depot, task)."""

    def __init__(self, node_id: str, replicas: Callable[[], Iterable[Any]]) -> None:
        self.node_id = node_id
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        labels = ["node", "module", "group", "depot", "task"]
        families = {
            "start": GaugeMetricFamily("millrace_depot_start_offset", "first offset a depot partition holds "
                                       "(retention and trims move it)", labels=labels),
            "end": GaugeMetricFamily("millrace_depot_end_offset", "next offset a depot partition appends (applied)",
                                     labels=labels),
            "records": GaugeMetricFamily("millrace_depot_records", "records a depot partition holds (end - start "
                                         "less those key compaction deleted)", labels=labels),
            "bytes": GaugeMetricFamily("millrace_depot_bytes", "bytes of records a depot partition holds",
                                       labels=labels),
        }
        for host in self.replicas():
            try:
                sizes = host.store.depot_sizes()
            except Exception:  # its store is closing (a restart, a far-horizon install): next scrape
                log.debug("%s: no depot sizes", host.name, exc_info=True)
                continue
            for depot, task, s in sizes:
                lv = [self.node_id, host.module, str(host.group), depot, str(task)]
                for key, family in families.items():
                    family.add_metric(lv, getattr(s, key))
        yield from families.values()
