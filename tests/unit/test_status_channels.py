"""conductor.status.Channels: one gRPC channel per worker address for every call of a poll, closed together."""

from __future__ import annotations

import threading

import grpc
import pytest

from conductor.status import Channels, query_group_status


def test_one_channel_per_address_shared_by_threads_and_closed_together() -> None:
    with Channels() as channels:
        got: list[grpc.Channel] = []
        threads = [threading.Thread(target=lambda: got.append(channels.get("127.0.0.1:1"))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({id(c) for c in got}) == 1
        other = channels.get("127.0.0.1:2")
        assert other is not got[0]
    with pytest.raises(ValueError):  # closed with the pool
        other.unary_unary("/x")(b"", timeout=1)


def test_an_unreachable_worker_is_reported_not_raised_and_the_channel_stays_usable() -> None:
    with Channels() as channels:
        for _ in range(2):  # a poll asks again on the same channel
            r = query_group_status("127.0.0.1:1", "M", 0, timeout_s=0.5, channels=channels)
            assert r["reachable"] is False and ("UNAVAILABLE" in r["error"] or "DEADLINE" in r["error"]), r
