"""The conductor's window on the cluster: a read-only web UI, its JSON API and the conductor's own metrics.

Served by every conductor process on ``--host``:``--ui-port`` (default 8888, as Rama's Cluster UI; 0 = a
free port, as for the workers' ports; ``off`` = none). Pages: the cluster (``/``), a module
(``/modules/NAME``: task groups, replication charts, recent leadership changes) and leadership changes
(``/leadership``); every number on them comes from a JSON route (``/api/...``) described at
``/openapi.json``; ``/metrics`` is the conductor's Prometheus registry. A conductor with TLS serves them over
HTTPS to callers with a certificate or a bearer token, each seeing the modules it may ``view``. See docs/ui.md.

Why this stack, for what it costs a user:

* **The standard library's** ``ThreadingHTTPServer`` **with server-rendered HTML.** The conductor gains
  no dependency (an ASGI app would add starlette, uvicorn and their dependencies to every install, and an
  event loop to a process that has none), there is nothing to build, and the pages work in any browser,
  offline, with JavaScript off. A read-only status UI serves a handful of operators a page every few
  seconds: one thread per request is plenty.
* **Charts as inline SVG drawn on the server** (:mod:`conductor.ui.svg`) instead of a charting library
  shipped as a file: the one asset is a stylesheet inside the package (``static/style.css``), there is no
  third-party code or licence to carry, and a page is one request.
* **Telemetry scraped from the workers' Prometheus endpoints** into bounded ring buffers
  (:mod:`conductor.ui.telemetry`, :mod:`conductor.ui.series`): the workers stay unchanged and the last hour
  costs a fixed amount of memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from conductor.metastore import Metastore
from conductor.metastore.acls import AclCache
from conductor.metastore.tokens import TokenCache
from conductor.security.https import HttpsContexts, ViewGuard
from conductor.security.tls import TlsSource
from conductor.settings import LOOPBACK, Setting, parse_seconds
from conductor.ui.metrics import ConductorMetrics
from conductor.ui.routes import Sources
from conductor.ui.server import UIServer
from conductor.ui.telemetry import Scraper, Telemetry

log = logging.getLogger("millrace.conductor.ui")

#: Rama's Cluster UI port
DEFAULT_UI_PORT = 8888


def parse_ui_port(raw: str) -> int | None:
    """A port (0: a free one) or ``off`` (None: no UI, no conductor metrics endpoint)."""
    if raw.strip().lower() in ("off", "none", "-"):
        return None
    port = int(raw)
    if not 0 <= port <= 65535:
        raise ValueError("a port is 0..65535 (0: any free port), or off")
    return port


UI_SETTINGS = [
    Setting("host", LOOPBACK, help="address to bind the web UI, its API and /metrics on "
                                      "(0.0.0.0: every interface)"),
    Setting("ui_port", DEFAULT_UI_PORT, parse_ui_port, help="port of the read-only web UI, its JSON API and the "
                                                            "conductor's /metrics (0: any free port; off: none)"),
    Setting("ui_scrape_interval", 5.0, parse_seconds, help="seconds between scrapes of the workers' metrics "
                                                           "for the UI's charts"),
    Setting("ui_history", 3600.0, parse_seconds, help="seconds of chart history kept in memory"),
]


class RunningUI:
    """The server and the scraper thread of one conductor's UI (and, over HTTPS, the caches its guard reads)."""

    def __init__(self, server: UIServer, scraper: Scraper, caches: tuple[AclCache, TokenCache] | None = None) -> None:
        self.server = server
        self.scraper = scraper
        self.caches = caches

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.scraper.stop()
        self.server.stop()
        for cache in self.caches or ():
            cache.close()


def serve(ms: Metastore, metrics: ConductorMetrics, name: str, is_active: Callable[[], bool],
          status: Callable[[str | None], dict[str, Any]], host: str, port: int, interval_s: float = 5.0,
          history_s: float = 3600.0, tls: TlsSource | None = None) -> RunningUI:
    """Start the scraper and the server (raises OSError if ``host:port`` cannot be bound).

    With ``tls`` (the conductor's certificate): HTTPS, every request authenticated (a client certificate or a
    bearer token) and shown only the modules it may ``view`` (the ACLs and tokens followed by ZooKeeper
    watches); the scraper reads the workers' ``/metrics`` over HTTPS with the conductor's certificate.
    """
    telemetry = Telemetry(history_s=history_s, interval_s=interval_s)
    contexts = HttpsContexts(tls) if tls is not None else None
    scraper = Scraper(ms, telemetry, contexts)
    sources = Sources(ms, telemetry, scraper, metrics, name, is_active, status)
    if contexts is None:
        return RunningUI(UIServer(sources, host, port).start(), scraper.start())
    acls, tokens = AclCache(ms.acls), TokenCache(ms.tokens)
    guard = ViewGuard(lambda: acls.acls, tokens.verify)
    try:
        server = UIServer(sources, host, port, contexts.server(), guard).start()
    except OSError:
        acls.close()
        tokens.close()
        raise
    return RunningUI(server, scraper.start(), (acls, tokens))


def start_ui(conductor: Any, settings: Mapping[str, Any],
             status: Callable[[str | None], dict[str, Any]], tls: TlsSource | None = None) -> RunningUI | None:
    """The conductor's UI from its resolved settings, or None when it is off or its port is taken.

    ``status`` is ``conductor.status.status_document`` bound to the conductor's metastore: the controller
    passes it because ``conductor.status`` is a top-level module, above this package.

    A port that cannot be bound is logged, not fatal: failover matters more than the view of it (a standby
    conductor on the same machine as the active one is the usual case; give it another ``--ui-port``).
    """
    port = settings["ui_port"]
    if port is None:
        return None
    try:
        ui = serve(conductor.ms, conductor.metrics, conductor.name, lambda: bool(conductor.is_active),
                   status, settings["host"], int(port), settings["ui_scrape_interval"], settings["ui_history"], tls)
    except OSError as e:
        log.error("conductor %s: no web UI, cannot bind %s:%s (%s); use --ui-port", conductor.name,
                  settings["host"], port, e.strerror or e)
        return None
    log.warning("conductor %s: web UI at %s (API /openapi.json, metrics /metrics)%s", conductor.name, ui.url,
                ", every request authenticated (certificate or bearer token) and shown what it may view"
                if tls is not None else "")
    return ui
