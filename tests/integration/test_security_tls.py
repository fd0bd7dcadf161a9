"""Mutual TLS for real: a grpc.aio server and asyncio links with conductor.security's credentials.

Nothing is mocked: real certificates from a real CA, real handshakes on loopback.
The gRPC service is the worker's Admin.Ping (the smallest one), served by a test
servicer that records who called; refusals are checked the way a client sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import socket
import ssl
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from conductor.security import certs, identity, tokens
from conductor.security.identity import Identity, IdentityError
from conductor.security.tls import (
    PeerRefused,
    TlsFiles,
    TlsSource,
    check_link_peer,
    token_channel_credentials,
)
from conductor.wire import admin_pb2, admin_pb2_grpc
from conductor.wire.channels import Channels

W1, W2, APP = Identity("worker", "n1"), Identity("worker", "n2"), Identity("app", "billing")
HOSTS = ["localhost", "127.0.0.1"]
# A new TCP connection per channel, so each check is a fresh handshake (gRPC shares subchannels otherwise).
FRESH = [("grpc.use_local_subchannel_pool", 1)]


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    certs.init_ca_dir(tmp_path / "ca")
    for who in (W1, W2, APP):
        certs.issue_to_dir(tmp_path / "ca", who, hosts=HOSTS)
    return tmp_path / "ca"


class Recorder(admin_pb2_grpc.AdminServicer):
    """Admin.Ping that reads the caller's identity the way a worker will, and aborts with its error."""

    def __init__(self) -> None:
        self.callers: list[Identity] = []

    async def Ping(self, request: admin_pb2.PingRequest, context: grpc.aio.ServicerContext) -> admin_pb2.PingReply:
        try:
            who = identity.from_grpc_context(context)
        except IdentityError as e:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(e))
        self.callers.append(who)
        return admin_pb2.PingReply()


@contextlib.asynccontextmanager
async def grpc_server(pki: Path) -> AsyncIterator[tuple[int, Recorder]]:
    """A grpc.aio server with worker n1's dynamic mutual-TLS credentials."""
    srv = grpc.aio.server()
    rec = Recorder()
    admin_pb2_grpc.add_AdminServicer_to_server(rec, srv)
    port = srv.add_secure_port("127.0.0.1:0", TlsSource(TlsFiles.in_dir(pki, W1)).grpc_server_credentials())
    await srv.start()
    try:
        yield port, rec
    finally:
        await srv.stop(None)


async def ping(port: int, creds: grpc.ChannelCredentials) -> None:
    async with grpc.aio.secure_channel(f"localhost:{port}", creds, options=FRESH) as ch:
        await admin_pb2_grpc.AdminStub(ch).Ping(admin_pb2.PingRequest(), timeout=5)


def raw_creds(ca: Path, issued: certs.Issued | None) -> grpc.ChannelCredentials:
    """Channel credentials straight from files, bypassing TlsSource's checks (to offer a bad certificate)."""
    if issued is None:
        return grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
    return grpc.ssl_channel_credentials(root_certificates=ca.read_bytes(), private_key=issued.key.read_bytes(),
                                        certificate_chain=issued.cert.read_bytes())


def test_grpc_mutual_tls_sees_the_callers_identity(pki: Path) -> None:
    async def scenario() -> None:
        async with grpc_server(pki) as (port, rec):
            await ping(port, TlsSource(TlsFiles.in_dir(pki, APP)).grpc_channel_credentials())
            assert rec.callers == [APP]
    asyncio.run(scenario())


@pytest.mark.parametrize("offer", ["no certificate", "another CA", "expired"])
def test_grpc_refuses_bad_client_certificates(pki: Path, tmp_path: Path, offer: str) -> None:
    ca = pki / certs.CA_CERT
    if offer == "no certificate":
        creds = raw_creds(ca, None)
    elif offer == "another CA":
        certs.init_ca_dir(tmp_path / "other")
        creds = raw_creds(ca, certs.issue_to_dir(tmp_path / "other", APP))
    else:
        past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
        creds = raw_creds(ca, certs.issue_to_dir(pki, APP, days=1, not_before=past, out=tmp_path / "expired"))

    async def scenario() -> None:
        async with grpc_server(pki) as (port, rec):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await ping(port, creds)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, "the handshake fails: no call reaches the servicer"
            assert rec.callers == []
    asyncio.run(scenario())


def test_grpc_certificate_without_san_is_refused_with_the_teaching_error(pki: Path, tmp_path: Path) -> None:
    creds = raw_creds(pki / certs.CA_CERT, certs.issue_to_dir(pki, None, out=tmp_path / "nosan"))

    async def scenario() -> None:
        async with grpc_server(pki) as (port, rec):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await ping(port, creds)
            details = e.value.details() or ""
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "missing SAN" in details and "conductor certs issue --role" in details
            assert rec.callers == []
    asyncio.run(scenario())


def served_serial(port: int, client: TlsFiles) -> int:
    """The serial of the certificate a TLS server presents to a new connection (a raw handshake, ALPN h2)."""
    ctx = ssl.create_default_context(cafile=str(client.ca))
    ctx.load_cert_chain(client.cert, client.key)
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
            ctx.wrap_socket(sock, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def file_serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def test_grpc_server_picks_up_a_rotated_certificate_without_restart(pki: Path) -> None:
    client = TlsFiles.in_dir(pki, APP)
    server_cert = TlsFiles.in_dir(pki, W1).cert

    async def scenario() -> None:
        async with grpc_server(pki) as (port, rec):
            before = file_serial(server_cert)
            assert await asyncio.to_thread(served_serial, port, client) == before
            certs.issue_to_dir(pki, W1, hosts=HOSTS)  # rotate the running server's files in place
            after = file_serial(server_cert)
            assert after != before
            assert await asyncio.to_thread(served_serial, port, client) == after, "a new connection: new cert"
            await ping(port, TlsSource(client).grpc_channel_credentials())
            assert rec.callers == [APP], "and calls still work"
    asyncio.run(scenario())


def test_blocking_channels_with_credentials_reach_the_secure_server(pki: Path) -> None:
    srv = grpc.server(ThreadPoolExecutor(2))
    seen: list[Identity] = []

    class Sync(admin_pb2_grpc.AdminServicer):
        def Ping(self, request: admin_pb2.PingRequest, context: grpc.ServicerContext) -> admin_pb2.PingReply:
            seen.append(identity.from_grpc_context(context))
            return admin_pb2.PingReply()

    admin_pb2_grpc.add_AdminServicer_to_server(Sync(), srv)
    port = srv.add_secure_port("127.0.0.1:0", TlsSource(TlsFiles.in_dir(pki, W1)).grpc_server_credentials())
    srv.start()
    try:
        with Channels(credentials=TlsSource(TlsFiles.in_dir(pki, W2)).grpc_channel_credentials) as channels:
            admin_pb2_grpc.AdminStub(channels.get(f"localhost:{port}")).Ping(admin_pb2.PingRequest(), timeout=5)
        with Channels() as plain, pytest.raises(grpc.RpcError):  # the default stays plaintext
            admin_pb2_grpc.AdminStub(plain.get(f"localhost:{port}")).Ping(admin_pb2.PingRequest(), timeout=2)
    finally:
        srv.stop(None)
    assert seen == [W2]


# ---- worker-to-worker asyncio links --------------------------------------------------------------------


async def link_server(files: TlsFiles, accept: set[Identity]) -> tuple[asyncio.Server, int, list[object]]:
    """A TLS echo of the peer's identity, refusing peers outside ``accept``; ``seen`` records what happened."""
    links = TlsSource(files).link_contexts()
    seen: list[object] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            peer = check_link_peer(writer, accept)
            seen.append(peer)
            writer.write(f"hello {peer}\n".encode())
            await writer.drain()
        except PeerRefused as e:
            seen.append(e)
        finally:
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=links.server())
    return srv, srv.sockets[0].getsockname()[1], seen


async def dial(port: int, ctx: ssl.SSLContext) -> tuple[bytes, int]:
    """Connect, read one line; returns it and the serial of the server's certificate."""
    # No server_hostname: dialing an IP sends no SNI, as a worker dialing an advertised IP does; the
    # listener swaps in the current certificate all the same.
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return await asyncio.wait_for(reader.readline(), 5), x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()


def test_link_mutual_tls_checks_the_peer_identity(pki: Path) -> None:
    asyncio.run(link_identity_scenario(pki))


async def link_identity_scenario(pki: Path) -> None:
    srv, port, seen = await link_server(TlsFiles.in_dir(pki, W1), accept={W2})
    async with srv:
        line, _ = await dial(port, TlsSource(TlsFiles.in_dir(pki, W2)).link_contexts().client())
        assert line == b"hello worker/n2\n"
        line, _ = await dial(port, TlsSource(TlsFiles.in_dir(pki, APP)).link_contexts().client())
        assert line == b"", "an app's certificate from the same CA is not a replica: the link is closed"
    assert seen[0] == W2
    assert isinstance(seen[1], PeerRefused) and "app/billing" in str(seen[1]) and "replica" in str(seen[1])


def test_link_refuses_a_foreign_ca(pki: Path, tmp_path: Path) -> None:
    asyncio.run(link_foreign_scenario(pki, tmp_path))


async def link_foreign_scenario(pki: Path, tmp_path: Path) -> None:
    certs.init_ca_dir(tmp_path / "other")
    certs.issue_to_dir(tmp_path / "other", W2)
    srv, port, seen = await link_server(TlsFiles.in_dir(pki, W1), accept={W2})
    async with srv:
        foreign = TlsSource(TlsFiles.in_dir(tmp_path / "other", W2)).link_contexts().client()
        # The client does not trust our server (another CA) ...
        with pytest.raises(ssl.SSLCertVerificationError):
            await dial(port, foreign)
        # ... and a client that trusts it but holds a foreign certificate is refused by the server.
        half = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        half.check_hostname = False
        half.load_verify_locations(pki / certs.CA_CERT)
        half.load_cert_chain(tmp_path / "other" / "worker-n2.pem", tmp_path / "other" / "worker-n2.key")
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            line, _ = await dial(port, half)
            assert line == b""  # TLS 1.3 may report the refusal only as a closed stream
            raise ConnectionResetError("closed by the server")
    assert seen == [], "the handler never ran: no identity was accepted"


def test_link_server_picks_up_a_rotated_certificate_without_restart(pki: Path) -> None:
    asyncio.run(link_rotation_scenario(pki))


async def link_rotation_scenario(pki: Path) -> None:
    files = TlsFiles.in_dir(pki, W1)
    srv, port, _ = await link_server(files, accept={W2})
    client = TlsSource(TlsFiles.in_dir(pki, W2)).link_contexts()
    async with srv:
        _, serial = await dial(port, client.client())
        assert serial == file_serial(files.cert)
        certs.issue_to_dir(pki, W1, hosts=HOSTS)
        line, serial2 = await dial(port, client.client())
        assert serial2 == file_serial(files.cert) != serial
        assert line == b"hello worker/n2\n"


# ---- apps with a bearer token ----------------------------------------------------------------------------


def test_token_port_authenticates_apps_by_bearer_token(pki: Path) -> None:
    """Server-only TLS plus a token: the identity comes from the token's record, a missing token is refused."""
    token, record = tokens.generate(APP)

    class ByToken(admin_pb2_grpc.AdminServicer):
        def __init__(self) -> None:
            self.callers: list[Identity] = []

        async def Ping(self, request: admin_pb2.PingRequest,
                       context: grpc.aio.ServicerContext) -> admin_pb2.PingReply:
            presented = tokens.presented_token(context.invocation_metadata())
            try:
                if presented is None:
                    raise tokens.TokenRefused("no token: send authorization: Bearer <token>")
                who = tokens.verify(presented, record if tokens.token_id(presented) == record.token_id else None)
            except tokens.TokenRefused as e:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(e))
            assert "x509_pem_cert" not in context.auth_context(), "this port asks for no certificate"
            self.callers.append(who)
            return admin_pb2.PingReply()

    async def scenario() -> None:
        srv = grpc.aio.server()
        servicer = ByToken()
        admin_pb2_grpc.add_AdminServicer_to_server(servicer, srv)
        source = TlsSource(TlsFiles.in_dir(pki, W1))
        port = srv.add_secure_port("127.0.0.1:0", source.grpc_server_credentials(require_client_certificate=False))
        await srv.start()
        ca = (pki / certs.CA_CERT).read_bytes()
        try:
            await ping(port, token_channel_credentials(ca, token))
            for creds in (raw_creds(pki / certs.CA_CERT, None), token_channel_credentials(ca, token[:-3] + "xyz")):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await ping(port, creds)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert token.split(".")[2] not in (e.value.details() or "")
        finally:
            await srv.stop(None)
        assert servicer.callers == [APP]

    asyncio.run(scenario())
