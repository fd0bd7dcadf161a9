"""The UI's HTTP server: :class:`conductor.wire.http.HttpServer` (the standard library's ``ThreadingHTTPServer``,
bounded, HTTPS when the conductor has TLS) dispatching on :data:`ROUTES`.

Over HTTPS every request names its caller (a client certificate or a bearer token: 401 without one), and each
route says what it shows (``Route.view``): one module's page needs ``view`` on that module, the cluster pages
list only the modules the caller may view, the conductor's ``/metrics`` needs ``view`` on ``*`` (403 otherwise).

Read-only: only ``GET`` (and ``HEAD``) are served. A request runs on its own thread (at most
``MAX_CONCURRENT_REQUESTS`` at once: a connection past that is closed); status documents make
ZooKeeper reads and GroupStatus RPCs with their own timeouts, so a slow worker slows one page, not the
conductor (whose failover runs on other threads and never waits for the UI).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import ssl
import threading
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from conductor.metastore import MetastoreError
from conductor.security.https import NotAuthenticated, ViewGuard
from conductor.settings import hostport
from conductor.ui import pages
from conductor.ui.routes import (
    HTML,
    JSON,
    VIEW_ALL,
    VIEW_ANY,
    VIEW_MODULE,
    VIEW_SOME,
    NotFound,
    Reply,
    Route,
    Sources,
    match,
)
from conductor.wire.http import HttpServer, caller

log = logging.getLogger("millrace.conductor.ui")


def _reply(kind: str, result: Any) -> Reply:
    if isinstance(result, Reply):
        return result
    if kind == "json":
        return Reply(json.dumps(result, indent=2, sort_keys=True).encode(), JSON)
    assert kind == "html", kind
    return Reply(str(result).encode(), HTML)


class Forbidden(Exception):
    """The caller may not view what the route shows (403); the message names the grant that fixes it."""


def _error(kind: str, status: HTTPStatus, message: str) -> Reply:
    if kind == "json":
        return Reply(json.dumps({"error": message}).encode(), JSON, status)
    return Reply(pages.error_page(status, message).encode(), HTML, status)


class UIServer:
    """Serves :data:`conductor.ui.routes.ROUTES` from ``sources`` on ``host:port`` (0: a free port); over HTTPS
    with ``tls`` (a server context), each request's identity checked by ``guard`` (None: plaintext, no checks)."""

    def __init__(self, sources: Sources, host: str, port: int, tls: ssl.SSLContext | None = None,
                 guard: ViewGuard | None = None) -> None:
        self.sources = sources
        handler = type("UIHandler", (_Handler,), {"sources": sources})
        self.httpd = HttpServer((host, port), handler, tls, guard)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="conductor-ui", daemon=True)

    @property
    def address(self) -> str:
        host, port = self.httpd.server_address[:2]
        return hostport(str(host), int(port))

    @property
    def url(self) -> str:
        return f"{self.httpd.scheme}://{self.address}/"

    def start(self) -> UIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    sources: Sources
    server_version = "millrace-conductor-ui"

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def _serve(self, send_body: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        query = dict(parse_qsl(url.query))
        kind = "json" if path.startswith("/api/") or path.endswith(".json") else "html"
        try:
            route, params = match(path)
            kind = route.kind
            sources = self._viewer(route, params)
            reply = _reply(kind, route.handler(sources, params, query))
        except NotAuthenticated as e:
            reply = _error(kind, HTTPStatus.UNAUTHORIZED, str(e))
        except Forbidden as e:
            reply = _error(kind, HTTPStatus.FORBIDDEN, str(e))
        except NotFound as e:
            reply = _error(kind, HTTPStatus.NOT_FOUND, str(e))
        except (MetastoreError, ValueError) as e:
            reply = _error(kind, HTTPStatus.SERVICE_UNAVAILABLE, f"{type(e).__name__}: {e}")
        except Exception as e:
            log.exception("UI request %s failed", self.path)
            reply = _error(kind, HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {e}")
        self.send_response(reply.status)
        if reply.status == HTTPStatus.UNAUTHORIZED:
            self.send_header("WWW-Authenticate", 'Bearer realm="millrace"')
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if send_body:
            self.wfile.write(reply.body)

    def _viewer(self, route: Route, params: Mapping[str, str]) -> Sources:
        """The sources as the caller may see them (only the modules it may ``view``); Forbidden when the route
        shows something it may not see. A server without a guard checks nobody."""
        who = caller(self)
        server = self.server
        if who is None or not isinstance(server, HttpServer) or server.guard is None:
            return self.sources
        guard = server.guard
        need = route.view
        ok = (need == VIEW_ANY or (need == VIEW_SOME and guard.may_view_some(who))
              or (need == VIEW_MODULE and guard.may_view(who, params["module"]))
              or (need == VIEW_ALL and guard.may_view(who)))
        if not ok:
            what = f"module {params['module']!r}" if need == VIEW_MODULE else "every module" \
                if need == VIEW_ALL else "any module"
            raise Forbidden(f"{who} may not view {what} (missing permission 'view'); an admin grants it with "
                            f"`conductor acl grant {who} {params.get('module', '*')} view`")
        return dataclasses.replace(self.sources, may_view=lambda module: guard.may_view(who, module))

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.client_address[0], *args)
