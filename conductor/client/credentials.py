"""How an app authenticates to the workers: its certificate (mutual TLS on their main port) or a bearer token
(server-only TLS on their token port), chosen once when it connects.

Both need the cluster's CA to verify the workers. A certificate wins when both are
given (it proves more: a stolen token works from anywhere). With neither, channels
are plaintext (or the process's own credentials, :mod:`conductor.wire.channels`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from conductor.client.errors import ClientError
from conductor.security.tls import TlsFiles, TlsSource, token_channel_credentials
from conductor.wire.channels import Credentials


@dataclass(frozen=True)
class AppCredentials:
    """What the client's channels present, and whether they dial the workers' token ports."""

    tls: TlsSource | None
    credentials: Credentials | None
    token_port: bool


def app_credentials(tls: TlsFiles | TlsSource | None, token: str | None, ca: Path | bytes | None) -> AppCredentials:
    """Check ``Cluster.connect``'s security arguments and build the channels' credentials."""
    if tls is not None:
        source = tls if isinstance(tls, TlsSource) else TlsSource(tls)
        return AppCredentials(source, source.grpc_channel_credentials, False)
    if token is None:
        if ca is not None:
            raise ClientError("ca= is the CA that verifies the workers for a token= app; give token= too, or "
                              "tls=TlsFiles(ca, cert, key) for an app with a certificate")
        return AppCredentials(None, None, False)
    if ca is None:
        raise ClientError("token= needs ca= (the cluster's CA certificate, PEM path or bytes) to verify the workers: "
                          "a bearer token is never sent to an unverified server")
    ca_pem = ca if isinstance(ca, bytes) else Path(ca).read_bytes()
    return AppCredentials(None, token_channel_credentials(ca_pem, token.strip()), True)
