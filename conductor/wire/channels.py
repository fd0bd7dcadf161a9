"""Blocking gRPC channels by address, opened on first use and closed together.

A caller that talks to the same workers again and again (the client's blocking
calls, a status poll) keeps one channel per worker: each new channel is a TCP
and HTTP/2 handshake that the worker's event loop serves beside the appends in
flight.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Self

import grpc

from conductor.wire.options import GRPC_OPTIONS


class Channels:
    """One ``grpc.Channel`` per address, with ``options``; thread-safe.

    ``credentials`` makes every channel a TLS channel: a ``grpc.ChannelCredentials``,
    or a function returning the current ones (``TlsSource.grpc_channel_credentials``
    in :mod:`conductor.security.tls`), called per new channel so that channels
    opened after a certificate rotation use the new files. ``None``: plaintext.
    """

    def __init__(self, options: Sequence[tuple[str, Any]] = GRPC_OPTIONS,
                 credentials: grpc.ChannelCredentials | Callable[[], grpc.ChannelCredentials] | None = None) -> None:
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
        if self.credentials is None:
            return grpc.insecure_channel(address, options=self.options)
        creds = self.credentials() if callable(self.credentials) else self.credentials
        return grpc.secure_channel(address, creds, options=self.options)

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
