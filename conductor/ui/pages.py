"""The UI's HTML pages, rendered on the server from the same plain data the JSON API returns.

Made to be read at 3 a.m.: black on white, plain tables, a ``problem`` column whose text is red, no
animation, nothing that needs JavaScript. Every number in a table cell carries ``data-field`` (and its row
``data-group`` or ``data-node``), so a script or the browser test can read a page back without guessing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from conductor.ui.svg import legend, line_chart, span, window


def _e(value: Any) -> str:
    return escape("-" if value is None or value == "" else str(value))


def _nodes(names: Sequence[str]) -> str:
    return ",".join(names) if names else "-"


def _when(t: float | None) -> str:
    return "-" if not t else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _cell(field: str, value: Any, cls: str = "") -> str:
    klass = f' class="{cls}"' if cls else ""
    return f'<td data-field="{field}"{klass}>{_e(value)}</td>'


def _problem(text: str | None) -> str:
    return f'<td data-field="problem" class="problem">{escape(text)}</td>' if text else \
        '<td data-field="problem" class="ok">ok</td>'


def _table(headers: Iterable[str], rows: Iterable[str], table_id: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def page(title: str, body: str, refresh_s: int | None = 10) -> str:
    """A whole HTML document around ``body``, with the navigation; it reloads itself every ``refresh_s``."""
    meta = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    nav = ('<nav><a href="/">cluster</a> · <a href="/leadership">leadership changes</a> · '
           '<a href="/openapi.json">API</a> · <a href="/metrics">metrics</a></nav>')
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{meta}<title>{escape(title)} · '
            f'Millrace</title><link rel="stylesheet" href="/static/style.css"></head><body>{nav}'
            f'<h1>{escape(title)}</h1>{body}<footer>rendered {_when(time.time())}</footer></body></html>')


def cluster_page(ov: dict[str, Any], scrapes: dict[str, dict[str, Any]], conductor: dict[str, Any]) -> str:
    """Workers (addresses, state, last scrape) and modules (led groups, state)."""
    head = (f'<p>ZooKeeper <b>{_e(ov["zk"])}</b> · this conductor <b>{_e(conductor["name"])}</b> '
            f'({"active" if conductor["active"] else "standby"}) · {len(ov["nodes"])} live worker(s)</p>')
    workers = []
    for n in ov["nodes"]:
        scrape = scrapes.get(n["node"])
        if not n["metrics"]:
            problem = "no metrics address registered"
        elif scrape is None:
            problem = None  # not scraped yet
        else:
            problem = scrape["error"] and f"metrics unreachable: {scrape['error']}"
        leaders = "allowed" if n["leaders_allowed"] else "disallowed (drained)"
        workers.append(f'<tr data-node="{_e(n["node"])}">{_cell("node", n["node"])}{_cell("address", n["address"])}'
                       f'{_cell("replication", n["replication"])}{_cell("metrics", n["metrics"])}'
                       f'{_cell("version", n.get("version") or "?")}'
                       f'{_cell("pid", n["pid"])}{_cell("started", _when(n["started"]))}'
                       f'{_cell("leaders", leaders, "" if n["leaders_allowed"] else "warn")}{_problem(problem)}</tr>')
    modules = []
    for m in ov["modules"]:
        led = f'{m["groups_led"]}/{m["groups_total"]}'
        problem = None if m["groups_led"] == m["groups_total"] else \
            f'{m["groups_total"] - m["groups_led"]} task group(s) without a live leader'
        link = f'<a href="/modules/{quote(m["module"])}">{_e(m["module"])}</a>'
        modules.append(f'<tr data-module="{_e(m["module"])}"><td data-field="module">{link}</td>'
                       f'{_cell("module_ref", m["module_ref"])}{_cell("tasks", m["tasks"])}'
                       f'{_cell("group_count", m["group_count"])}{_cell("replication_factor", m["replication_factor"])}'
                       f'{_cell("min_isr", m["min_isr"])}{_cell("groups_led", led)}{_cell("state", m["state"])}'
                       f'{_problem(problem)}</tr>')
    body = (head + "<h2>Workers</h2>" +
            _table(("node", "gRPC address", "replication", "metrics", "version", "pid", "started", "leaders",
                    "problem"),
                   workers, "workers") +
            "<h2>Modules</h2>" +
            (_table(("module", "code", "tasks", "task groups", "RF", "min ISR", "led", "state", "problem"),
                    modules, "modules") if modules else "<p>No module is deployed.</p>"))
    return page("Cluster", body)


def _lag(g: dict[str, Any]) -> str:
    parts = []
    for f in g["followers"]:
        lag = "down" if not f["live"] else ("?" if f["lag"] is None else str(f["lag"]))
        parts.append(f"{f['node']} {lag}")
    return "  ".join(parts) or "-"


def _group_row(g: dict[str, Any]) -> str:
    r = g["replica"] if g["replica"] and g["replica"].get("reachable") else {}
    problems = [p for p in (g["problem"],) if p]
    problems += [f"replica on {f['node']} failed: {f['fault']}" for f in g.get("faults", [])]
    if r.get("dead_letters"):
        problems.append(f"{r['dead_letters']} dead letter(s)")
    leader = g["leader"] if g["leaderless_reason"] is None else "none"
    if g.get("handing_off_to"):
        leader = f"{leader} -> {g['handing_off_to']}"
    return (f'<tr data-group="{g["group"]}">{_cell("group", g["group"])}'
            f'{_cell("leader", leader, "problem" if g["leaderless_reason"] else "")}{_cell("epoch", g["epoch"])}'
            f'{_cell("isr", _nodes(g["isr"]))}{_cell("osr", _nodes(g["osr"]))}{_cell("elr", _nodes(g["elr"]))}'
            f'{_cell("log_end", r.get("log_end"))}{_cell("apply_offset", r.get("apply_offset"))}'
            f'{_cell("follower_lag", _lag(g))}{_cell("code_version", (r.get("code_version") or "")[:12])}'
            f'{_cell("dead_letters", r.get("dead_letters"))}{_problem("; ".join(problems) or None)}</tr>')


def _link(base: str, label: str, current: bool, **query: str | None) -> str:
    q = urlencode({k: v for k, v in query.items() if v})
    return f'<a href="{base}{"?" + q if q else ""}"{" class=current" if current else ""}>{_e(label)}</a>'


def module_page(st: dict[str, Any], tel: dict[str, Any], history_s: float, changes: list[dict[str, Any]]) -> str:
    """A module's task groups, options, replication charts (all replicas or one worker's; the duration charts
    of leaders or followers, of one entry type or all) and recent changes; ``tel`` is its telemetry document."""
    name = st["module"]
    charts, node, role, typ = tel["charts"], tel["node"], tel["role"], tel["type"]
    window_s = window(charts, history_s)
    head = (f'<p><b>{_e(st["module_ref"])}</b> · {st["tasks"]} tasks in {st["group_count"]} task groups · '
            f'RF {st["replication_factor"]} on {st["workers"]} workers · min ISR '
            f'<b data-field="min_isr">{st["min_isr"]}</b> · state {_e(st["state"])} · code version '
            f'{_e((st["code"]["version"] or "")[:12])} · '
            f'<span data-field="serving">{st["serving"]}</span>/{len(st["groups"])} task groups serving'
            + (f' · <span class="warn">leaders disallowed on {_e(_nodes(st["disallowed_leaders"]))}</span>'
               if st["disallowed_leaders"] else "") + "</p>")
    groups = _table(("group", "leader", "epoch", "ISR", "OSR", "ELR", "log end", "apply offset", "follower lag",
                     "code", "dead letters", "problem"), (_group_row(g) for g in st["groups"]), "groups")
    options = _table(("option", "value"), (f'<tr><td>{_e(k)}</td><td data-field="{_e(k)}">{_e(v)}</td></tr>'
                                           for k, v in sorted(st["effective_options"].items())), "options")
    base = f"/modules/{quote(name)}"
    sel = {"role": None if role == "leader" else role, "type": None if typ == "all" else typ}
    scopes = [_link(base, "all workers", node is None, **sel)]
    scopes += [_link(base, n, n == node, node=n, **sel) for n in st["live_nodes"]]
    roles = [_link(base, f"{r}s", r == role, node=node, role=None if r == "leader" else r, type=sel["type"])
             for r in ("leader", "follower")]
    types = [_link(base, t, t == typ, node=node, role=sel["role"], type=None if t == "all" else t)
             for t in tel["types"]]
    chart_html = "".join(f'<figure><figcaption>{escape(c["title"])} ({escape(c["unit"])})</figcaption>'
                         f'{line_chart(c["id"], c["series"], window_s)}{legend(c["series"])}</figure>'
                         for c in charts)
    body = (head + "<h2>Task groups</h2>" + groups + _code_notes(st["code"]) + _catchups(st["groups"]) +
            "<h2>Depots</h2>" + depots_table(st.get("depots") or [], len(st["groups"])) +
            f'<h2>Replication, last {span(window_s)} ({"worker " + _e(node) if node else "all workers"})'
            f'</h2><p class="scopes">{" · ".join(scopes)}</p><p class="roles">durations of {" · ".join(roles)}'
            f'</p><p class="types">entry type: {" · ".join(types)}</p><div class="charts">{chart_html}</div>'
            "<h2>Recent leadership changes</h2>" + changes_table([c for c in changes if c["module"] == name][:20]) +
            "<h2>Options</h2>" + options)
    return page(f"Module {name}", body)


def depots_table(depots: list[dict[str, Any]], groups: int) -> str:
    """Each depot's size: records held, offsets (summed over its partitions) and bytes on the leaders."""
    if not depots:
        return "<p>No depot has reported a size yet.</p>"
    rows = []
    for d in depots:
        missing = groups - d["groups_reporting"]
        rows.append(f'<tr data-depot="{_e(d["depot"])}">{_cell("depot", d["depot"])}'
                    f'{_cell("partitions", len(d["partitions"]))}{_cell("records", d["records"])}'
                    f'{_cell("start", d["start"])}{_cell("end", d["end"])}{_cell("bytes", _bytes(d["bytes"]))}'
                    f'{_problem(f"{missing} task group(s) did not report" if missing > 0 else None)}</tr>')
    return _table(("depot", "partitions", "records held", "start offsets", "end offsets", "bytes (flushed)",
                   "problem"), rows, "depots")


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n:,} B"
    size, units = float(n) / 1024, ["KiB", "MiB", "GiB"]
    while size >= 1024 and len(units) > 1:
        size /= 1024
        units.pop(0)
    return f"{size:,.1f} {units[0]}"


def _code_notes(code: dict[str, Any]) -> str:
    """A code switch or PState migrations in progress (nothing when there is none)."""
    notes = []
    if code["switching"]:
        notes.append(f'<p class="warn" data-field="switching">switching code version: task groups '
                     f'{_e(", ".join(map(str, code["switching"])))} still run the previous one</p>')
    for pstate, m in sorted(code["migrations"].items()):
        notes.append(f'<p class="warn">migrating {_e(pstate)} ({_e(m["id"])}): {m["groups_done"]}/{m["groups"]} '
                     f'task group(s) done, {m["rewritten"]:,} value(s) rewritten</p>')
    return "".join(notes)


def _catchups(groups: list[dict[str, Any]]) -> str:
    """Far-horizon transfers in progress: who copies a checkpoint from whom, how far along."""
    rows = []
    for g in groups:
        for c in g.get("catchups", []):
            rate = c["bytes_per_s"]
            eta = "-" if rate <= 0 else f'{max(0.0, (c["bytes_total"] - c["bytes_done"]) / rate):.0f} s'
            rows.append(f'<tr data-group="{g["group"]}">{_cell("group", g["group"])}{_cell("node", c["node"])}'
                        f'{_cell("leader", c["leader"])}{_cell("round", c["round"])}'
                        f'{_cell("bytes_done", c["bytes_done"])}{_cell("bytes_total", c["bytes_total"])}'
                        f'{_cell("bytes_per_s", int(rate))}{_cell("eta", eta)}{_cell("state", c["state"])}</tr>')
    if not rows:
        return ""
    return "<h2>Far-horizon transfers in progress</h2>" + _table(
        ("group", "replica", "from leader", "round", "bytes done", "bytes total", "bytes/s", "ETA", "state"),
        rows, "catchups")


def changes_table(changes: list[dict[str, Any]]) -> str:
    if not changes:
        return "<p>None seen by this conductor.</p>"
    rows = (f'<tr>{_cell("at", _when(c["at"]))}{_cell("module", c["module"])}{_cell("group", c["group"])}'
            f'{_cell("from", c["from"])}{_cell("to", c["to"] or "none", "" if c["to"] else "problem")}'
            f'{_cell("epoch", c["epoch"])}{_cell("isr", _nodes(c["isr"]) if c["isr"] is not None else None)}'
            f'{_cell("reason", c["reason"])}</tr>' for c in changes)
    return _table(("at", "module", "group", "from", "to", "epoch", "ISR", "reason"), rows, "changes")


def leadership_page(doc: dict[str, Any]) -> str:
    """Groups without a leader now, then the leadership changes this conductor made, newest first."""
    rows = (f'<tr>{_cell("module", g["module"])}{_cell("group", g["group"])}'
            f'<td data-field="seconds" class="problem">{g["seconds"]:.0f}</td></tr>' for g in doc["leaderless"])
    leaderless = _table(("module", "group", "seconds without a leader"), rows, "leaderless") \
        if doc["leaderless"] else "<p>Every task group has a leader.</p>"
    body = ("<h2>Without a leader now</h2>" + leaderless + "<h2>Leadership changes</h2>" +
            "<p>Elections and balancing moves made by this conductor since it started (only the active conductor "
            "makes them).</p>" + changes_table(doc["changes"]))
    return page("Leadership", body)


def error_page(status: int, message: str) -> str:
    return page(f"{status}", f'<p class="problem">{escape(message)}</p>', refresh_s=None)
