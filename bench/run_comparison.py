"""Two runs of the cluster bench's workloads side by side: a table and the summary's ratios.

``--secure`` compares mutual TLS with plaintext (issue 26), ``--metrics off`` the workers' latency histograms
with none (issue 29): one function, so the two comparisons report the same figures the same way.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

#: the figures compared between two runs
FIGURES = ("p50_ms", "p99_ms", "wire_p50_ms", "pipelined_records_per_s", "pipelined_wire_records_per_s",
           "batched_records_per_s", "batched_wire_records_per_s", "max_node_rss_mb", "verified")


def compare_runs(base: dict[str, Any], other: dict[str, Any], console: Console, *, title: str, names: tuple[str, str],
                 key: str, ratio: str, goals: tuple[float, float], keep: str) -> dict[str, Any]:
    """``other`` against ``base`` (a table of ``other / base``) and the summary's keys: the figures of the run
    named ``keep`` ("base" or "other") under ``key``, ``ratio_p50_<ratio>`` (goal: at most ``goals[0]``) and
    ``ratio_batched_<ratio>`` (goal: at least ``goals[1]``)."""
    assert keep in ("base", "other"), keep
    table = Table(title=title)
    for col in ("figure", *names, f"{names[1]} / {names[0]}"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    for k in FIGURES[:-1]:
        table.add_row(k, f"{base[k]:,}", f"{other[k]:,}", f"{other[k] / base[k]:.2f}" if base[k] else "-")
    console.print(table)
    ratio_p50 = other["p50_ms"] / base["p50_ms"]
    ratio_batched = other["batched_records_per_s"] / base["batched_records_per_s"]
    for name, run in zip(names, (base, other), strict=True):
        if not run["verified"]:
            console.print(f"[red]{name} run: verification failed[/]: {run['append_errors']}")
    kept = base if keep == "base" else other
    return {
        key: {k: kept[k] for k in FIGURES},
        f"ratio_p50_{ratio}": round(ratio_p50, 3),
        f"ratio_batched_{ratio}": round(ratio_batched, 3),
        f"goals_{key}": {f"p50_{ratio}<={goals[0]}": ratio_p50 <= goals[0],
                         f"batched_{ratio}>={goals[1]}": ratio_batched >= goals[1]},
    }
