"""The replication transport's queues are bounded: when full they drop the newest message and count it.

The replication state machines and the dataflow tolerate lost messages (the
leader resends after its request timeout, a destination pulls again), so
dropping is the stated behaviour: the hand-off from the task threads to the
event loop holds at most MAX_HANDOFF_MESSAGES, a peer's queue MAX_QUEUED_MESSAGES.
An idle link skips its queue (one frame written at once); a busy one keeps it.
"""

from __future__ import annotations

import asyncio

import pytest

from conductor.wire import millrace_pb2 as pb
from conductor.wire.peer_framing import LENGTH
from conductor.worker import transport
from conductor.worker.transport import PeerTransport, _PeerLink
from replog.messages import FarHorizonOffer, RawReplicate


def test_the_hand_off_from_task_threads_drops_the_newest_when_the_loop_is_behind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "MAX_HANDOFF_MESSAGES", 10)
    loop = asyncio.new_event_loop()  # never run: the event loop is stalled
    try:
        t = PeerTransport("n1", loop, lambda _dst: None, lambda _dst: None)
        msg = FarHorizonOffer("n1", 1)
        t.send_many("M", 0, [("n2", msg)] * 7)
        t.send_many("M", 0, [("n2", msg)] * 7)
        t.send("n2", "M", 0, msg)
        assert len(t._outbox) == 10 and t.dropped == 5
    finally:
        loop.close()


def test_a_full_peer_queue_drops_the_newest_and_counts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "MAX_QUEUED_MESSAGES", 4)

    async def scenario() -> None:
        t = PeerTransport("n1", asyncio.get_running_loop(), lambda _dst: None, lambda _dst: None)
        t.closed = True  # the link's sender never starts: nothing leaves the queue
        link = _PeerLink(t, "n2")
        for i in range(10):
            link.offer(bytes([i]))
        assert link.queue.qsize() == 4 and link.dropped == 6
        assert [link.queue.get_nowait() for _ in range(4)] == [b"\x00", b"\x01", b"\x02", b"\x03"]  # the oldest kept
        await link.task

    asyncio.run(scenario())


def test_an_idle_link_writes_a_drains_messages_at_once_as_one_frame_and_a_busy_one_queues_them() -> None:
    async def scenario() -> None:
        server, frames, t, link = await _parked_link()
        try:
            a, b, c = (transport.to_proto("M", 0, FarHorizonOffer("n1", e)) for e in (2, 3, 4))
            link.offer_many([a.SerializeToString(), b.SerializeToString()])
            assert link.queue.empty()  # written at once, not queued for the sender
            assert list((await asyncio.wait_for(frames.get(), 5)).messages) == [a, b]
            link._parked = False  # (as while the sender writes or waits for the socket to drain)
            link.offer_many([c.SerializeToString()])
            assert link.queue.qsize() == 1  # the sender takes it, in order after what it holds
        finally:
            await t.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


def test_a_task_threads_messages_for_an_idle_link_are_written_from_the_thread_and_a_partial_write_ends_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    real_write = os.write
    halves: list[int] = []

    async def scenario() -> None:
        server, frames, t, link = await _parked_link()
        try:
            a, b, c = (FarHorizonOffer("n1", e) for e in (2, 3, 4))
            await asyncio.to_thread(t.send_many, "M", 0, [("n2", a), ("n2", b)])  # (a task thread's drain)
            assert not t._outbox and not t._wake_scheduled  # written by the thread: no hand-off, no wake-up
            got = (await asyncio.wait_for(frames.get(), 5)).messages
            assert [m.far_horizon.epoch for m in got] == [2, 3]

            def half(fd: int, data: bytes) -> int:  # a socket buffer with room for half a frame
                if fd == link._fd:
                    halves.append(len(data))
                    return real_write(fd, data[:len(data) // 2])
                return real_write(fd, data)
            monkeypatch.setattr(os, "write", half)
            t.send_many("M", 0, [("n2", c)])  # (the same call as a thread's, with the loop held meanwhile)
            monkeypatch.setattr(os, "write", real_write)
            assert halves and link._tail is not None  # the loop is asked to write the rest
            with t.lock:
                assert not link.write_direct([b"x"])  # nothing more from threads until the rest is written
            t.send("n2", "M", 0, FarHorizonOffer("n1", 5))  # through the loop: after the rest
            assert t._outbox
            got = (await asyncio.wait_for(frames.get(), 5)).messages
            assert [m.far_horizon.epoch for m in got] == [4]
            got = (await asyncio.wait_for(frames.get(), 5)).messages
            assert [m.far_horizon.epoch for m in got] == [5] and link._tail is None
        finally:
            await t.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


async def _parked_link() -> tuple[asyncio.Server, asyncio.Queue[pb.PeerFrame], PeerTransport, _PeerLink]:
    """A transport from n1 with its link to a peer ("n2") open and parked; the frames the peer reads."""
    frames: asyncio.Queue[pb.PeerFrame] = asyncio.Queue()

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (n,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
                frames.put_nowait(pb.PeerFrame.FromString(await reader.readexactly(n)))
        except asyncio.IncompleteReadError:
            return
        finally:  # (from Python 3.12 the server's wait_closed waits for every connection it accepted)
            writer.close()

    server = await asyncio.start_server(peer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    t = PeerTransport("n1", asyncio.get_running_loop(), lambda _dst: f"127.0.0.1:{port}", lambda _dst: None)
    t.send("n2", "M", 0, FarHorizonOffer("n1", 1))  # opens the link; its sender sends this one
    assert len((await asyncio.wait_for(frames.get(), 5)).messages) == 1
    link = t.links["n2"]
    for _ in range(100):  # the sender parks on its empty queue
        if link._parked:
            break
        await asyncio.sleep(0.01)
    assert link._parked
    return server, frames, t, link


@pytest.mark.parametrize("frames,apply_offset", [(b"entries" * 1000, 7), (b"", -1), (b"", 0)])
def test_a_replicate_is_encoded_as_the_message_it_was_and_comes_back_the_same(frames: bytes, apply_offset: int) -> None:
    """(to_proto sets the frames on the message's own sub-message rather than merging one built apart, which
    copied them twice more; the bytes on the wire are the same, and a heartbeat is still a replicate)"""
    msg = RawReplicate("n1", 3, 11 if frames else 0, frames, apply_offset)
    raw = transport.to_proto("M", 2, msg).SerializeToString()
    assert raw == pb.PeerMessage(module="M", group=2, replicate=pb.ReplicateMsg(
        epoch=3, start=msg.start, frames=frames, apply_offset=apply_offset)).SerializeToString()
    assert transport.from_proto("n1", "n2", pb.PeerMessage.FromString(raw)) == msg
