"""The conductor's web UI and the workers' /metrics over real TLS (issue 26 with issue 29's read access).

One secure `DevCluster` (a conductor with its UI, one worker; certificates made by the test's CA; every client
here verifies the server against that CA, as a browser would). Checked: no certificate and no token is 401; an
admin's certificate sees every module and /metrics; a token app granted `view` on one module sees only it (the
other module's page is 403, as is the conductor's /metrics); an app without `view` is 403; plain HTTP to the
HTTPS port gets no page; the conductor scrapes the worker's /metrics over HTTPS (the charts' scrapes succeed); a
worker's /metrics needs `view` on every module.
"""

from __future__ import annotations

import json
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conductor import testing
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.security import certs, tokens
from conductor.security.identity import Identity
from conductor.security.tls import TlsFiles
from conductor.testing import wait_for

SEEN, HIDDEN = "Clicks", "WordCount"
REFS = {SEEN: "examples.clicks:Clicks", HIDDEN: "examples.word_count:WordCount"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def dc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    cluster = DevCluster(tmp_path_factory.mktemp("secure-ui"), nodes=1, secure=True, ui_port=_free_port())
    with cluster:
        for name in (SEEN, HIDDEN):
            testing.deploy(cluster, REFS[name], name=name, tasks=2, threads=1, replication_factor=1)
        yield cluster


def context(dc: DevCluster, identity: Identity | None = None) -> ssl.SSLContext:
    """A client context that verifies the server (host name included) against the cluster's CA, presenting
    `identity`'s certificate if given."""
    ctx = ssl.create_default_context(cafile=str(dc.pki / certs.CA_CERT))
    if identity is not None:
        files = TlsFiles.in_dir(dc.pki, identity)
        if not files.cert.exists():
            dc.issue(identity)
        ctx.load_cert_chain(files.cert, files.key)
    return ctx


def get(url: str, ctx: ssl.SSLContext, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def ui(dc: DevCluster, path: str) -> str:
    assert dc.ui_port is not None
    return f"https://127.0.0.1:{dc.ui_port}{path}"


def worker_metrics(dc: DevCluster) -> str:
    with Metastore(dc.hosts) as ms:
        info = ms.nodes.get("n1")
    assert info is not None and info.metrics
    return f"https://{info.metrics}/metrics"


def token_with(dc: DevCluster, name: str, grants: dict[str, set[str]]) -> str:
    app = Identity("app", name)
    token, record = tokens.generate(app)
    with Metastore(dc.hosts, zk_auth=dc.zk_principal()) as ms:
        ms.tokens.put(record)
        for module, permissions in grants.items():
            ms.acls.grant(app, module, permissions)
    return token


def test_no_certificate_and_no_token_is_401(dc: DevCluster) -> None:
    for url in (ui(dc, "/api/status"), ui(dc, "/"), worker_metrics(dc)):
        status, body = get(url, context(dc))
        assert status == 401, (url, status, body)
        assert "Bearer" in body and "certificate" in body


def test_plain_http_to_the_https_port_gets_no_page(dc: DevCluster) -> None:
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(ui(dc, "/api/status").replace("https://", "http://"), timeout=5).read()


def test_an_admin_sees_every_module_and_the_metrics(dc: DevCluster) -> None:
    ctx = context(dc, DevCluster.ADMIN)
    status, body = get(ui(dc, "/api/status"), ctx)
    assert status == 200, body
    assert {m["module"] for m in json.loads(body)["modules"]} == {SEEN, HIDDEN}
    for path in ("/", f"/modules/{HIDDEN}", "/metrics", "/openapi.json"):
        assert get(ui(dc, path), ctx)[0] == 200, path
    status, text = get(worker_metrics(dc), ctx)
    assert status == 200 and "millrace_" in text


def test_a_token_app_sees_only_the_modules_it_may_view(dc: DevCluster) -> None:
    token = token_with(dc, "viewer", {SEEN: {"view"}})
    ctx = context(dc)  # no certificate: the token names the caller

    def listed() -> Any:
        status, body = get(ui(dc, "/api/status"), ctx, token)
        return status == 200 and [m["module"] for m in json.loads(body)["modules"]]
    assert wait_for(listed, 20, "the conductor to know the token") == [SEEN]
    assert get(ui(dc, f"/modules/{SEEN}"), ctx, token)[0] == 200
    assert get(ui(dc, f"/api/modules/{SEEN}/telemetry"), ctx, token)[0] == 200
    status, body = get(ui(dc, f"/modules/{HIDDEN}"), ctx, token)
    assert status == 403 and "app/viewer" in body and "view" in body, body
    assert get(ui(dc, f"/api/modules/{HIDDEN}"), ctx, token)[0] == 403
    page = get(ui(dc, "/"), ctx, token)[1]
    assert SEEN in page and f"/modules/{HIDDEN}" not in page
    assert get(ui(dc, "/metrics"), ctx, token)[0] == 403, "the conductor's metrics name every module"
    assert get(worker_metrics(dc), ctx, token)[0] == 403
    status, _ = get(ui(dc, "/api/status"), ctx, token[:-4] + "AAAA")
    assert status == 401, "a wrong token"


def test_an_app_without_view_is_refused(dc: DevCluster) -> None:
    status, body = get(ui(dc, "/api/status"), context(dc, Identity("app", "noview")))
    assert status == 403 and "app/noview" in body


def test_the_conductor_scrapes_the_worker_over_tls(dc: DevCluster) -> None:
    ctx = context(dc, DevCluster.ADMIN)

    def scraped() -> Any:
        scrapes = json.loads(get(ui(dc, "/api/workers"), ctx)[1])["scrapes"]
        n1 = scrapes.get("n1")
        return n1 is not None and n1["error"] is None and n1["samples"] > 0 and n1
    wait_for(scraped, 30, "a successful HTTPS scrape of n1")


def test_view_is_a_permission_the_cli_grants(dc: DevCluster, tmp_path: Path) -> None:
    from conductor.security import acl

    assert acl.VIEW in acl.PERMISSIONS
    assert acl.allowed(acl.Acls(), DevCluster.ADMIN, SEEN, "view")
    assert acl.allowed(acl.Acls(), Identity("conductor", "c1"), SEEN, "view")
    assert not acl.allowed(acl.Acls(), Identity("worker", "n1"), SEEN, "view")
