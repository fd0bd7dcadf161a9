"""The promise rule of depot trims (replog.trims), pure; the simulator checks it under faults (tests/sim)."""

from __future__ import annotations

import pytest

from replog.trims import trim_point


def test_trim_point_is_the_promise_rule() -> None:
    assert trim_point(5, 10, 20) == 10  # never below the start
    assert trim_point(15, 10, 20) == 15
    assert trim_point(99, 10, 20) == 20  # never above the applied end
    assert trim_point(7, 10, 10) == 10  # nothing applied above the start: nothing to trim


def test_trim_point_refuses_a_start_above_the_applied_end() -> None:
    with pytest.raises(AssertionError):
        trim_point(5, 12, 10)
