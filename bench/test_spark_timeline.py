"""bench.spark_timeline's phases, from marks laid out by hand (the benchmark itself runs only when asked)."""

from __future__ import annotations

import pytest

from bench.spark_timeline import DEPOT_PHASES, PHASES, medians, phases
from topology.spark.timeline import Mark

T0 = 1000.0


def at(ms: float, pid: int, event: str, detail: str = "") -> Mark:
    return Mark(T0 + ms / 1000, pid, event, detail)


def test_a_depot_job_splits_into_its_phases() -> None:
    marks = [
        at(-50, 7, "read_end"),  # an earlier job's mark: outside this one
        at(100, 1, "plan_start"), at(103, 1, "plan_leaders"), at(112, 1, "plan_end", "2"),
        at(200, 2, "read_start", "0"), at(201, 2, "stream_open", "0"), at(205, 2, "reply", "4096"),
        at(207, 2, "decoded", "4096"), at(208, 2, "taken", "0"), at(209, 2, "reply", "8192"),
        at(212, 2, "decoded", "8192"), at(213, 2, "taken", "0"), at(290, 2, "read_end", "0"),
        at(210, 3, "read_start", "1"), at(220, 3, "reply", "4096"), at(221, 3, "decoded", "4096"),
        at(222, 3, "taken", "1"), at(300, 3, "read_end", "1"),
    ]
    p = phases(marks, T0, T0 + 0.45)
    assert set(p) == {*PHASES, *DEPOT_PHASES}
    assert p == pytest.approx({"job": 450, "to_plan": 100, "plan": 12, "to_read": 88, "stagger": 10,
                               "first_batch": 10, "read": 100, "tail": 150, "plan_leaders": 3, "first_reply": 7.5,
                               "decode": 3.0},
                              abs=0.01)


def test_the_ceiling_has_no_replies_and_medians_are_per_phase() -> None:
    marks = [at(50, 1, "plan_start"), at(50.2, 1, "plan_end"), at(100, 2, "read_start"), at(101, 2, "taken"),
             at(110, 2, "read_end"), at(104, 3, "read_start"), at(105, 3, "taken"), at(112, 3, "read_end")]
    p = phases(marks, T0, T0 + 0.3)
    assert set(p) == set(PHASES)
    assert p["read"] == pytest.approx(12) and p["first_batch"] == pytest.approx(1) and p["tail"] == pytest.approx(188)
    assert medians([{"job": 1.0}, {"job": 3.0}, {"job": 2.0}]) == {"job": 2.0}


def test_a_job_without_task_marks_is_refused() -> None:
    with pytest.raises(ValueError, match="marks on"):
        phases([at(1, 1, "plan_start"), at(2, 1, "plan_end")], T0, T0 + 1)
