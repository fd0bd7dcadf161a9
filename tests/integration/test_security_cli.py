"""`conductor certs`, `conductor acl` and `conductor token`, in-process through typer's CliRunner, on a real ZooKeeper."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from typer.testing import CliRunner, Result

from conductor.cli import app
from conductor.metastore import Metastore
from conductor.security import identity
from conductor.security.identity import Identity

runner = CliRunner()


def run(*args: str) -> Result:
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_certs_init_and_issue(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    assert run("certs", "init", str(ca)).exit_code == 0
    result = run("certs", "issue", "--role", "worker", "--name", "n1", "--host", "127.0.0.1", str(ca))
    assert result.exit_code == 0, result.output
    assert "millrace://worker/n1" in result.output
    assert identity.from_pem((ca / "worker-n1.pem").read_bytes()) == Identity("worker", "n1")
    again = run("certs", "init", str(ca))
    assert again.exit_code == 1 and "already exists" in again.output
    bad = run("certs", "issue", "--role", "root", "--name", "x", str(ca))
    assert bad.exit_code == 1 and "roles are worker, conductor, admin, app" in bad.output


def test_acl_grant_list_revoke(zk_hosts: str) -> None:
    module, who = f"m{uuid.uuid4().hex[:8]}", f"app/a{uuid.uuid4().hex[:8]}"
    granted = run("acl", "grant", who, module, "append", "query", "--zk", zk_hosts)
    assert granted.exit_code == 0, granted.output
    listed = run("acl", "list", module, "--zk", zk_hosts, "--json")
    assert {"module": module, "identity": who, "permissions": ["append", "query"]} in json.loads(listed.output)
    table = run("acl", "list", module, "--zk", zk_hosts)
    assert who in table.output and "append, query" in table.output and "without any grant" in table.output
    assert run("acl", "revoke", who, module, "append", "--zk", zk_hosts).exit_code == 0
    with Metastore(zk_hosts) as ms:
        assert ms.acls.get()[0].granted(identity.parse(who), module) == {"query"}
    bad = run("acl", "grant", who, module, "write", "--zk", zk_hosts)
    assert bad.exit_code == 1 and "permissions are append, query, deploy, admin" in bad.output


def test_token_create_list_revoke(zk_hosts: str) -> None:
    name = f"t{uuid.uuid4().hex[:8]}"
    created = run("token", "create", "--name", name, "--zk", zk_hosts)
    assert created.exit_code == 0, created.output
    token = created.output.strip().splitlines()[-1]
    token_id = token.split(".")[1]
    with Metastore(zk_hosts) as ms:
        record = ms.tokens.get(token_id)
        assert record is not None and record.identity == Identity("app", name)
    listed = run("token", "list", "--zk", zk_hosts)
    assert token_id in listed.output and token.split(".")[2] not in listed.output
    assert run("token", "revoke", token_id, "--zk", zk_hosts).exit_code == 0
    gone = run("token", "revoke", token_id, "--zk", zk_hosts)
    assert gone.exit_code == 1 and "conductor token list" in gone.output
