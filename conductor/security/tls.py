"""TLS material from PEM files (CA bundle, certificate, key), reloaded when the files change, without a restart.

Certificates expire and get rotated; a store that must restart every process to
take a new certificate turns each rotation into an outage. So nothing here holds
a certificate for good: every consumer asks :class:`TlsSource` for the current
material, which re-reads the files when their size, mtime or inode changed.

* **gRPC servers**: :meth:`TlsSource.grpc_server_credentials` is a
  ``grpc.dynamic_ssl_server_credentials`` whose fetcher gRPC calls on every new
  connection; it returns a new configuration when the files changed, else ``None``
  (keep the current one). Client certificates are required (mutual TLS).
* **gRPC channels**: :meth:`TlsSource.grpc_channel_credentials` builds
  ``grpc.ssl_channel_credentials`` from the current files; a channel opened after a
  rotation uses the new files (gRPC credentials cannot change under an open channel).
* **worker-to-worker asyncio links**: :meth:`TlsSource.link_server_context` and
  :meth:`TlsSource.link_client_context`, an ``ssl.SSLContext`` pair (see :class:`LinkContexts`).

A change that does not load (a new key beside the old certificate during a
rotation's two renames, a certificate from another CA, an expired one) keeps the
previous material and logs a warning that names the file and the problem, once per
change. No log line, repr or error ever contains key bytes.
"""

from __future__ import annotations

import datetime
import logging
import os
import ssl
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from conductor.security import identity as ident
from conductor.security.certs import CA_CERT
from conductor.security.identity import Identity

log = logging.getLogger("millrace.security")

_ISSUE = "conductor certs issue --role ROLE --name NAME [--host H] CA_DIR"


class TlsError(Exception):
    """The TLS files cannot be used; the message names the file and what to do."""


class PeerRefused(Exception):
    """A verified peer is not one this link accepts (not a replica of the group, wrong role)."""


Stamp = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class TlsFiles:
    """Where a process's PEM files are: the CA bundle it trusts, its certificate (chain) and its key."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_dir(cls, directory: Path, identity: Identity) -> TlsFiles:
        """The layout ``conductor certs issue`` writes: ``ca.pem``, ``<role>-<name>.pem`` and ``.key``."""
        stem = f"{identity.role}-{identity.name}"
        return cls(directory / CA_CERT, directory / f"{stem}.pem", directory / f"{stem}.key")

    def stamp(self) -> Stamp:
        """What changes when a file is rewritten (or renamed over); a missing file raises TlsError."""
        out = []
        for path in (self.ca, self.cert, self.key):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                raise TlsError(f"TLS file {path} is missing; make it with `{_ISSUE}`") from None
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)


@dataclass(frozen=True)
class TlsMaterial:
    """The PEM bytes of one consistent set of files (the key never appears in a repr)."""

    ca: bytes
    cert: bytes
    key: bytes = field(repr=False)
    identity: Identity
    not_after: datetime.datetime


def load_material(files: TlsFiles, now: datetime.datetime | None = None) -> TlsMaterial:
    """Read and check the files: the key matches the certificate, the CA signed it, it is valid now.

    These are the mistakes a rotation makes; finding them here gives an error that
    names the file, where the peer would only see a failed handshake.
    """
    try:
        ca_pem, cert_pem, key_pem = files.ca.read_bytes(), files.cert.read_bytes(), files.key.read_bytes()
    except FileNotFoundError as e:
        raise TlsError(f"TLS file {e.filename} is missing; make it with `{_ISSUE}`") from None
    try:
        cas = x509.load_pem_x509_certificates(ca_pem)
        chain = x509.load_pem_x509_certificates(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError as e:
        raise TlsError(f"cannot parse the TLS files {files.cert}, {files.key}, {files.ca} "
                       f"({type(e).__name__}); they must be unencrypted PEM") from None
    leaf = chain[0]
    if key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) \
            != leaf.public_key().public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo):
        raise TlsError(f"the key {files.key} does not belong to the certificate {files.cert}; "
                       "write both from the same `conductor certs issue` run")
    issuer = chain[1] if len(chain) > 1 else next((c for c in cas if c.subject == leaf.issuer), None)
    foreign = TlsError(f"the certificate {files.cert} was not issued by the CA in {files.ca} (issuer "
                       f"{leaf.issuer.rfc4514_string()!r}): peers will refuse it as a certificate from another "
                       "CA; issue it from this cluster's CA, or add its CA to the bundle")
    if issuer is None:
        raise foreign
    try:
        leaf.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        raise foreign from None
    now = now or datetime.datetime.now(datetime.UTC)
    if now > leaf.not_valid_after_utc:
        raise TlsError(f"the certificate {files.cert} expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; "
                       f"issue a new one with `{_ISSUE}` (the running process picks it up, no restart)")
    if now < leaf.not_valid_before_utc:
        raise TlsError(f"the certificate {files.cert} is not valid before {leaf.not_valid_before_utc:%Y-%m-%d %H:%M} "
                       "UTC; check this machine's clock")
    return TlsMaterial(ca_pem, cert_pem, key_pem, ident.from_certificate(leaf), leaf.not_valid_after_utc)


class TlsSource:
    """The current :class:`TlsMaterial` of some files, re-read when they change; thread-safe.

    ``generation`` grows by one per successful reload, so each consumer (a gRPC
    fetcher, an SSLContext cache) knows whether what it built is still current.
    Loading fails loudly the first time (a process must not start without its
    certificate) and quietly later (keep serving with the previous material).
    """

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._stamp = files.stamp()
        self._material = load_material(files)
        self._bad_stamp: Stamp | None = None
        self.generation = 0

    @property
    def identity(self) -> Identity:
        return self._material.identity

    def current(self) -> tuple[TlsMaterial, int]:
        """The material and its generation, after re-reading the files if they changed."""
        with self._lock:
            try:
                stamp = self.files.stamp()
            except TlsError as e:
                self._warn_once((), str(e))  # () stands for "a file is missing"
                return self._material, self.generation
            if stamp != self._stamp and stamp != self._bad_stamp:
                try:
                    material = load_material(self.files)
                except TlsError as e:
                    self._warn_once(stamp, str(e))
                else:
                    self._material, self._stamp, self._bad_stamp = material, stamp, None
                    self.generation += 1
                    log.info("reloaded TLS certificate %s for %s (valid until %s)", self.files.cert,
                             material.identity, material.not_after)
            return self._material, self.generation

    def _warn_once(self, stamp: Stamp, problem: str) -> None:
        if stamp != self._bad_stamp:
            log.warning("TLS files changed but were not loaded, keeping the previous certificate: %s", problem)
        self._bad_stamp = stamp

    # ---- gRPC ----------------------------------------------------------------------------------------------

    def grpc_server_credentials(self, require_client_certificate: bool = True) -> grpc.ServerCredentials:
        """Server credentials whose certificate and CA follow the files, per new connection.

        By default mutual TLS: a client without a certificate from the CA fails the
        handshake. ``require_client_certificate=False`` is for a port that serves apps
        authenticated by bearer token (:mod:`conductor.security.tokens`) over
        server-only TLS: grpcio has no "request but do not require" mode, and with this
        flag it does not even ask for a client certificate, so such a port sees no
        certificate identity at all. A worker serving both kinds of apps therefore
        needs two ports.
        """
        material, generation = self.current()
        served = [generation]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            # gRPC calls this before each handshake, on its own threads; it must not raise.
            try:
                material, generation = self.current()
            except Exception:
                log.exception("TLS reload failed; keeping the current certificate")
                return None
            if generation == served[0]:
                return None
            served[0] = generation
            return _server_config(material)

        return grpc.dynamic_ssl_server_credentials(_server_config(material), fetch,
                                                   require_client_authentication=require_client_certificate)

    def grpc_channel_credentials(self) -> grpc.ChannelCredentials:
        """Client credentials from the current files: our certificate for the server, its CA to verify it."""
        material, _ = self.current()
        return grpc.ssl_channel_credentials(root_certificates=material.ca, private_key=material.key,
                                            certificate_chain=material.cert)

    # ---- asyncio links -------------------------------------------------------------------------------------

    def link_contexts(self) -> LinkContexts:
        return LinkContexts(self)


def token_channel_credentials(ca: bytes, token: str) -> grpc.ChannelCredentials:
    """For an app without a certificate: TLS that verifies the server against ``ca`` (PEM), and ``token`` sent
    as ``authorization: Bearer <token>`` on every call (gRPC sends call credentials only over TLS)."""
    return grpc.composite_channel_credentials(grpc.ssl_channel_credentials(root_certificates=ca),
                                              grpc.access_token_call_credentials(token))


def _server_config(material: TlsMaterial) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(material.key, material.cert)],
                                                     root_certificates=material.ca)


def _base_context(purpose: int, files: TlsFiles, ca: bytes,
                  client_certificate: ssl.VerifyMode = ssl.CERT_REQUIRED) -> ssl.SSLContext:
    ctx = ssl.SSLContext(purpose)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    # a client always verifies the server; a server asks for (and verifies) the client's certificate
    ctx.verify_mode = client_certificate if purpose == ssl.PROTOCOL_TLS_SERVER else ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=ca.decode())
    ctx.load_cert_chain(files.cert, files.key)  # ssl reads only files; a mismatch with the key raises
    return ctx


class LinkContexts:
    """The ``ssl.SSLContext`` pair of the worker-to-worker TCP links: mutual TLS against the cluster's CA.

    Both sides require and verify the other's certificate against the CA. Hostname
    checking is **off** and the peer's :class:`Identity` is checked instead
    (:func:`check_link_peer`), because:

    * a link's address comes from ZooKeeper (what the peer advertised): often an IP,
      a NAT-ed or container address that no certificate lists, so a hostname check
      would fail for a legitimate replica or push operators to put every address in
      every certificate;
    * a hostname match proves only that *some* certificate for that host answered;
      a replication link must prove that *the replica the group's znode names*
      answered, which the identity check does exactly (and an app's certificate on
      the same host cannot pass it).

    :meth:`server` returns one context for ``asyncio.start_server`` for the life of
    the listener; its SNI callback (which OpenSSL runs on every ClientHello, with or
    without a server name) swaps in the context built from the current files, so a
    rotated certificate or CA is served from the next connection, with no restart.
    :meth:`client` builds a new context when the files changed; call it per dial.

    ``client_certificate``: what the server side asks of clients, ``CERT_REQUIRED`` on a
    replication link; the HTTPS endpoints ask without requiring (``CERT_OPTIONAL``,
    :mod:`conductor.security.https`: a bearer token may stand in).
    """

    def __init__(self, source: TlsSource, client_certificate: ssl.VerifyMode = ssl.CERT_REQUIRED) -> None:
        self.source = source
        self.client_certificate = client_certificate
        self._lock = threading.Lock()
        self._built: dict[int, tuple[int, ssl.SSLContext]] = {}
        self._failed: dict[int, int] = {}  # purpose -> the generation that did not load (not retried, not re-logged)
        self._listener: ssl.SSLContext | None = None

    def _context(self, purpose: int) -> ssl.SSLContext:
        material, generation = self.source.current()
        with self._lock:
            built = self._built.get(purpose)
            if built is not None and (built[0] == generation or self._failed.get(purpose) == generation):
                return built[1]
            try:
                ctx = _base_context(purpose, self.source.files, material.ca, self.client_certificate)
            except (ssl.SSLError, OSError) as e:
                if built is None:
                    raise TlsError(f"cannot load {self.source.files.cert} and {self.source.files.key} into an "
                                   f"SSL context ({e.__class__.__name__}: {e.args[-1] if e.args else ''}); "
                                   f"re-issue them with `{_ISSUE}`") from None
                # The files changed again after TlsSource read them (mid-rotation): the next change is a new
                # generation, loaded then.
                self._failed[purpose] = generation
                log.warning("TLS files %s changed but did not load into an SSL context; keeping the previous one",
                            self.source.files.cert)
                return built[1]
            self._built[purpose] = (generation, ctx)
            return ctx

    def client(self) -> ssl.SSLContext:
        """A client context from the current files (pass ``server_hostname`` anything: it is not checked)."""
        return self._context(ssl.PROTOCOL_TLS_CLIENT)

    def server(self) -> ssl.SSLContext:
        """The listener's context: stable for the server, its handshakes use the current files."""
        with self._lock:
            listener = self._listener
        if listener is None:
            listener = self._context(ssl.PROTOCOL_TLS_SERVER)
            listener.sni_callback = self._swap
            with self._lock:
                self._listener = listener
        return listener

    def _swap(self, ssl_object: ssl.SSLObject, _server_name: str | None, _ctx: ssl.SSLContext) -> None:
        try:
            current = self._context(ssl.PROTOCOL_TLS_SERVER)
        except Exception:
            log.exception("TLS reload failed; this handshake uses the listener's certificate")
            return
        if current is not ssl_object.context:
            ssl_object.context = current


def check_link_peer(transport: Any, accept: Collection[Identity] | Callable[[Identity], bool]) -> Identity:
    """The verified peer of an asyncio TLS link, if ``accept`` takes it; else :class:`PeerRefused`.

    ``transport`` is an asyncio transport or a ``StreamWriter`` (anything with
    ``get_extra_info``); ``accept`` is the replicas the group's znode names (as
    worker identities), or a predicate.
    """
    peer = ident.from_ssl_object(transport.get_extra_info("ssl_object"))
    ok = accept(peer) if callable(accept) else peer in accept
    if not ok:
        raise PeerRefused(f"refused a TLS link from {peer}: not one of the identities this link accepts "
                          f"({', '.join(sorted(map(str, accept))) if not callable(accept) else 'by rule'}); "
                          "a replication link must come from a worker the group's znode names as a replica")
    return peer
