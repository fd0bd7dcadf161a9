"""The conductor's UI without a cluster: bounded series, telemetry from scraped text, the route table and
its OpenAPI document, the conductor's metrics, and every route served over HTTP from stand-in sources."""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conductor.metastore import GroupState, ModuleNotFound
from conductor.ui import parse_ui_port, serve
from conductor.ui.metrics import RECENT_CHANGES, ConductorMetrics
from conductor.ui.routes import ROUTES, match, openapi
from conductor.ui.series import SeriesStore
from conductor.ui.svg import line_chart, window
from conductor.ui.telemetry import CHARTS, Telemetry, parse_metrics
from tests.json_shape import mismatches


def test_a_series_keeps_its_last_points_and_the_store_refuses_series_past_its_bound() -> None:
    store = SeriesStore(points=3, max_series=2)
    for t in range(5):
        assert store.record("a", {"module": "M"}, float(t), float(t))
    assert [p.t for p in store.get("a", {"module": "M"})] == [2.0, 3.0, 4.0]
    assert store.record("b", {"module": "M"}, 0.0, 1.0)
    assert not store.record("c", {"module": "M"}, 0.0, 1.0) and store.refused == 1
    assert len(store) == 2
    store.forget(module="M")
    assert len(store) == 0


def _worker_text(node: str, leader: bool, appends: int, log_end: int, applied: int, isr: int = 3) -> str:
    lv = f'node="{node}",module="M",group="0"'
    lines = [f'millrace_replica_role{{{lv},role="leader"}} {1 if leader else 0}',
             f'millrace_replica_role{{{lv},role="follower"}} {0 if leader else 1}',
             f"millrace_replog_start_offset{{{lv}}} 0", f"millrace_replog_end_offset{{{lv}}} {log_end}",
             f"millrace_applied_offset{{{lv}}} {applied}", f"millrace_appends_total{{{lv}}} {appends}",
             f"millrace_dead_letters_total{{{lv}}} 0"]
    if leader:
        lines.append(f"millrace_isr_size{{{lv}}} {isr}")
    return "\n".join(["# TYPE millrace_appends counter", *lines]) + "\n"


def test_telemetry_turns_two_scrapes_into_chart_points_per_module_and_per_worker() -> None:
    tel = Telemetry(history_s=60, interval_s=1)
    scrape = {"n1": parse_metrics(_worker_text("n1", True, 100, 101, 100, isr=2)),
              "n2": parse_metrics(_worker_text("n2", False, 0, 101, 90))}
    tel.ingest(1000.0, scrape, {"M": 2})
    scrape = {"n1": parse_metrics(_worker_text("n1", True, 150, 151, 150, isr=2)),
              "n2": parse_metrics(_worker_text("n2", False, 0, 151, 150))}
    tel.ingest(1002.0, scrape, {"M": 2})
    module = {"module": "M"}
    assert [p.v for p in tel.points("appends_per_s", module)] == [25.0]  # 50 appends in 2 s
    assert [p.v for p in tel.points("isr_min", module)] == [2.0, 2.0]
    assert [p.v for p in tel.points("min_isr", module)] == [2.0, 2.0]
    assert [p.v for p in tel.points("apply_lag_max", module)] == [10.0, 0.0]  # n2 applied 90 of 100
    assert [p.v for p in tel.points("replog_entries_max", module)] == [101.0, 151.0]
    assert [p.v for p in tel.points("apply_lag_max", {"module": "M", "node": "n2"})] == [10.0, 0.0]
    assert tel.points("isr_min", {"module": "M", "node": "n2"}) == []  # a follower reports no ISR
    charts = tel.chart_data("M")
    assert [c["id"] for c in charts] == [c.id for c in CHARTS]
    tel.ingest(1004.0, {}, {})  # the module was destroyed
    assert tel.chart_data("M")[0]["series"][0]["points"] == []


def test_a_chart_draws_a_polyline_per_series_and_spans_its_data() -> None:
    series = [{"name": "a", "legend": "A", "points": [[990.0, 1.0], [1000.0, 2.0]]}]
    svg = line_chart("x", series, window_s=60, now=1000.0)
    assert re.search(r'<polyline data-series="a" data-points="2"', svg)
    assert window([{"series": series}], history_s=3600, now=1000.0) == 60
    assert window([{"series": [{"points": [[0.0, 1.0]]}]}], history_s=3600, now=1000.0) == 1000


def test_the_ui_port_is_a_port_or_off() -> None:
    assert parse_ui_port("8888") == 8888 and parse_ui_port("0") == 0 and parse_ui_port("off") is None
    with pytest.raises(ValueError):
        parse_ui_port("70000")


def test_the_openapi_document_covers_every_route() -> None:
    doc = json.loads(json.dumps(openapi()))  # plain JSON
    assert doc["openapi"] == "3.1.0" and doc["info"]["title"]
    assert set(doc["paths"]) == {r.pattern for r in ROUTES}
    ids = [op["get"]["operationId"] for op in doc["paths"].values()]
    assert len(ids) == len(set(ids))
    for pattern, item in doc["paths"].items():
        op = item["get"]
        assert set(item) == {"get"} and op["summary"] and "200" in op["responses"]
        declared = {p["name"] for p in op["parameters"] if p["in"] == "path"}
        assert declared == set(re.findall(r"\{(\w+)\}", pattern)), pattern
        for p in op["parameters"]:
            assert p["in"] in ("path", "query") and p["schema"]["type"] == "string"
            assert p["required"] is (p["in"] == "path")
    assert match("/api/modules/Clicks/telemetry")[1] == {"module": "Clicks"}
    schemas = doc["components"]["schemas"]
    for r in ROUTES:
        (media,) = doc["paths"][r.pattern]["get"]["responses"]["200"]["content"].values()
        ref = media["schema"].get("$ref", "")
        assert (r.kind == "json") == ref.startswith("#/components/schemas/"), r.pattern
        assert ref == "" or ref.rsplit("/", 1)[1] in schemas
    assert mismatches(doc, {"$ref": "#/components/schemas/OpenAPI"}, schemas) == []
    assert mismatches({"zk": 1, "nodes": [{"node": "n1"}]}, schemas["Status"], schemas) == [
        "$: missing 'modules'", "$.zk: int is not string", "$.nodes[0]: missing 'address'",
        "$.nodes[0]: missing 'leaders_allowed'", "$.nodes[0]: missing 'metrics'", "$.nodes[0]: missing 'pid'",
        "$.nodes[0]: missing 'replication'", "$.nodes[0]: missing 'started'"]


def _state(leader: str | None, epoch: int) -> GroupState:
    return dataclasses.replace(GroupState.initial(["n1", "n2", "n3"], leader_session=1), leader=leader, epoch=epoch)


def test_conductor_metrics_count_what_the_controller_reports() -> None:
    m = ConductorMetrics()
    m.transition("M", 0, _state("n1", 1), _state("n2", 2), None)
    m.cas_conflict("M")
    m.balancing_move("M", 1, "n2", "n3", 2)
    m.group_seen("M", 2, _state(None, 3))
    m.reassignment_step("M", "start")
    m.reassignment_step("M", "complete")
    m.reassignment_done("M", cancelled=False)
    values = {(s.name, s.labels.get("group")): s.value
              for f in text_string_to_metric_families(_text(m)) for s in f.samples}
    assert values[("millrace_conductor_elections_total", None)] == 1
    assert values[("millrace_conductor_cas_conflicts_total", None)] == 1
    assert values[("millrace_conductor_balancing_moves_total", None)] == 1
    assert values[("millrace_conductor_reassignments_total", None)] == 1
    steps = {s.labels["step"]: s.value for f in text_string_to_metric_families(_text(m)) for s in f.samples
             if s.name == "millrace_conductor_reassignment_steps_total"}
    assert steps == {"start": 1, "complete": 1}
    assert ("millrace_conductor_group_leaderless_for_seconds", "2") in values
    m.group_seen("M", 2, _state("n1", 4))
    assert m.leaderless() == {}
    assert [c["reason"] for c in m.recent_changes()] == ["leadership balancing", "failover: leader n1 lost or "
                                                         "restarted"]
    for i in range(RECENT_CHANGES + 5):
        m.cas_conflict("M")
        m.balancing_move("M", i, "n1", "n2", 1)
    assert len(m.recent_changes()) == RECENT_CHANGES


def _text(m: ConductorMetrics) -> str:
    from prometheus_client import generate_latest
    return generate_latest(m.registry).decode()


class _Nodes:
    def live(self) -> list[str]:
        return []


class _Modules:
    def names(self) -> list[str]:
        return []


class _Metastore:
    nodes = _Nodes()
    modules = _Modules()


MODULE_DOC: dict[str, Any] = {
    "module": "M", "module_ref": "examples.clicks:Clicks", "tasks": 2, "group_count": 1, "replication_factor": 3,
    "workers": 3, "min_isr": 2, "options": {}, "effective_options": {"replication.min.isr": "2"},
    "code": {"version": "abc", "initial_version": "abc", "switching": [0], "migrations": {}},
    "live_nodes": ["n1", "n2"], "serving": 0, "checked_at": 0.0, "state": "running", "disallowed_leaders": [],
    "groups": [{"group": 0, "tasks": [0, 1], "leader": None, "leader_address": None, "epoch": 3,
                "isr": ["n3"], "osr": ["n1", "n2"], "elr": [], "replicas": ["n1", "n2", "n3"],
                "leaderless_reason": "no live ISR member", "replica": None, "followers": [], "serving": False,
                "problem": "no live ISR member", "faults": [], "handing_off_to": None,
                "catchups": [{"node": "n1", "leader": "n3", "round": 2, "bytes_done": 1000, "bytes_total": 4000,
                              "bytes_per_s": 500.0, "state": "copying"}]}],
}


def _status(module: str | None) -> dict[str, Any]:
    if module is None:
        return {"zk": "127.0.0.1:2181", "nodes": [], "modules": []}
    if module != "M":
        raise ModuleNotFound(module)
    return MODULE_DOC


@pytest.fixture
def ui() -> Iterator[str]:
    running = serve(_Metastore(), ConductorMetrics(), "c1", lambda: True, _status, "127.0.0.1", 0,  # type: ignore[arg-type]
                    interval_s=60, history_s=600)
    try:
        yield f"http://{running.address}"
    finally:
        running.stop()


def test_every_route_answers_and_json_routes_return_their_documented_shape(ui: str) -> None:
    schemas = openapi()["components"]["schemas"]
    for route in ROUTES:
        path = route.pattern.replace("{module}", "M")
        with urllib.request.urlopen(ui + path, timeout=10) as r:
            body = r.read()
            assert r.status == 200, path
        if route.kind == "json":
            assert mismatches(json.loads(body), schemas[route.schema], schemas) == [], path
    assert json.loads(urllib.request.urlopen(ui + "/api/modules/M", timeout=10).read()) == MODULE_DOC


def test_a_leaderless_group_is_a_red_problem_and_unknown_paths_are_404(ui: str) -> None:
    html = urllib.request.urlopen(ui + "/modules/M", timeout=10).read().decode()
    assert '<td data-field="problem" class="problem">no live ISR member</td>' in html
    assert '<td data-field="leader" class="problem">none</td>' in html
    assert '<td data-field="bytes_done">1000</td>' in html and '<td data-field="eta">6 s</td>' in html
    assert "task groups 0 still run the previous one" in html
    for path in ("/modules/Nope", "/api/modules/Nope", "/nothing-here"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(ui + path, timeout=10)
        assert e.value.code == 404, path
