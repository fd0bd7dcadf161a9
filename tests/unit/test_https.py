"""HTTPS for the UI and /metrics (conductor.security.https, conductor.wire.http): real TLS with certificates made
here, verification on: a client certificate or a bearer token names the caller, `view` decides, the scraper checks
the server's identity."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from conductor.security import certs
from conductor.security.acl import Acls
from conductor.security.https import HttpsContexts, ViewGuard
from conductor.security.identity import Identity
from conductor.security.tls import TlsFiles, TlsSource
from conductor.security.tokens import TokenRefused
from conductor.wire.http import http_get
from conductor.worker.metrics_endpoint import MetricsEndpoint

WORKER, ADMIN, VIEWER, BLIND = (Identity("worker", "n1"), Identity("admin", "ops"), Identity("app", "grafana"),
                                Identity("app", "blind"))
TOKEN = "mrt.0123456789abcdef.secret"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    certs.init_ca_dir(d)
    for who in (WORKER, ADMIN, VIEWER, BLIND, Identity("worker", "n2")):
        certs.issue_to_dir(d, who, hosts=["127.0.0.1"])
    return d


def verify_token(token: str) -> Identity:
    if token != TOKEN:
        raise TokenRefused("token 0123456789abcdef is unknown or revoked")
    return VIEWER


@pytest.fixture(scope="module")
def endpoint(pki: Path) -> Iterator[MetricsEndpoint]:
    registry = CollectorRegistry()
    Counter("millrace_test_total", "a test counter", registry=registry).inc()
    acls = Acls().grant(VIEWER, "*", ["view"])
    guard = ViewGuard(lambda: acls, verify_token)
    contexts = HttpsContexts(TlsSource(TlsFiles.in_dir(pki, WORKER)))
    server = MetricsEndpoint(registry, "127.0.0.1", 0, contexts.server(), guard)
    yield server
    server.stop()


def client(pki: Path, who: Identity | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / certs.CA_CERT))  # host name checked too
    if who is not None:
        files = TlsFiles.in_dir(pki, who)
        ctx.load_cert_chain(files.cert, files.key)
    return ctx


def status(url: str, ctx: ssl.SSLContext, token: str | None = None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_certificate_or_token_then_view(pki: Path, endpoint: MetricsEndpoint) -> None:
    url = f"https://127.0.0.1:{endpoint.port}/metrics"
    assert endpoint.scheme == "https"
    assert status(url, client(pki, ADMIN)) == 200
    assert status(url, client(pki, VIEWER)) == 200
    assert status(url, client(pki, None), TOKEN) == 200
    assert status(url, client(pki, None)) == 401
    assert status(url, client(pki, None), "mrt.0123456789abcdef.wrong") == 401
    assert status(url, client(pki, BLIND)) == 403


def test_plain_http_and_another_ca_get_nothing(pki: Path, endpoint: MetricsEndpoint, tmp_path: Path) -> None:
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=5).read()
    certs.init_ca_dir(tmp_path / "other")
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"https://127.0.0.1:{endpoint.port}/metrics", timeout=5,
                               context=ssl.create_default_context(cafile=str(tmp_path / "other" / certs.CA_CERT)))


def test_the_scraper_checks_the_servers_identity(pki: Path, endpoint: MetricsEndpoint) -> None:
    contexts = HttpsContexts(TlsSource(TlsFiles.in_dir(pki, ADMIN)))
    address = f"127.0.0.1:{endpoint.port}"
    assert b"millrace_test_total" in http_get(address, "/metrics", 5, contexts, WORKER)
    with pytest.raises(ConnectionRefusedError, match="worker/n1, not worker/n2"):
        http_get(address, "/metrics", 5, contexts, Identity("worker", "n2"))


def test_view_guard_lists_what_an_identity_may_view() -> None:
    acls = Acls().grant(VIEWER, "Billing", ["view"])
    guard = ViewGuard(lambda: acls, verify_token)
    assert guard.may_view(ADMIN) and guard.may_view(Identity("conductor", "c1"), "Any")
    assert guard.may_view(VIEWER, "Billing") and not guard.may_view(VIEWER, "Other") and not guard.may_view(VIEWER)
    assert guard.may_view_some(VIEWER) and not guard.may_view_some(BLIND)
