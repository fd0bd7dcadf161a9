"""Replication transport, receiving side: peers' TCP links, their frames handed to the node's replicas.

Framing in :mod:`conductor.wire.peer_framing`. A link's frames are parsed on the
event loop as bytes arrive (an ``asyncio.Protocol``: no await per frame) and handed to ``deliver`` (``Worker.deliver``: it checks the sender
and posts each message to its replica's task thread). A sender that is not a
replica, a frame that does not decode or one over the size limit gets one
refusal and the link closes; its peer reconnects, as after any failure.

With TLS (``links``: :class:`~conductor.security.tls.LinkContexts`) the listener
requires a certificate from the cluster's CA; a link is kept only if that
certificate is a worker's, and each frame must name that worker as its ``src``
(:mod:`conductor.worker.peer_auth`): ``deliver`` is given the authenticated name.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from conductor.security.identity import IdentityError
from conductor.security.tls import PeerRefused
from conductor.wire import millrace_pb2 as pb
from conductor.wire.errors import InvalidRequest, RefusedPeer, status_of
from conductor.wire.peer_framing import LENGTH, MAX_FRAME_BYTES, refusal_bytes, tune_socket
from conductor.worker.peer_auth import link_peer

if TYPE_CHECKING:
    from conductor.security.tls import LinkContexts

log = logging.getLogger("millrace.transport")

#: links served at once; more are closed at once (peers number a few, each has one link to us)
MAX_LINKS = 256


class PeerServer:
    """Accepts replication links on ``host:port`` (0: a free port; ``port`` is the bound one once started)."""

    def __init__(self, deliver: Callable[[pb.PeerFrame, str | None], None], tls: LinkContexts | None = None
                 ) -> None:
        #: (frame, the sender's authenticated name, or None without TLS)
        self.deliver = deliver
        #: the listener's TLS contexts (None: plaintext)
        self.tls = tls
        self.port = 0
        self._server: asyncio.Server | None = None
        self.links: set[_Link] = set()

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        ssl = self.tls.server() if self.tls is not None else None
        self._server = await loop.create_server(lambda: _Link(self), host, port, ssl=ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            link.close()
        if self._server is not None:
            await self._server.wait_closed()


class _Link(asyncio.Protocol):
    """One peer's link: frames parsed as bytes arrive (every whole one of a read at once), none awaited."""

    def __init__(self, server: PeerServer) -> None:
        self.server = server
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        #: the worker the link's certificate names (TLS), else None
        self.peer: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if len(self.server.links) >= MAX_LINKS:
            log.warning("refused a replication link from %s: %d links open already",
                        transport.get_extra_info("peername"), len(self.server.links))
            transport.close()
            return
        self.server.links.add(self)
        tune_socket(transport.get_extra_info("socket"))
        if self.server.tls is not None:
            try:
                self.peer = link_peer(transport).name
            except (PeerRefused, IdentityError) as e:
                log.warning("refused a replication link from %s: %s", transport.get_extra_info("peername"), e)
                transport.write(refusal_bytes("UNAUTHENTICATED", str(e)))
                self.close()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        try:
            with memoryview(buf) as view:
                while len(buf) - pos >= LENGTH.size:
                    (n,) = LENGTH.unpack_from(buf, pos)
                    if n > MAX_FRAME_BYTES:
                        raise InvalidRequest("peer frame", f"{n} bytes, over the limit of {MAX_FRAME_BYTES}")
                    end = pos + LENGTH.size + n
                    if len(buf) < end:
                        break
                    with view[pos + LENGTH.size:end] as body:
                        try:
                            frame = pb.PeerFrame.FromString(body)
                        except DecodeError as e:
                            raise InvalidRequest("peer frame", f"does not decode: {e}") from None
                    pos = end
                    if self.peer is not None and frame.src != self.peer:
                        raise InvalidRequest("peer frame", f"names {frame.src!r} as its sender on a link whose "
                                             f"certificate is worker/{self.peer}; a worker sends only as itself")
                    self.server.deliver(frame, self.peer)
        except (RefusedPeer, InvalidRequest) as e:  # not a replica, or garbage: say why and close
            code, details, _meta = status_of(e)
            assert self.transport is not None
            self.transport.write(refusal_bytes(code.name, details))
            self.close()
            buf.clear()
            return
        del buf[:pos]

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()  # what is written still goes (a refusal)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.links.discard(self)
