"""The credentials of one CLI invocation: its ZooKeeper digest and the operator's TLS material.

Given before the command (``conductor --zk-auth FILE --tls-dir pki status``), or found in the state file of the
secure ``conductor dev`` cluster the command talks to, so that a developer never types them.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from conductor.cli_views import DEV_DIR
from conductor.metastore.zk_auth import ZkAuthError, ZkPrincipal, read_principal
from conductor.security.config import TLS_SETTINGS, tls_source
from conductor.settings import resolve
from conductor.wire.channels import use_process_credentials

#: ZooKeeper digest credentials of this invocation (``conductor --zk-auth FILE ...``), for every connection it opens
_zk_auth: list[ZkPrincipal] = []
#: the TLS flags given before the command (`conductor --tls-dir pki status`); read by `use_tls`
_TLS_FLAGS: dict[str, Any] = {}


class CredentialsError(Exception):
    """The credentials named cannot be used (the message says why and what to do)."""


def remember(zk_auth: Path | None, tls_flags: dict[str, Any]) -> None:
    """Keep the global options of this invocation (ZkAuthError when the digest file cannot be used)."""
    _zk_auth.clear()
    if zk_auth is not None:
        _zk_auth.append(read_principal(zk_auth))
    _TLS_FLAGS.clear()
    _TLS_FLAGS.update(tls_flags)


def dev_state(hosts: str) -> dict[str, Any]:
    """The state file of the `conductor dev` cluster at `hosts` (empty if there is none, or it is another's)."""
    with contextlib.suppress(ValueError, OSError):
        state = json.loads((DEV_DIR / "cluster.json").read_text())
        if isinstance(state, dict) and state.get("zk") == hosts:
            return state
    return {}


def zk_principal(hosts: str) -> ZkPrincipal | None:
    """The ZooKeeper digest of this invocation: `--zk-auth`, else a secure `conductor dev` cluster's at `hosts`."""
    if _zk_auth:
        return _zk_auth[0]
    path = dev_state(hosts).get("zk_auth")
    if not path:
        return None
    try:
        return read_principal(Path(path))
    except ZkAuthError as e:
        raise CredentialsError(str(e)) from None


def use_tls(hosts: str) -> None:
    """Every channel the command opens to a worker presents the operator's certificate (if it has one): the
    flags, the MILLRACE_TLS_* variables, else the pki of the secure `conductor dev` cluster at `hosts`."""
    tls = resolve(_TLS_FLAGS, TLS_SETTINGS[:4], "cli")
    if all(v is None for v in tls.values()):
        tls_dir = dev_state(hosts).get("tls_dir")
        if tls_dir:
            tls["tls_dir"] = Path(tls_dir)
    source = tls_source(tls, "admin")
    use_process_credentials(source.grpc_channel_credentials if source is not None else None)
