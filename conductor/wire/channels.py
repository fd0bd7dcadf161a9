"""Blocking gRPC channels by address, opened on first use and closed together.

A caller that talks to the same workers again and again (the client's blocking
calls, a status poll) keeps one channel per worker: each new channel is a TCP
and HTTP/2 handshake that the worker's event loop serves beside the appends in
flight.

TLS: a ``Channels`` given ``credentials`` opens TLS channels with them. A process
that has exactly one identity (a worker, a conductor, the CLI) states it once at
start with :func:`use_process_credentials`; every channel opened without its own
credentials then uses it (status polls, code shipping, artifact fetches,
far-horizon copies), so no call path can forget it and fall back to plaintext.
A library client (``conductor.client.Cluster``) passes its own instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Self, TypeAlias

import grpc

from conductor.wire.options import GRPC_OPTIONS

Credentials: TypeAlias = grpc.ChannelCredentials | Callable[[], grpc.ChannelCredentials]

#: the process's own TLS identity for channels (set once at start by a worker, a conductor or the CLI)
_process_credentials: Credentials | None = None


def use_process_credentials(credentials: Credentials | None) -> None:
    """Make every channel opened without explicit credentials use these (None: plaintext again)."""
    global _process_credentials
    _process_credentials = credentials


def process_credentials() -> Credentials | None:
    return _process_credentials


def _resolved(credentials: Credentials | None) -> grpc.ChannelCredentials | None:
    creds = credentials if credentials is not None else _process_credentials
    return creds() if callable(creds) else creds


def open_channel(address: str, options: Sequence[tuple[str, Any]] = GRPC_OPTIONS,
                 credentials: Credentials | None = None) -> grpc.Channel:
    """A blocking channel: TLS with ``credentials`` (or the process's), else plaintext."""
    creds = _resolved(credentials)
    if creds is None:
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(address, creds, options=list(options))


def open_aio_channel(address: str, options: Sequence[tuple[str, Any]] = GRPC_OPTIONS,
                     credentials: Credentials | None = None) -> grpc.aio.Channel:
    """:func:`open_channel` for ``grpc.aio``."""
    creds = _resolved(credentials)
    if creds is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    return grpc.aio.secure_channel(address, creds, options=list(options))


class Channels:
    """One ``grpc.Channel`` per address, with ``options``; thread-safe.

    ``credentials`` makes every channel a TLS channel: a ``grpc.ChannelCredentials``,
    or a function returning the current ones (``TlsSource.grpc_channel_credentials``
    in :mod:`conductor.security.tls`), called per new channel so that channels
    opened after a certificate rotation use the new files. ``None``: the process's
    (:func:`use_process_credentials`), else plaintext.
    """

    def __init__(self, options: Sequence[tuple[str, Any]] = GRPC_OPTIONS,
                 credentials: Credentials | None = None) -> None:
        self.options = list(options)
        self.credentials = credentials
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def get(self, address: str) -> grpc.Channel:
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                ch = self._channels[address] = self._open(address)
            return ch

    def _open(self, address: str) -> grpc.Channel:
        return open_channel(address, self.options, self.credentials)

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
