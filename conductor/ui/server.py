"""The UI's HTTP server: the standard library's ``ThreadingHTTPServer`` dispatching on :data:`ROUTES`.

Read-only: only ``GET`` (and ``HEAD``) are served. A request runs on its own thread (at most
``MAX_CONCURRENT_REQUESTS`` at once: a connection past that is closed); status documents make
ZooKeeper reads and GroupStatus RPCs with their own timeouts, so a slow worker slows one page, not the
conductor (whose failover runs on other threads and never waits for the UI).
"""

from __future__ import annotations

import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from conductor.metastore import MetastoreError
from conductor.settings import hostport
from conductor.ui import pages
from conductor.ui.routes import HTML, JSON, NotFound, Reply, Sources, match

log = logging.getLogger("millrace.conductor.ui")


def _reply(kind: str, result: Any) -> Reply:
    if isinstance(result, Reply):
        return result
    if kind == "json":
        return Reply(json.dumps(result, indent=2, sort_keys=True).encode(), JSON)
    assert kind == "html", kind
    return Reply(str(result).encode(), HTML)


def _error(kind: str, status: HTTPStatus, message: str) -> Reply:
    if kind == "json":
        return Reply(json.dumps({"error": message}).encode(), JSON, status)
    return Reply(pages.error_page(status, message).encode(), HTML, status)


#: requests served at once; a connection past that is closed at once (a page is retried, the conductor lives)
MAX_CONCURRENT_REQUESTS = 16


class _BoundedHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with at most ``MAX_CONCURRENT_REQUESTS`` request threads."""

    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT_REQUESTS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.warning("UI: %d requests already running; closing a connection from %s",
                        MAX_CONCURRENT_REQUESTS, client_address[0])
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class UIServer:
    """Serves :data:`conductor.ui.routes.ROUTES` from ``sources`` on ``host:port`` (0: a free port)."""

    def __init__(self, sources: Sources, host: str, port: int) -> None:
        self.sources = sources
        handler = type("UIHandler", (_Handler,), {"sources": sources})
        self.httpd = _BoundedHTTPServer((host, port), handler)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="conductor-ui", daemon=True)

    @property
    def address(self) -> str:
        host, port = self.httpd.server_address[:2]
        return hostport(str(host), int(port))

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
            reply = _reply(kind, route.handler(self.sources, params, query))
        except NotFound as e:
            reply = _error(kind, HTTPStatus.NOT_FOUND, str(e))
        except (MetastoreError, ValueError) as e:
            reply = _error(kind, HTTPStatus.SERVICE_UNAVAILABLE, f"{type(e).__name__}: {e}")
        except Exception as e:
            log.exception("UI request %s failed", self.path)
            reply = _error(kind, HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {e}")
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if send_body:
            self.wfile.write(reply.body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.client_address[0], *args)
