"""The worker's Prometheus endpoint: ``/metrics`` on :class:`conductor.wire.http.HttpServer`, over HTTPS when the
worker has TLS.

prometheus-client's own ``start_http_server`` takes certificate files once (no
reload after a rotation) and knows no bearer tokens, so the worker serves its
registry on the same bounded server as the conductor's UI: the TLS context follows
the worker's PEM files, and with authorization on, a scrape must come from an
identity with ``view`` on every module (``*``): admins and conductors have it; a
Prometheus server gets a certificate or a token and `conductor acl grant ID '*' view`.
A worker bound to loopback without TLS serves plain HTTP with no checks, as before.
"""

from __future__ import annotations

import ssl
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from conductor.security.https import NotAuthenticated, ViewGuard
from conductor.wire.http import HttpServer, caller


class MetricsEndpoint:
    """Serves ``registry`` at ``/metrics`` on ``host:port`` (0: a free port) until :meth:`stop`."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, tls: ssl.SSLContext | None = None,
                 guard: ViewGuard | None = None) -> None:
        handler = type("MetricsHandler", (_Handler,), {"registry": registry})
        self.httpd = HttpServer((host, port), handler, tls, guard)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def scheme(self) -> str:
        return self.httpd.scheme

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry

    def do_GET(self) -> None:
        if urlsplit(self.path).path not in ("/metrics", "/"):
            return self._reply(HTTPStatus.NOT_FOUND, b"only /metrics is served here\n")
        try:
            who = caller(self)
        except NotAuthenticated as e:
            return self._reply(HTTPStatus.UNAUTHORIZED, f"{e}\n".encode())
        guard = self.server.guard if isinstance(self.server, HttpServer) else None
        if who is not None and guard is not None and not guard.may_view(who):
            return self._reply(HTTPStatus.FORBIDDEN, f"{who} may not view every module's metrics (missing "
                               f"permission 'view' on '*'); an admin grants it with `conductor acl grant {who} "
                               "'*' view`\n".encode())
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        self._reply(HTTPStatus.OK, encoder(self.registry), content_type)

    def _reply(self, status: HTTPStatus, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        if status == HTTPStatus.UNAUTHORIZED:
            self.send_header("WWW-Authenticate", 'Bearer realm="millrace"')
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass
