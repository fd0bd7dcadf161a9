"""The replication link's framing: ``PeerFrame`` messages over a plain TCP connection, length-prefixed.

Replication between workers does not go through gRPC. ``bench.peer_transport``
measures why: per frame, gRPC's Python aio stream costs several times the CPU of
an asyncio socket write on the sender and of a read on the receiver, and at 8
task groups a worker sends several thousand frames a second (each group's
drain ships its own). The protocol needs nothing gRPC adds: the replication
state machines tolerate lost, duplicated and reordered messages, so a broken
connection is simply reopened.

On the wire, each way:

* peer to worker: ``u32 length (little-endian) | PeerFrame`` repeated, a frame at
  most :data:`MAX_FRAME_BYTES` (gRPC's message limit, so an entry at its limit fits);
* worker to peer: nothing, unless it refuses the stream (a sender that is not a
  replica, a frame that does not decode, a length over the limit): then one
  ``u32 length | "CODE: details"`` (UTF-8, a gRPC status name) and it closes.
"""

from __future__ import annotations

import socket
import struct

from conductor.wire.options import MAX_MESSAGE_BYTES
from conductor.wire.packing import varint

__all__ = ["LENGTH", "MAX_FRAME_BYTES", "REFUSAL_MAX_BYTES", "frame_bytes", "refusal_bytes", "tune_socket"]

LENGTH = struct.Struct("<I")
MAX_FRAME_BYTES = MAX_MESSAGE_BYTES
#: a refusal's text is cut to this (it is read whole by the sender)
REFUSAL_MAX_BYTES = 4096
#: a link whose data stays unacknowledged this long is dead (a cut cable, a partition): the kernel aborts it,
#: the sender reconnects. Ten seconds as gRPC's keepalive was.
USER_TIMEOUT_MS = 10_000
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 3
KEEPALIVE_PROBES = 3


def frame_bytes(src: str, dst: str, messages: list[bytes]) -> bytes:
    """``PeerFrame(src, dst, messages)`` as the link carries it (length first), from encoded ``PeerMessage``s.

    The messages are encoded once, on the task thread that sent them; building a
    ``PeerFrame`` object would copy every message (entries included) into it
    before serializing it again. Fields 1, 2 and 3 are written by hand; the
    reader parses what follows the length as a ``PeerFrame``. One buffer, so one
    socket write.
    """
    s, d = src.encode(), dst.encode()
    parts = [b"", b"\x0a", varint(len(s)), s, b"\x12", varint(len(d)), d]
    for m in messages:
        parts += (b"\x1a", varint(len(m)), m)
    parts[0] = LENGTH.pack(sum(map(len, parts)))
    return b"".join(parts)


def refusal_bytes(code: str, details: str) -> bytes:
    """The one message a worker sends on a replication link: why it closes it."""
    text = f"{code}: {details}".encode()[:REFUSAL_MAX_BYTES]
    return LENGTH.pack(len(text)) + text


def tune_socket(sock: socket.socket | None) -> None:
    """Keepalive and a user timeout, so a link to a vanished peer dies in seconds rather than hours."""
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_PROBES), ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS)):
        option = getattr(socket, name, None)
        if option is not None:  # Linux has them all; elsewhere the defaults stand
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
