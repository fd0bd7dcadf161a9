"""`conductor status` (and `--watch`, which renders the same view every second) shows a reassignment in progress:
its groups by phase, and the running far-horizon copies' bytes, rate and ETA (issue 27)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from rich.console import Console

from conductor.cli_views import module_view
from conductor.metastore.plans import ReassignmentPlan
from conductor.status import plan_overview
from replog.messages import GroupState

MB = 1_000_000
LIMIT = 64 * 1024 * 1024


def _copy(node: str, done: int, total: int, rate: float, state: str = "copying") -> dict[str, Any]:
    return {"node": node, "leader": "a", "round": 1, "bytes_done": done, "bytes_total": total, "bytes_per_s": rate,
            "state": state}


def _plan_and_groups() -> tuple[ReassignmentPlan, dict[int, tuple[GroupState, int]]]:
    plan = ReassignmentPlan("scale", {g: ("a", "b", "c") for g in range(3)}, replication_factor=3, workers=3)
    copying = GroupState("a", 3, ("a",), ("b", "c"), 5, placement=("a", "b", "c"), adding=("b", "c"),
                         storage=(("a", 1, 1),))
    queued = GroupState("a", 3, ("a",), (), 2, placement=("a",))
    done = GroupState("a", 3, ("a", "b", "c"), (), 9, placement=("a", "b", "c"))
    return plan, {0: (copying, 5), 1: (queued, 2), 2: (done, 9)}


def test_plan_overview_sums_the_running_copies() -> None:
    plan, groups = _plan_and_groups()
    live = {"a": 1, "b": 2, "c": 3}
    catchups = {0: [_copy("b", 10 * MB, 40 * MB, 5 * MB), _copy("c", 20 * MB, 40 * MB, 5 * MB),
                    _copy("d", 1, 2, 1.0, state="installing")]}
    ov = plan_overview(plan, groups, live, catchups, LIMIT)
    assert (ov["groups"], ov["done"], ov["phases"]) == (3, 1, {"copying": 1, "queued": 1})
    assert (ov["copies"], ov["bytes_done"], ov["bytes_total"], ov["bytes_per_s"]) == (2, 30 * MB, 80 * MB, 10 * MB)
    assert ov["eta_s"] == pytest.approx(5.0)  # 50 MB left at 10 MB/s
    assert (ov["replication_factor"], ov["copy_limit_bytes_per_s"]) == (3, LIMIT)
    idle = plan_overview(plan, groups, live, {}, LIMIT)  # copies not started yet: no rate, no ETA
    assert (idle["copies"], idle["bytes_per_s"], idle["eta_s"]) == (0, 0, None)


def _module_status(plan: dict[str, Any] | None) -> dict[str, Any]:
    return {"module": "M", "module_ref": "m.app:M", "tasks": 6, "group_count": 3, "replication_factor": 1,
            "workers": 1, "min_isr": 1, "state": "running", "options": {}, "disallowed_leaders": [], "groups": [],
            "code": None, "serving": 0, "live_nodes": ["a", "b", "c"], "checked_at": time.time(), "plan": plan}


def _render(st: dict[str, Any]) -> str:
    console = Console(record=True, width=220, color_system=None)
    console.print(module_view(st))
    return console.export_text()


def test_module_view_shows_plan_progress_bytes_rate_and_eta() -> None:
    plan, groups = _plan_and_groups()
    ov = plan_overview(plan, groups, {"a": 1, "b": 2, "c": 3},
                       {0: [_copy("b", 10 * MB, 40 * MB, 5 * MB), _copy("c", 20 * MB, 40 * MB, 5 * MB)]}, LIMIT)
    text = _render(_module_status(ov))
    assert "reassignment (scale: RF 3, workers 3)" in text
    assert "1/3 groups done; copying 1 · queued 1" in text
    assert "2 copies: 30.0 MB/80.0 MB  10.0 MB/s  ETA 5s" in text
    assert "(throttle 67.1 MB/s per worker)" in text
    assert "reassignment" not in _render(_module_status(None)), "no plan, no line"
