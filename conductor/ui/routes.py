"""The UI's routes: one table, from which the server dispatches and ``/openapi.json`` is generated.

Every page's numbers come from a JSON route of this table (the page renders that route's document), so a
script sees exactly what an operator sees; the OpenAPI 3.1 document is built from the table, so a route
cannot exist without being described.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from conductor.metastore import Metastore, ModuleNotFound
from conductor.ui import pages
from conductor.ui.metrics import ConductorMetrics
from conductor.ui.schemas import SCHEMAS
from conductor.ui.telemetry import ALL_TYPES, ROLES, Scraper, Telemetry

JSON = "application/json"
HTML = "text/html; charset=utf-8"

# What a route shows, hence the ``view`` permission it needs (checked when the server has a guard, over HTTPS)
VIEW_MODULE = "module"  # the path's module
VIEW_SOME = "some"      # the cluster: view on some module, and the documents list only those
VIEW_ALL = "all"        # everything (the conductor's /metrics): view on ``*``
VIEW_ANY = "any"        # nothing of the cluster (the description, the stylesheet): any authenticated caller


def _everything(_module: str) -> bool:
    return True


class NotFound(Exception):
    """A path or a module that does not exist (404)."""


@dataclass(frozen=True)
class Reply:
    body: bytes
    content_type: str
    status: int = 200


@dataclass
class Sources:
    """What the routes read: the metastore (status), the telemetry, the conductor's metrics and who it is."""

    ms: Metastore
    telemetry: Telemetry
    scraper: Scraper
    metrics: ConductorMetrics
    name: str
    is_active: Callable[[], bool]
    #: ``conductor.status.status_document`` bound to the metastore (it lives above this package): the cluster
    #: (None) or one module, the document `conductor status --json` prints
    status: Callable[[str | None], dict[str, Any]]
    #: whether the caller may view a module (over HTTPS: its ``view`` permission; the server sets it per request)
    may_view: Callable[[str], bool] = _everything


Handler = Callable[[Sources, Mapping[str, str], Mapping[str, str]], Any]


@dataclass(frozen=True)
class Route:
    """``pattern`` (``{name}`` for a path parameter), what it returns, and how it is described."""

    pattern: str
    kind: str  # "json", "html", "text"
    handler: Handler
    summary: str
    query: tuple[tuple[str, str], ...] = ()
    #: the name of its document's schema in :data:`conductor.ui.schemas.SCHEMAS` (JSON routes)
    schema: str = ""
    #: what it shows: VIEW_MODULE, VIEW_SOME, VIEW_ALL or VIEW_ANY (the ``view`` permission it needs)
    view: str = VIEW_SOME

    @property
    def regex(self) -> re.Pattern[str]:
        return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", self.pattern) + "$")

    @property
    def params(self) -> list[str]:
        return re.findall(r"\{(\w+)\}", self.pattern)


# ---- JSON documents -------------------------------------------------------------------------------


def status_doc(src: Sources, _p: Mapping[str, str], _q: Mapping[str, str]) -> dict[str, Any]:
    doc = src.status(None)
    return {**doc, "modules": [m for m in doc["modules"] if src.may_view(m["module"])]}


def module_doc(src: Sources, p: Mapping[str, str], _q: Mapping[str, str]) -> dict[str, Any]:
    try:
        return src.status(p["module"])
    except ModuleNotFound as e:
        raise NotFound(str(e)) from None


def telemetry_doc(src: Sources, p: Mapping[str, str], q: Mapping[str, str]) -> dict[str, Any]:
    t = src.telemetry
    since = float(q.get("since") or time.time() - t.history_s)
    role, entry_type = q.get("role") or "leader", q.get("type") or ALL_TYPES
    if role not in ROLES:
        raise NotFound(f"no charts of role {role!r}: the roles are {', '.join(ROLES)}")
    return {"module": p["module"], "node": q.get("node") or None, "role": role, "type": entry_type,
            "types": t.entry_types(p["module"]), "interval_s": t.interval_s,
            "history_s": t.history_s, "series_kept": len(t.store), "series_refused": t.store.refused,
            "charts": t.chart_data(p["module"], q.get("node") or None, since, role, entry_type)}


def workers_doc(src: Sources, _p: Mapping[str, str], _q: Mapping[str, str]) -> dict[str, Any]:
    return {"conductor": {"name": src.name, "active": src.is_active()},
            "scrapes": {n: {"address": s.address, "at": s.at, "error": s.error, "samples": s.samples}
                        for n, s in sorted(src.scraper.last.items())}}


def recent_changes(src: Sources) -> list[dict[str, Any]]:
    return [c for c in src.metrics.recent_changes() if src.may_view(c["module"])]


def leadership_doc(src: Sources, _p: Mapping[str, str], _q: Mapping[str, str]) -> dict[str, Any]:
    return {"changes": recent_changes(src),
            "leaderless": [{"module": m, "group": g, "seconds": s}
                           for (m, g), s in sorted(src.metrics.leaderless().items()) if src.may_view(m)]}


# ---- pages ----------------------------------------------------------------------------------------


def cluster_html(src: Sources, p: Mapping[str, str], q: Mapping[str, str]) -> str:
    w = workers_doc(src, p, q)
    return pages.cluster_page(status_doc(src, p, q), w["scrapes"], w["conductor"])


def module_html(src: Sources, p: Mapping[str, str], q: Mapping[str, str]) -> str:
    doc = module_doc(src, p, q)
    tel = telemetry_doc(src, p, q)
    return pages.module_page(doc, tel, src.telemetry.history_s, recent_changes(src))


def leadership_html(src: Sources, p: Mapping[str, str], q: Mapping[str, str]) -> str:
    return pages.leadership_page(leadership_doc(src, p, q))


def metrics_text(src: Sources, _p: Mapping[str, str], _q: Mapping[str, str]) -> Reply:
    return Reply(generate_latest(src.metrics.registry), CONTENT_TYPE_LATEST)


def style_css(_src: Sources, _p: Mapping[str, str], _q: Mapping[str, str]) -> Reply:
    return Reply(resources.files("conductor.ui").joinpath("static/style.css").read_bytes(), "text/css")


def openapi_doc(_src: Sources, _p: Mapping[str, str], _q: Mapping[str, str]) -> dict[str, Any]:
    return openapi()


_NODE = (("node", "only the replicas on this worker (a node id)"),)
_SINCE = (("since", "only points at or after this time (Unix seconds)"),)
_SELECT = (("role", "the duration charts of leaders (default) or followers: leader, follower"),
           ("type", "the duration charts of one entry type (client_append, inbound_hops, microbatch_commit, "
                    "code_switch, migration, trim, replicated) or all (default)"))

ROUTES: tuple[Route, ...] = (
    Route("/", "html", cluster_html, "The cluster page: workers and modules (numbers from /api/status, "
          "/api/workers)"),
    Route("/modules/{module}", "html", module_html, "A module page: task groups, charts, recent changes "
          "(numbers from /api/modules/{module} and its telemetry)", _NODE + _SELECT, view=VIEW_MODULE),
    Route("/leadership", "html", leadership_html, "Leadership changes and groups without a leader "
          "(numbers from /api/leadership)"),
    Route("/api/status", "json", status_doc, "Live workers and deployed modules: `conductor status --json`",
          schema="Status"),
    Route("/api/modules/{module}", "json", module_doc, "Every task group of a module: "
          "`conductor status MODULE --json`", schema="Module", view=VIEW_MODULE),
    Route("/api/modules/{module}/telemetry", "json", telemetry_doc, "The module's replication charts over "
          "the kept history, all workers or one", _NODE + _SINCE + _SELECT, schema="Telemetry", view=VIEW_MODULE),
    Route("/api/workers", "json", workers_doc, "This conductor and the last scrape of each worker's metrics",
          schema="Workers"),
    Route("/api/leadership", "json", leadership_doc, "Recent leadership changes (newest first) and groups "
          "without a leader now", schema="Leadership"),
    Route("/metrics", "text", metrics_text, "The conductor's own Prometheus metrics", view=VIEW_ALL),
    Route("/openapi.json", "json", openapi_doc, "This description (OpenAPI 3.1)", schema="OpenAPI", view=VIEW_ANY),
    Route("/static/style.css", "text", style_css, "The pages' stylesheet", view=VIEW_ANY),
)


def match(path: str) -> tuple[Route, dict[str, str]]:
    """The route serving ``path`` and its path parameters; NotFound if none does."""
    for route in ROUTES:
        m = route.regex.match(path)
        if m:
            return route, m.groupdict()
    raise NotFound(f"no page at {path}")


_MEDIA = {"json": JSON, "html": "text/html", "text": "text/plain"}


def openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 document of :data:`ROUTES` (every route, read-only ``GET``)."""
    paths: dict[str, Any] = {}
    for r in ROUTES:
        parameters = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in r.params]
        parameters += [{"name": n, "in": "query", "required": False, "description": d, "schema": {"type": "string"}}
                       for n, d in r.query]
        assert (r.kind == "json") == (r.schema in SCHEMAS), f"{r.pattern}: a JSON route names its schema"
        schema = {"$ref": f"#/components/schemas/{r.schema}"} if r.schema else {"type": "string"}
        content = {_MEDIA[r.kind]: {"schema": schema}}
        responses: dict[str, Any] = {"200": {"description": r.summary, "content": content}}
        if r.params:
            responses["404"] = {"description": "no such module"}
        paths[r.pattern] = {"get": {"summary": r.summary, "operationId": _operation_id(r.pattern),
                                    "parameters": parameters, "responses": responses}}
    return {"openapi": "3.1.0",
            "info": {"title": "Millrace conductor UI", "version": "1",
                     "description": "Read-only cluster status, replication telemetry and leadership changes. "
                                    "Every number the pages show comes from one of the JSON routes."},
            "paths": paths, "components": {"schemas": SCHEMAS}}


def _operation_id(pattern: str) -> str:
    words = re.sub(r"[{}]", "", pattern).strip("/").replace(".", "_").replace("/", "_")
    return "get_" + (words or "root")
