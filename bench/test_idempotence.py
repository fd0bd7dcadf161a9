"""A cheap run of bench.idempotence's measurement (the benchmark itself takes a minute)."""

from __future__ import annotations

from bench.idempotence import _run


def test_both_peers_do_the_same_appends() -> None:
    assert _run(300, 7, True) > 0 and _run(300, 1, False) > 0
