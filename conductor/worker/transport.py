"""Replication transport, sending side: protocol messages between nodes over one TCP link per peer.

The replication state machines tolerate lost, duplicated and reordered
messages, so the transport is deliberately simple: a bounded hand-off from
the task threads to the event loop, a bounded queue per peer, drained into one
``PeerFrame`` per write (many messages per frame, which is what Python's
per-message cost demands; an idle link is written at once, without the
queue, and an idle plaintext link straight from the task thread, without the
event loop: :meth:`PeerTransport.send_many`), and a link that is reopened after
a failure without replaying anything. A full queue drops the newest message rather than growing: the
leader resends after ``replication.request.timeout.millis``. The
framing, and why it is not gRPC, is in :mod:`conductor.wire.peer_framing`; the
receiving side is :mod:`conductor.worker.peer_server`. With TLS each dial uses the
current client context (a rotated certificate is used from the next link) and the
link is kept only if the peer's certificate is the worker we dialled.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from conductor.security.identity import IdentityError
from conductor.security.tls import LinkContexts, PeerRefused
from conductor.settings import split_hostport
from conductor.wire import millrace_pb2 as pb
from conductor.wire.packing import pack_lengths, unpack_lengths
from conductor.wire.peer_framing import LENGTH, MAX_FRAME_BYTES, REFUSAL_MAX_BYTES, frame_bytes, tune_socket
from conductor.worker.dataflow import Inflow
from conductor.worker.inbox import PeerMessage
from conductor.worker.peer_auth import expect_worker
from replog.config import MAX_ENTRY_BYTES_CEILING
from replog.messages import EpochRequest, EpochResponse, FarHorizonOffer, RawReplicate, ReplicateAck
from topology.dataflow.group import Batch
from topology.dataflow.shipping import Pull

log = logging.getLogger("millrace.transport")

#: messages queued for one peer; a full queue drops the newest (counted in `_PeerLink.dropped`)
MAX_QUEUED_MESSAGES = 10_000
#: messages handed from task threads to the event loop and not yet given to their links (a stalled loop);
#: past it the newest are dropped (counted in `PeerTransport.dropped`), as a full peer queue does
MAX_HANDOFF_MESSAGES = 4 * MAX_QUEUED_MESSAGES
#: a frame stops taking more queued messages past this size
FRAME_TARGET_BYTES = 3 * 1024 * 1024
#: the most a frame's messages may add up to (room left for the frame's own fields)
MAX_SENDABLE_BYTES = MAX_FRAME_BYTES - 64 * 1024
#: a write waits (backpressure) while this much is buffered for the socket
WRITE_BUFFER_BYTES = 8 * 1024 * 1024
CONNECT_TIMEOUT_S = 3.0
# a replication message is at most a read of ~2 MiB of frames plus one frame holding one entry at its limit
assert MAX_SENDABLE_BYTES > MAX_ENTRY_BYTES_CEILING + 8 * 1024 * 1024, "an entry at its limit must fit a message"


def to_proto(module: str, group: int, msg: Any) -> pb.PeerMessage:
    if isinstance(msg, RawReplicate):
        # The frames (an entry of a batched append: about 1 MB) are set on the message's own sub-message: a
        # ReplicateMsg built apart and passed in is merged by serializing and parsing it, two more copies.
        m = pb.PeerMessage(module=module, group=group)
        r = m.replicate
        r.SetInParent()  # (a heartbeat: no frames, every field at its default, still a replicate)
        r.epoch, r.start, r.frames, r.apply_offset = msg.epoch, msg.start, msg.frames, msg.apply_offset
        return m
    if isinstance(msg, ReplicateAck):
        return pb.PeerMessage(module=module, group=group, ack=pb.AckMsg(
            epoch=msg.epoch, held=msg.held, log_end=msg.log_end, reset=msg.reset, incarnation=msg.incarnation))
    if isinstance(msg, EpochRequest):
        return pb.PeerMessage(module=module, group=group, epoch_request=pb.EpochRequestMsg(
            epoch=msg.epoch, requested_epoch=msg.requested_epoch))
    if isinstance(msg, EpochResponse):
        return pb.PeerMessage(module=module, group=group, epoch_response=pb.EpochResponseMsg(
            epoch=msg.epoch, requested_epoch=msg.requested_epoch, found_epoch=msg.found_epoch,
            end_offset=msg.end_offset))
    if isinstance(msg, FarHorizonOffer):
        return pb.PeerMessage(module=module, group=group, far_horizon=pb.FarHorizonMsg(epoch=msg.epoch))
    if isinstance(msg, Pull):
        return pb.PeerMessage(module=module, group=group, pull=pb.PullMsg(
            dst=msg.dst, epoch=msg.epoch, position=msg.position, window=msg.window,
            report_position=msg.report[0], report_incomplete=msg.report[1]))
    if isinstance(msg, Batch):
        raws = [raw for _seq, raw in msg.envelopes]
        return pb.PeerMessage(module=module, group=group, envelopes=pb.EnvelopesMsg(
            src=msg.src, first=msg.envelopes[0][0], packed=b"".join(raws), lengths=pack_lengths(raws)))
    raise TypeError(f"cannot send {type(msg).__name__} to a peer")


def from_proto(src: str, dst: str, m: pb.PeerMessage) -> PeerMessage:
    """The event (or RawReplicate, validated later on the task thread) a received message becomes."""
    body = m.WhichOneof("body")
    if body == "replicate":
        r = m.replicate
        return RawReplicate(src, r.epoch, r.start, r.frames, r.apply_offset)
    if body == "ack":
        a = m.ack
        return ReplicateAck(src, dst, a.epoch, a.held, a.log_end, a.reset, a.incarnation)
    if body == "epoch_request":
        q = m.epoch_request
        return EpochRequest(src, dst, q.epoch, q.requested_epoch)
    if body == "epoch_response":
        e = m.epoch_response
        return EpochResponse(src, dst, e.epoch, e.requested_epoch, e.found_epoch, e.end_offset)
    if body == "far_horizon":
        return FarHorizonOffer(src, m.far_horizon.epoch)
    if body == "pull":
        p = m.pull
        return Inflow(src, Pull(m.group, p.dst, p.epoch, p.position, p.window,
                                (p.report_position, tuple(p.report_incomplete))))
    if body == "envelopes":
        e = m.envelopes
        raws = unpack_lengths(e.packed, e.lengths)
        return Inflow(src, Batch(e.src, [(e.first + i, raw) for i, raw in enumerate(raws)]))
    raise ValueError(f"peer message from {src} has no body")


class _PeerLink:
    """The outbound connection to one peer node (conductor.wire.peer_framing)."""

    def __init__(self, transport: PeerTransport, dst: str) -> None:
        self.t = transport
        self.dst = dst
        #: encoded PeerMessages
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(MAX_QUEUED_MESSAGES)
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"peer-{dst}")
        self.dropped = 0
        #: a message taken from the queue that did not fit the last frame: the next frame's first
        self._carry: bytes | None = None
        #: the open link's writer and the end of its peer's refusal, while connected (see `offer_many`)
        self._writer: asyncio.StreamWriter | None = None
        self._refused: asyncio.Future[str] | None = None
        #: the sender waits on an empty queue with nothing carried: the link is idle
        self._parked = False
        #: a duplicate of the open plaintext link's socket descriptor, for task threads' direct writes (None
        #: with TLS or while not connected); ours, so asyncio closing its own cannot hand the number to
        #: another file under a writing thread. Set, used and closed under the transport's lock.
        self._fd: int | None = None
        #: the end of a frame a task thread's direct write left unwritten (a full socket buffer): the event
        #: loop writes it before anything else (:meth:`_write`), so frames never interleave
        self._tail: bytes | None = None

    def offer_many(self, msgs: list[bytes]) -> None:
        """Event loop: ``msgs`` for this peer, in order; written at once as one frame when the link is idle.

        An idle link (connected, its sender parked on an empty queue, the socket's buffer below
        WRITE_BUFFER_BYTES) takes the frame straight from this call: no queue put, no wake-up of the sender
        task one loop iteration later (two hand-offs per replication round trip on the path of every
        acknowledgement). Anything else goes through the queue, whose sender keeps the order, the frame
        bounds and the backpressure (a busy socket, a broken or refused link) as before.
        """
        w, refused = self._writer, self._refused
        if (self._parked and w is not None and refused is not None and not refused.done()
                and not w.transport.is_closing() and self.queue.empty()
                and w.transport.get_write_buffer_size() < WRITE_BUFFER_BYTES
                and sum(map(len, msgs)) <= FRAME_TARGET_BYTES):
            self._write(frame_bytes(self.t.node_id, self.dst, msgs))
            return
        for m in msgs:
            self.offer(m)

    def write_direct(self, msgs: list[bytes]) -> bool:
        """Task thread, holding the transport's lock: write ``msgs`` as one frame on the socket now if the link
        is idle with nothing buffered (False: not written, the caller hands them to the event loop).

        This is the hand-off it saves: the event loop, woken through its self-pipe, must then win the GIL
        from the task thread that goes on with its drain (its apply), 100-300 µs on a loaded 2-core box, on
        the path of every acknowledgement (the leader's entries, the follower's ack). asyncio's transport is
        not thread-safe, so the write is a plain ``os.write`` on our descriptor when asyncio's buffer is
        empty and the lock keeps every loop-side write out meanwhile; what the socket did not take is the
        :attr:`_tail`, which the loop writes first.
        """
        w, refused, fd = self._writer, self._refused, self._fd
        if not (self._parked and fd is not None and w is not None and refused is not None and not refused.done()
                and self._tail is None and not w.transport.is_closing() and self.queue.empty()
                and w.transport.get_write_buffer_size() == 0 and sum(map(len, msgs)) <= FRAME_TARGET_BYTES):
            return False
        data = frame_bytes(self.t.node_id, self.dst, msgs)
        try:
            n = os.write(fd, data)
        except BlockingIOError:
            n = 0
        except OSError as e:  # the link broke: the frame is lost, as with a queued one; the loop sees the break
            log.debug("replication link to %s broke on a direct write: %r", self.dst, e)
            return True
        if n < len(data):
            self._tail = data[n:]
            try:
                self.t.loop.call_soon_threadsafe(self._write_tail)
            except RuntimeError:  # the loop is closed: the node is stopping, the link with it
                pass
        return True

    def _write_tail(self) -> None:
        with self.t.lock:
            self._write(b"")

    def _write(self, data: bytes) -> None:
        """Event loop, holding the transport's lock: ``data`` after what a direct write left unwritten."""
        w = self._writer
        if w is None:
            return
        if self._tail is not None:
            w.write(self._tail)
            self._tail = None
        if data:
            w.write(data)

    def offer(self, m: bytes) -> None:
        self._parked = False  # (the sender is woken: task threads' direct writes wait for it to park again)
        try:
            self.queue.put_nowait(m)
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped % 1000 == 1:
                log.warning("replication queue to %s is full; dropped %d message(s) (they will be resent)",
                            self.dst, self.dropped)

    async def _frame(self) -> bytes:
        """The next frame: what is queued, up to about FRAME_TARGET_BYTES, never over the frame limit.

        Entries are bounded (``replication.max.entry.bytes``, at most half the
        limit), so a message over the limit is a bug; it is dropped with a
        warning rather than breaking the link for every group, and the
        follower it was for stops confirming and leaves the ISR like any
        lagging one.
        """
        while True:
            if self._carry is not None:
                raw = self._carry
            else:
                self._parked = True
                try:
                    raw = await self.queue.get()
                finally:
                    self._parked = False
            self._carry = None
            if len(raw) > MAX_SENDABLE_BYTES:
                m = pb.PeerMessage.FromString(raw)  # (only to say what it was)
                log.warning("dropped a %d-byte %s message for %s/%d to %s: over the transport's limit of %d bytes; "
                            "that follower will leave the ISR", len(raw), m.WhichOneof("body"), m.module, m.group,
                            self.dst, MAX_SENDABLE_BYTES)
                continue
            break
        msgs = [raw]
        size = len(raw)
        while size < FRAME_TARGET_BYTES and not self.queue.empty():
            m = self.queue.get_nowait()
            if size + len(m) > MAX_SENDABLE_BYTES:
                self._carry = m  # the next frame's first message
                break
            msgs.append(m)
            size += len(m)
        return frame_bytes(self.t.node_id, self.dst, msgs)

    async def _run(self) -> None:
        backoff = 0.05
        while not self.t.closed:
            address = await asyncio.to_thread(self.t.resolve, self.dst)
            if address is None:
                await asyncio.sleep(0.5)
                continue
            writer: asyncio.StreamWriter | None = None
            try:
                host, port = split_hostport(address)
                tls = self.t.tls.client() if self.t.tls is not None else None
                reader, w = await asyncio.wait_for(
                    asyncio.open_connection(host, port, ssl=tls, server_hostname=self.dst if tls else None),
                    CONNECT_TIMEOUT_S)
                writer = w
                if tls is not None:
                    expect_worker(w, self.dst)  # the address came from ZooKeeper: prove who answered
                tune_socket(w.get_extra_info("socket"))
                w.transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
                refused = asyncio.ensure_future(_read_refusal(reader))
                backoff = 0.05
                with self.t.lock:
                    self._writer, self._refused = w, refused
                    if tls is None:
                        self._fd = os.dup(w.get_extra_info("socket").fileno())
                while not refused.done():
                    data = await self._frame()
                    with self.t.lock:
                        self._write(data)
                    await w.drain()
                reason = refused.result()
                if reason:
                    log.warning("node %s refused replication from %s: %s", self.dst, self.t.node_id, reason)
            except asyncio.CancelledError:
                raise
            except (TimeoutError, OSError, ValueError) as e:
                log.debug("replication link to %s at %s broke: %r", self.dst, address, e)
                self.t.forget(self.dst)
            except (PeerRefused, IdentityError) as e:
                log.warning("replication link to %s at %s refused: %s", self.dst, address, e)
                self.t.forget(self.dst)
            except Exception:
                log.exception("replication link to %s failed", self.dst)
            finally:
                with self.t.lock:
                    self._writer = self._refused = None
                    self._tail = None
                    if self._fd is not None:
                        os.close(self._fd)
                        self._fd = None
                if writer is not None:
                    writer.close()
            await asyncio.sleep(backoff)
            backoff = min(1.0, backoff * 2)


async def _read_refusal(reader: asyncio.StreamReader) -> str:
    """What the peer says before closing the link ("" if it closed without a word, or the link broke)."""
    try:
        (n,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
        if n > REFUSAL_MAX_BYTES:
            return f"(an unreadable {n}-byte refusal)"
        return (await reader.readexactly(n)).decode(errors="replace")
    except (asyncio.IncompleteReadError, OSError):
        return ""


class PeerTransport:
    """Sends protocol messages to peer nodes; thread-safe `send` for task threads."""

    def __init__(self, node_id: str, loop: asyncio.AbstractEventLoop,
                 resolve: Callable[[str], str | None], forget: Callable[[str], None],
                 tls: LinkContexts | None = None) -> None:
        self.node_id = node_id
        #: the links' TLS contexts (None: plaintext)
        self.tls = tls
        self.loop = loop
        self.resolve = resolve
        self.forget = forget
        self.links: dict[str, _PeerLink] = {}
        self.closed = False
        #: messages encoded by task threads, handed to the links by one loop callback per burst
        self._outbox: list[tuple[str, bytes]] = []
        #: guards the hand-off and every write on a link's socket (task threads write idle links directly)
        self.lock = threading.Lock()
        self._wake_scheduled = False
        #: messages dropped because the hand-off held MAX_HANDOFF_MESSAGES (the protocol resends)
        self.dropped = 0

    def send(self, dst: str, module: str, group: int, msg: Any) -> None:
        """Called from any thread: encode here (off the event loop), enqueue on the loop."""
        self.send_many(module, group, [(dst, msg)])

    def send_many(self, module: str, group: int, msgs: list[tuple[str, Any]]) -> None:
        """`send` for a burst of (dst, message) of one group: encoded here, one event-loop wake-up for all.

        A task thread sends several messages per drain (entries to every follower,
        apply offsets, acks), and so do other groups' threads meanwhile; each
        ``call_soon_threadsafe`` costs a self-pipe write and a loop iteration, so
        only the first message of a burst schedules one. None at all when nothing
        waits for the loop and a destination's link is idle: its messages are written
        from here (:meth:`_PeerLink.write_direct`). The hand-off's order holds: a
        direct write happens only while nothing is in the hand-off, and the loop
        gives what it takes from the hand-off to the links under the same lock.
        """
        once: dict[int, bytes] = {}  # a message sent to several peers (the same entries) is encoded once
        encoded = []
        for dst, m in msgs:
            raw = once.get(id(m))  # (every m is alive in msgs meanwhile, so ids are not reused)
            if raw is None:
                raw = once[id(m)] = to_proto(module, group, m).SerializeToString()
            encoded.append((dst, raw))
        with self.lock:
            if not self._outbox and not self.closed:
                encoded = self._write_direct(encoded)
                if not encoded:
                    return
            room = MAX_HANDOFF_MESSAGES - len(self._outbox)
            if len(encoded) > room:
                self._drop(len(encoded) - max(room, 0))
                encoded = encoded[:max(room, 0)]
            self._outbox.extend(encoded)
            if self._wake_scheduled:
                return
            self._wake_scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: the node is stopping
            pass

    def _write_direct(self, encoded: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        """(holding the lock, nothing in the hand-off) Write each destination's messages on its idle link;
        returns those left for the event loop (a busy, broken or TLS link, or one not yet opened)."""
        by_dst: dict[str, list[bytes]] = {}
        for dst, m in encoded:
            by_dst.setdefault(dst, []).append(m)
        left: list[tuple[str, bytes]] = []
        for dst, msgs in by_dst.items():
            link = self.links.get(dst)
            if link is None or not link.write_direct(msgs):
                left += [(dst, m) for m in msgs]
        return left

    def _drop(self, n: int) -> None:
        """(holding the hand-off lock) `n` messages did not fit the hand-off."""
        before, self.dropped = self.dropped, self.dropped + n
        if before // 1000 != self.dropped // 1000 or before == 0:
            log.warning("node %s: the event loop is behind and the replication hand-off is full; dropped %d "
                        "message(s) so far (they will be resent)", self.node_id, self.dropped)

    def _drain(self) -> None:
        with self.lock:  # (held while the links take them: a task thread's direct write cannot overtake them)
            items = self._outbox
            self._outbox = []
            self._wake_scheduled = False
            if self.closed:
                return
            by_dst: dict[str, list[bytes]] = {}  # (each peer's messages in the order they were sent)
            for dst, m in items:
                by_dst.setdefault(dst, []).append(m)
            for dst, msgs in by_dst.items():
                link = self.links.get(dst)
                if link is None:
                    link = self.links[dst] = _PeerLink(self, dst)
                link.offer_many(msgs)

    async def close(self) -> None:
        self.closed = True
        for link in self.links.values():
            link.task.cancel()
        for link in self.links.values():
            try:
                await link.task
            except (asyncio.CancelledError, Exception):
                pass
        self.links.clear()
