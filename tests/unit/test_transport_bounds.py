"""The replication transport's queues are bounded: when full they drop the newest message and count it.

The replication state machines and the dataflow tolerate lost messages (the
leader resends after its request timeout, a destination pulls again), so
dropping is the stated behaviour: the hand-off from the task threads to the
event loop holds at most MAX_HANDOFF_MESSAGES, a peer's queue MAX_QUEUED_MESSAGES.
"""

from __future__ import annotations

import asyncio

import pytest

from conductor.worker import transport
from conductor.worker.transport import PeerTransport, _PeerLink
from replog.messages import FarHorizonOffer


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
