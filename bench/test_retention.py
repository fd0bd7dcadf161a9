"""A cheap run of bench.retention's measurement (the benchmark itself takes about half a minute)."""

from __future__ import annotations

from bench.retention import BOUND, RECORD_BYTES, RECORDS, _run


def test_a_bounded_run_stays_near_its_bound_and_an_unbounded_one_keeps_everything() -> None:
    entries = 2 * BOUND // (RECORDS * RECORD_BYTES)
    bounded, unbounded = _run(entries, True), _run(entries, False)
    assert bounded["peak_bytes"] <= 1.5 * BOUND
    assert unbounded["peak_bytes"] == entries * RECORDS * RECORD_BYTES
