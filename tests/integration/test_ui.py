"""The conductor's web UI in a real browser against a real cluster: ZooKeeper, a conductor, three workers.

Debian's ``chromium`` (``make apt`` installs it) is started headless by the test for every page: it loads
the page from the conductor (``--dump-dom`` returns the document it rendered, ``--screenshot`` paints it),
so what is checked is what an operator's browser shows. Every page renders; the module and cluster pages'
numbers match ``conductor status --json`` taken just before and just after (the cluster is quiet then, so
both snapshots agree and "the same moment" is a fact the test checks); the charts have points after a
writer ran; a failover shows on the leadership page and in the conductor's /metrics; a screenshot of the
module page is written to the test's tmp_path.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import conductor
from conductor.cli import app
from conductor.client import Cluster
from conductor.devcluster import DevCluster
from tests.integration.cluster_helpers import Appender, converged, deploy, groups_of, wait_for
from tests.json_shape import mismatches

MODULE = "Clicks"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Browser:
    """Headless Chromium, one process per page (a profile of its own under the test's directory)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.profile = out / "chromium-profile"

    def _run(self, *args: str) -> str:
        assert CHROMIUM is not None, "chromium is missing: `make apt` installs Debian's chromium package"
        done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                               "--no-first-run", f"--user-data-dir={self.profile}", *args],
                              capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    def dom(self, url: str) -> str:
        """The document as the browser built it."""
        return self._run("--dump-dom", url)

    def screenshot(self, url: str, name: str, size: str = "1400,1900") -> Path:
        path = self.out / name
        self._run(f"--screenshot={path}", f"--window-size={size}", "--hide-scrollbars", url)
        assert path.exists() and path.stat().st_size > 10_000, "the screenshot is empty"
        return path


class Cells(HTMLParser):
    """Reads ``<tr data-KEY=...><td data-field=...>`` tables and the charts' ``<polyline>`` elements."""

    def __init__(self, row_key: str) -> None:
        super().__init__()
        self.row_key = f"data-{row_key}"
        self.rows: dict[str, dict[str, str]] = {}
        self.polylines: list[dict[str, str]] = []
        self.titles: list[str] = []
        self._row: str | None = None
        self._field: str | None = None
        self._text = ""
        self._in_h1 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "tr" and self.row_key in a:
            self._row = a[self.row_key]
            self.rows[self._row] = {}
        elif tag == "td" and self._row is not None and "data-field" in a:
            self._field, self._text = a["data-field"], ""
        elif tag == "polyline":
            self.polylines.append(a)
        elif tag == "h1":
            self._in_h1 = True

    def handle_data(self, data: str) -> None:
        if self._field is not None:
            self._text += data
        if self._in_h1:
            self.titles.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._field is not None and self._row is not None:
            self.rows[self._row][self._field] = self._text.strip()
            self._field = None
        elif tag == "tr":
            self._row = None
        elif tag == "h1":
            self._in_h1 = False


def parse(html: str, row_key: str) -> Cells:
    cells = Cells(row_key)
    cells.feed(html)
    return cells


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def cli_json(dc: DevCluster, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["status", *args, "--json", "--zk", dc.hosts], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.output)
    return doc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevCluster, str]]:
    mp = pytest.MonkeyPatch()
    mp.setenv("MILLRACE_UI_SCRAPE_INTERVAL", "0.5")  # the conductor's scraper: points within seconds
    port = _free_port()
    dc = DevCluster(tmp_path_factory.mktemp("ui") / "cluster", nodes=3, session_timeout=4.0, balance_interval=0,
                    ui_port=port)
    dc.start()
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(base), 30, "the conductor's UI to answer")
        deploy(dc, MODULE, tasks=4, threads=2)
        yield dc, base
    finally:
        dc.stop()
        mp.undo()


def _answers(base: str) -> bool:
    try:
        urllib.request.urlopen(f"{base}/api/status", timeout=2).read()
        return True
    except OSError:
        return False


def test_a_failover_shows_on_the_leadership_page_and_in_the_conductors_metrics(cluster: Any, tmp_path: Path) -> None:
    dc, base = cluster
    victim = groups_of(dc, MODULE)[0].leader
    assert victim is not None
    dc.nodes[victim].stop()  # a clean stop unregisters at once: the conductor elects another leader
    wait_for(lambda: all(st.leader not in (None, victim) for st in groups_of(dc, MODULE).values()), 30,
             f"every group to be led by another node than {victim}")
    changes = wait_for(lambda: get_json(f"{base}/api/leadership")["changes"], 10, "a leadership change")
    assert any(c["from"] == victim and c["module"] == MODULE and c["group"] == 0 for c in changes), changes
    metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    assert f'millrace_conductor_elections_total{{module="{MODULE}"}}' in metrics
    html = Browser(tmp_path).dom(f"{base}/leadership")
    assert parse(html, "group").titles == ["Leadership"]
    assert f'<td data-field="from">{victim}</td>' in html
    Browser(tmp_path).screenshot(f"{base}/leadership", "leadership-page.png", size="1400,600")
    dc.start_node(victim)
    dc.wait_nodes([victim])
    wait_for(lambda: converged(dc, MODULE), 60, "the restarted node to rejoin every ISR")


def test_pages_render_and_their_numbers_match_conductor_status_json(cluster: Any, tmp_path: Path) -> None:
    dc, base = cluster
    with Cluster.connect(dc.hosts, timeout_s=30) as client:
        writer = Appender(client.depot(MODULE, "*clicks"), ack="applied", window=16).start()
        try:
            wait_for(lambda: writer.count() >= 300, 60, "300 acknowledged appends")
            # the charts' rate needs two scrapes while the writer runs
            wait_for(lambda: _peak(base, "appends", "appends_per_s") > 0, 30, "a positive appends/s point")
        finally:
            writer.stop()
    assert writer.errors == [] and writer.count() >= 300
    wait_for(lambda: converged(dc, MODULE), 60, "the replicas to converge")
    browser = Browser(tmp_path)

    # The cluster page and /api/status are `conductor status --json`.
    before = cli_json(dc)
    assert get_json(f"{base}/api/status") == before
    cluster_dom = browser.dom(f"{base}/")
    assert cli_json(dc) == before, "the cluster changed while the page was read"
    workers = parse(cluster_dom, "node").rows
    assert sorted(workers) == [n["node"] for n in before["nodes"]]
    for n in before["nodes"]:
        assert workers[n["node"]]["address"] == n["address"]
        assert workers[n["node"]]["metrics"] == n["metrics"] != ""
        assert workers[n["node"]]["pid"] == str(n["pid"])
        assert workers[n["node"]]["problem"] == "ok"
        assert workers[n["node"]]["version"] == n["version"] == conductor.__version__, "each worker's version"
    modules = parse(cluster_dom, "module").rows
    (m,) = before["modules"]
    assert modules[MODULE]["groups_led"] == f"{m['groups_led']}/{m['groups_total']}" == "2/2"
    assert modules[MODULE]["min_isr"] == str(m["min_isr"])

    # The module page's table is `conductor status MODULE --json`.
    before = cli_json(dc, MODULE)
    module_html = browser.dom(f"{base}/modules/{MODULE}")
    after = cli_json(dc, MODULE)
    api = get_json(f"{base}/api/modules/{MODULE}")
    for doc in (after, api):
        assert [_numbers(g) for g in doc["groups"]] == [_numbers(g) for g in before["groups"]], \
            "the cluster changed while the page was read"
    page = parse(module_html, "group")
    assert sorted(page.rows, key=int) == [str(g["group"]) for g in before["groups"]]
    for g in before["groups"]:
        row = page.rows[str(g["group"])]
        shown = {k: row[k] for k in ("leader", "epoch", "isr", "osr", "log_end", "apply_offset", "dead_letters")}
        assert shown == {k: str(v) for k, v in _numbers(g).items()}
        assert row["problem"] == "ok"
        assert int(row["log_end"]) > 0

    # Each depot's size: records held and offsets summed over its partitions, as the leaders report them.
    depots = parse(module_html, "depot").rows
    assert sorted(depots) == [d["depot"] for d in before["depots"]] == [d["depot"] for d in after["depots"]]
    for d in before["depots"]:
        shown = {k: depots[d["depot"]][k] for k in ("partitions", "records", "start", "end", "problem")}
        assert shown == {"partitions": str(len(d["partitions"])), "records": str(d["records"]),
                         "start": str(d["start"]), "end": str(d["end"]), "problem": "ok"}
        assert d["groups_reporting"] == len(before["groups"])
    (clicks,) = [d for d in before["depots"] if d["depot"] == "*clicks"]
    assert clicks["records"] >= writer.count() and clicks["end"] >= writer.count()

    # Every chart has points, and the appends chart saw the writer.
    assert {p["data-series"] for p in page.polylines} >= {"isr_min", "min_isr", "appends_per_s", "apply_lag_max",
                                                          "replog_entries_avg", "replog_entries_max"}
    assert all(int(p["data-points"]) >= 2 for p in page.polylines), page.polylines
    node = before["groups"][0]["leader"]  # a leader: its ISR series has points too
    per_node = parse(browser.dom(f"{base}/modules/{MODULE}?node={node}"), "group")
    assert all(int(p["data-points"]) >= 2 for p in per_node.polylines), per_node.polylines

    shot = browser.screenshot(f"{base}/modules/{MODULE}", "module-page.png")
    print(f"screenshot of the module page: {shot}")
    browser.screenshot(f"{base}/", "cluster-page.png", size="1400,700")


def _numbers(g: dict[str, Any]) -> dict[str, Any]:
    r = g["replica"] or {}
    return {"leader": g["leader"], "epoch": g["epoch"], "isr": ",".join(g["isr"]) or "-",
            "osr": ",".join(g["osr"]) or "-", "log_end": r.get("log_end"), "apply_offset": r.get("apply_offset"),
            "dead_letters": r.get("dead_letters")}


def _peak(base: str, chart: str, series: str) -> float:
    doc = get_json(f"{base}/api/modules/{MODULE}/telemetry")
    (c,) = [c for c in doc["charts"] if c["id"] == chart]
    (s,) = [s for s in c["series"] if s["name"] == series]
    return max((v for _t, v in s["points"]), default=0.0)


def test_the_openapi_document_describes_every_route_and_404s_are_plain(cluster: Any) -> None:
    _dc, base = cluster
    doc = get_json(f"{base}/openapi.json")
    assert doc["openapi"].startswith("3.1")
    assert "/api/modules/{module}/telemetry" in doc["paths"]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{base}/api/modules/Nope", timeout=10)
    assert e.value.code == 404 and "Nope" in json.loads(e.value.read())["error"]
    schemas = doc["components"]["schemas"]
    for path, item in doc["paths"].items():
        ref = next(iter(item["get"]["responses"]["200"]["content"].values()))["schema"].get("$ref")
        if ref:  # a JSON route: the real document has the documented shape
            real = get_json(base + path.replace("{module}", MODULE))
            assert mismatches(real, {"$ref": ref}, schemas) == [], path
