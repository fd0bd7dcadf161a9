"""The read-only HTTP(S) server of the conductor's web UI and of the workers' ``/metrics``: the standard library's
``ThreadingHTTPServer``, bounded, over TLS when the process has TLS material.

* **Bounded**: at most ``max_requests`` request threads; a connection past that is
  closed at once (a page is retried, the process lives).
* **TLS**: given the server context of an :class:`~conductor.security.https.HttpsContexts`,
  each accepted socket is wrapped without a handshake on the accepting thread and
  shakes hands on its request thread with a deadline, so a client that stalls its
  handshake holds one request slot for ``HANDSHAKE_TIMEOUT_S``, never the accept loop.
  The context swaps in rotated files on every handshake.
* **Who asks**: :func:`caller` reads a request's identity (client certificate, else
  ``Authorization: Bearer``) through the server's :class:`~conductor.security.https.ViewGuard`;
  a server without one (plaintext on loopback, ``--insecure``, a worker with
  ``--authorize false``) names nobody and everything is visible, as on its gRPC port.
* :func:`http_get`: the scraping side (the conductor reading the workers' ``/metrics``).
"""

from __future__ import annotations

import http.client
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from conductor.security import identity as ident
from conductor.security.https import ViewGuard, peer_certificate
from conductor.security.identity import Identity, IdentityError
from conductor.security.tls import LinkContexts
from conductor.settings import split_hostport

log = logging.getLogger("millrace.http")

#: seconds a client has to finish its TLS handshake
HANDSHAKE_TIMEOUT_S = 10.0
#: requests served at once by default
MAX_CONCURRENT_REQUESTS = 16


class HttpServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with at most ``max_requests`` request threads, TLS with ``tls`` (a server context)
    and the request identities of ``guard`` (None: no checks)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 tls: ssl.SSLContext | None = None, guard: ViewGuard | None = None,
                 max_requests: int = MAX_CONCURRENT_REQUESTS) -> None:
        assert guard is None or tls is not None, "identities need TLS: a bearer token is never read off plaintext"
        super().__init__(address, handler)
        self.tls = tls
        self.guard = guard
        self.max_requests = max_requests
        self._slots = threading.BoundedSemaphore(max_requests)

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.warning("HTTP: %d requests already running; closing a connection from %s", self.max_requests,
                        client_address[0])
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            if isinstance(request, ssl.SSLSocket):
                try:
                    request.settimeout(HANDSHAKE_TIMEOUT_S)
                    request.do_handshake()
                    request.settimeout(None)
                except (ssl.SSLError, OSError) as e:
                    log.info("HTTP: TLS handshake with %s failed: %s", client_address[0], e)
                    self.shutdown_request(request)
                    return
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def caller(handler: BaseHTTPRequestHandler) -> Identity | None:
    """The identity of ``handler``'s request (None: the server checks nobody); NotAuthenticated if it has none."""
    server = handler.server
    guard = server.guard if isinstance(server, HttpServer) else None
    if guard is None:
        return None
    return guard.identify(peer_certificate(handler.connection), handler.headers.get("Authorization"))


def http_get(address: str, path: str, timeout_s: float, tls: LinkContexts | None = None,
             expect: Identity | None = None) -> bytes:
    """GET ``path`` from ``address`` (``host:port``): plain HTTP, or HTTPS with ``tls``'s client context (our
    certificate presented, the server's checked against the CA) and, with ``expect``, the server's identity
    checked (a worker's ``/metrics`` must be ``worker/<its node>``: its address came from ZooKeeper, so its host
    name proves nothing). OSError (``ConnectionRefusedError`` for a wrong identity) or ValueError on failure."""
    host, port = split_hostport(address)
    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection(host, port, timeout=timeout_s, context=tls.client()) if tls is not None
        else http.client.HTTPConnection(host, port, timeout=timeout_s))
    try:
        conn.connect()
        if tls is not None and expect is not None:
            try:
                peer = ident.from_der(peer_certificate(conn.sock) or b"")
            except (IdentityError, ValueError) as e:
                raise ConnectionRefusedError(f"{address} presented no Millrace identity: {e}") from None
            if peer != expect:
                raise ConnectionRefusedError(f"{address} is {peer}, not {expect}: refused to read it")
        conn.request("GET", path)
        reply = conn.getresponse()
        body = reply.read()
        if reply.status != 200:
            raise ValueError(f"GET {path} on {address}: HTTP {reply.status} {body[:200]!r}")
        return body
    finally:
        conn.close()
