"""A leader reads a range once for every follower sent it in a drain, and the transport encodes it once."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conductor.worker.log_frames import ReplicateReads
from conductor.worker.transport import PeerTransport
from replog.log import Log
from replog.messages import SendEntries


def test_followers_sent_the_same_range_share_one_read_until_the_drain_hands_it_over(tmp_path: Path) -> None:
    with Log.open(tmp_path) as log:
        for payload in (b"a" * 100, b"b" * 100, b"c" * 100):
            log.append(1, 1, [payload])  # a frame each
        reads = ReplicateReads()
        to_n2 = reads.messages(log, "n1", SendEntries("n2", 1, 0, 3, -1))
        to_n3 = reads.messages(log, "n1", SendEntries("n3", 1, 0, 3, -1))
        assert to_n3 is to_n2 and to_n2[0].frames and to_n2[0].start == 0
        other = reads.messages(log, "n1", SendEntries("n3", 1, 1, 3, -1))  # another range: read for itself
        assert other[0].start == 1 and other is not to_n2
        out = [("n2", to_n2[0]), ("n3", to_n3[0])]
        assert reads.handed(out) is out
        again = reads.messages(log, "n1", SendEntries("n2", 1, 1, 3, -1))
        assert again is not other and again == other  # a new drain reads again (same bytes)

        loop = asyncio.new_event_loop()  # never run: the hand-off keeps what it was given
        try:
            t = PeerTransport("n1", loop, lambda _dst: None, lambda _dst: None)
            t.send_many("M", 0, out)
            (d2, raw2), (d3, raw3) = t._outbox
            assert (d2, d3) == ("n2", "n3") and raw2 is raw3  # one encoding for both followers
        finally:
            loop.close()
