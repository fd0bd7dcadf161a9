"""deploy/: the Prometheus alerting rules pass ``promtool`` (check and unit tests), and the Grafana dashboard
has the shape Grafana loads and queries only metrics the workers and the conductor export."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from conductor.ui.metrics import ConductorMetrics
from conductor.worker.metrics import node_registry

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "millrace-alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "millrace.json"
#: the alerts the rules file must define (issue 29)
ALERTS = {"MillraceIsrBelowMinIsr", "MillraceGroupWithoutLeader", "MillraceGroupStalled", "MillraceDeadLettersGrowing"}


def _promtool(*args: str) -> str:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make apt` installs Debian's prometheus package, which has it"
    done = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=RULES.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_promtool_accepts_the_alerting_rules() -> None:
    out = _promtool("check", "rules", RULES.name)
    assert f"SUCCESS: {len(ALERTS)} rules found" in out
    assert set(re.findall(r"alert: (\w+)", RULES.read_text())) == ALERTS


def test_each_alert_fires_in_promtools_rule_tests() -> None:
    _promtool("test", "rules", "millrace-alerts.test.yml")
    tested = set(re.findall(r"alertname: (\w+)", (RULES.parent / "millrace-alerts.test.yml").read_text()))
    assert tested == ALERTS


def exported_series() -> set[str]:
    """Every series name a worker and a conductor export (a counter ``x`` as ``x_total``, a histogram's
    ``_bucket``, ``_sum`` and ``_count``)."""
    names = set()
    for registry in (node_registry("n1", lambda: []), ConductorMetrics().registry):
        for family in registry.collect():
            if family.type == "histogram":
                names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
            else:
                names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


#: what a dashboard needs for Grafana to load it (a subset of Grafana's dashboard schema, schemaVersion 39)
SCHEMA: dict[str, type | tuple[type, ...]] = {
    "title": str, "uid": str, "schemaVersion": int, "panels": list, "templating": dict, "time": dict,
    "refresh": str, "tags": list, "editable": bool, "annotations": dict,
}
PANEL_TYPES = {"row", "timeseries", "stat", "table", "gauge"}


def _check(doc: dict[str, Any], schema: dict[str, Any], where: str) -> None:
    for key, kind in schema.items():
        assert key in doc, f"{where}: missing {key!r}"
        assert isinstance(doc[key], kind), f"{where}.{key}: {type(doc[key]).__name__}, expected {kind}"


def test_the_dashboard_has_grafanas_shape_and_queries_only_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    _check(dash, SCHEMA, "dashboard")
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", dash["uid"])
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "module"} <= variables
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    exported = exported_series()
    queried: set[str] = set()
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        where = f"panel {p['id']} {p.get('title')!r}"
        _check(p, {"id": int, "type": str, "title": str, "gridPos": dict}, where)
        assert p["type"] in PANEL_TYPES, where
        g = p["gridPos"]
        assert all(isinstance(g[k], int) and g[k] >= 0 for k in ("h", "w", "x", "y")), where
        assert g["x"] + g["w"] <= 24, f"{where} is wider than Grafana's 24 columns"
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{where} overlaps another panel"
                cells.add((x, y))
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert p["targets"], where
        for t in p["targets"]:
            _check(t, {"refId": str, "expr": str}, where)
            assert t["expr"].count("(") == t["expr"].count(")"), f"{where}: unbalanced {t['expr']}"
            queried |= set(re.findall(r"\b(millrace_[a-z_]+)", t["expr"]))
    assert queried - exported == set(), "the dashboard queries metrics nothing exports"
    for needed in ("millrace_isr_size", "millrace_appends_total", "millrace_conductor_elections_total",
                   "millrace_conductor_cas_conflicts_total", "millrace_conductor_balancing_moves_total",
                   "millrace_conductor_group_leaderless_for_seconds", "millrace_append_to_ack_seconds_bucket",
                   "millrace_replicate_duration_seconds_bucket", "millrace_apply_duration_seconds_bucket",
                   "millrace_replicate_failures_total", "millrace_replog_bytes", "millrace_pstate_bytes"):
        assert needed in queried, needed


def test_the_alerting_rules_use_only_exported_metrics() -> None:
    used = set(re.findall(r"\b(millrace_[a-z_]+)", RULES.read_text()))
    assert used and used - exported_series() == set()
