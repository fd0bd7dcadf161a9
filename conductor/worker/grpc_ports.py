"""The worker's gRPC ports: the main port (mutual TLS, or plaintext) and, with TLS, the token port.

grpcio cannot make a client certificate optional on one port (a port either
requires one or never asks for one), yet apps that cannot hold a certificate
authenticate with a bearer token (:mod:`conductor.security.tokens`). So a worker
with TLS serves two ports on the same ``grpc.aio`` server, hence the same
services and the same :class:`~conductor.worker.authorization.Authorizer`:

* the **main port**: mutual TLS; the caller is its certificate's identity
  (workers, conductors, the CLI, apps with a certificate, Spark);
* the **token port**: server-only TLS (the app verifies the worker against the
  cluster's CA); the caller is the identity of the ``authorization: Bearer``
  token it sends on every call; a call without one is ``UNAUTHENTICATED``.

The token port exists only where calls are authorised: without the interceptor
a port that asks for nothing would let anyone in. Both addresses go in the
worker's znode (``address`` and ``token``); a client holding a token and no
certificate dials the second (:mod:`conductor.client.endpoints`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc

from conductor.security.tls import TlsSource
from conductor.settings import Listen


@dataclass(frozen=True)
class GrpcPorts:
    """The ports a worker's gRPC server bound (``token`` is None when it serves no token port)."""

    main: int
    token: int | None


def bind_grpc_ports(server: grpc.aio.Server, node_id: str, listen: Listen, port: int, tls: TlsSource | None,
                    token_port: int | None, authorized: bool) -> GrpcPorts:
    """Add the worker's ports to ``server`` (before it starts); OSError naming the setting if one cannot bind."""
    if token_port is not None:
        # a port that asks for no certificate is only safe when every call's token is checked
        assert tls is not None and authorized, "a token port needs TLS and authorization"
    main = _bind(lambda a: server.add_secure_port(a, tls.grpc_server_credentials()) if tls is not None
                 else server.add_insecure_port(a), listen.bind(port), node_id, "--host, --port")
    token = None
    if token_port is not None:
        assert tls is not None
        token = _bind(lambda a: server.add_secure_port(
            a, tls.grpc_server_credentials(require_client_certificate=False)),
            listen.bind(token_port), node_id, "--host, --token-port")
    return GrpcPorts(main, token)


def _bind(add: Callable[[str], int], address: str, node_id: str, settings: str) -> int:
    try:
        bound = int(add(address))
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise OSError(f"node {node_id} cannot bind gRPC on {address}: the address is not on this machine or the "
                      f"port is taken ({settings})")
    return bound
