"""The client's retry budget (`_Retry`): what is retried, how long it waits, when it gives up."""

from __future__ import annotations

import time
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest

from conductor.client.cluster import _Retry
from conductor.wire.errors import Unavailable
from replog.errors import NotLeader, StalledGroup


def client(timeout_s: float = 30.0, cached: str | None = "10.0.0.1:1") -> Any:
    """The attributes of a Cluster that `_Retry` reads."""
    looked_up: list[bool] = []

    def leader_address(module: str, group: int, refresh: bool) -> str:
        looked_up.append(refresh)
        return "10.0.0.2:2"

    return SimpleNamespace(timeout_s=timeout_s, _generation=defaultdict(int, {("M", 1): 7}),
                           _cached_address=lambda module, group: cached, _leader_address=leader_address,
                           looked_up=looked_up)


def test_moved_or_unreachable_leaders_are_retried_with_doubling_backoff_and_a_fresh_lookup() -> None:
    c = client()
    r = _Retry(c, "M", 1)
    assert r.leader() == (7, "10.0.0.1:1")  # cached: no ZooKeeper read
    assert c.looked_up == []
    delays = [r.backoff(NotLeader("M/1", None, None) if i % 2 else Unavailable("UNAVAILABLE", "down"))
              for i in range(8)]
    assert delays == [0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5, 0.5]
    assert r.leader() == (7, "10.0.0.2:2")  # after a failure the cache is not trusted
    assert c.looked_up == [True]


def test_other_errors_and_an_exhausted_deadline_are_raised() -> None:
    r = _Retry(client(), "M", 1)
    stalled = StalledGroup("M/1", ["n1"], 2)
    with pytest.raises(StalledGroup):
        r.backoff(stalled)
    with pytest.raises(ValueError):
        r.backoff(ValueError("bad input"))
    late = _Retry(client(timeout_s=0.01), "M", 1)
    time.sleep(0.02)
    assert late.remaining() == 0.1  # a last call still gets a usable timeout
    with pytest.raises(NotLeader):
        late.backoff(NotLeader("M/1", None, None))
