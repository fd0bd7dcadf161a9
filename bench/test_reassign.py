"""Cheap checks of bench.reassign's context figures (the benchmark itself starts a cluster)."""

from __future__ import annotations

import math
from pathlib import Path

from bench.reassign import first_isr_join, mixed_p99, slowest, slowest_by_phase


def test_the_rf3_floor_mixes_the_two_rates_by_the_share_of_the_window_each_covers() -> None:
    rf1, rf3 = [1.0] * 99 + [10.0], [5.0] * 98 + [20.0] * 2
    assert mixed_p99(rf1, rf3, 1000, 0) == 1.0  # all at RF 1: the steady p99 itself
    assert mixed_p99(rf1, rf3, 0, 1000) == 20.0  # all at RF 3: the p99 at RF 3
    assert mixed_p99(rf1, rf3, 1000, 250) == 10.0  # the top 1% of 1,250: RF 1's slowest tenth and RF 3's five
    assert mixed_p99(rf1, rf3, 1000, 20) == 10.0  # (RF 3's few: RF 1's slowest are the top 1%)


def test_the_first_isr_join_is_the_first_isr_of_more_than_one_replica(tmp_path: Path) -> None:
    (tmp_path / "node-n1.log").write_text(
        "2026-11-28 00:18:08,433 n1 WARNING millrace.node: Life/0: ISR now ['n1'] (OSR [])\n"
        "2026-11-28 00:18:21,100 n1 WARNING millrace.node: Life/1: ISR now ['n1', 'n2'] (OSR ['n3'])\n"
        "2026-11-28 00:18:20,954 n1 WARNING millrace.node: Life/0: ISR now ['n1', 'n3'] (OSR ['n2'])\n")
    first = first_isr_join(tmp_path)
    assert round(first % 60, 3) == 20.954
    assert math.isnan(first_isr_join(tmp_path / "none"))


def test_the_slowest_appends_are_counted_in_the_phase_they_ended_in() -> None:
    # 200 gaps, one every 10 ms from t=0: two slow ones while copying (t in [0.5, 1.5)), one after the installs
    gaps = [(k / 100, 3.0) for k in range(200)]
    gaps[60], gaps[70], gaps[180] = (0.60, 40.0), (0.70, 12.0), (1.80, 30.0)
    assert slowest(gaps) == [(0.60, 40.0), (1.80, 30.0)]
    got = slowest_by_phase(gaps, slowest(gaps), [("before", 0.0), ("copying", 0.5), ("after", 1.5)], 2.0,
                           over_ms=10.0)
    assert got["before"] == {"s": 0.5, "appends": 50, "in_top_1pct": 0, "over_bound": 0, "max_ms": 3.0}
    assert got["copying"] == {"s": 1.0, "appends": 100, "in_top_1pct": 1, "over_bound": 2, "max_ms": 40.0}
    assert got["after"] == {"s": 0.5, "appends": 50, "in_top_1pct": 1, "over_bound": 1, "max_ms": 30.0}
