"""The one retry policy (`Retry`) and the one leader router (`LeaderRouter`): what is retried, how long it
waits, when it gives up, and when a leader is looked up again."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from conductor.client.retry import Retry
from conductor.client.router import LeaderRouter
from conductor.metastore import GroupState, ModuleSpec
from conductor.wire.errors import MillraceError, Unavailable
from replog.errors import NotLeader, StalledGroup

SPEC = ModuleSpec("M", "examples.clicks:Clicks", tasks=2, threads=2, workers=2, replication_factor=2)


def metastore(leaders: dict[int, str | None]) -> Any:
    """The three reads a router makes, counted (a unit test needs no ZooKeeper for a cache)."""
    reads: list[str] = []

    def list_groups(module: str) -> dict[int, tuple[GroupState, int]]:
        reads.append("groups")
        return {g: (GroupState(leader, 3, ("n1", "n2", "n9"), (), 5), 5) for g, leader in leaders.items()}

    def get_node(node_id: str) -> Any:
        reads.append(f"node {node_id}")
        return SimpleNamespace(address=f"10.0.0.{node_id[1:]}:1") if node_id != "n9" else None

    def with_groups(module: str, _hint: int | None) -> tuple[Any, dict[int, GroupState]]:
        return SPEC, {g: st for g, (st, _v) in list_groups(module).items()}

    return SimpleNamespace(modules=SimpleNamespace(get=lambda m: (SPEC, 0), get_with_groups=with_groups),
                           groups=SimpleNamespace(all=list_groups), nodes=SimpleNamespace(get=get_node), reads=reads)


def test_moved_or_unreachable_leaders_are_retried_with_doubling_backoff() -> None:
    r = Retry(30.0, "M/1")
    assert not r.refresh
    delays = [r.backoff(NotLeader("M/1", None, None) if i % 2 else Unavailable("UNAVAILABLE", "down"))
              for i in range(8)]
    assert delays == [0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5, 0.5]
    assert r.refresh  # after a failure the cached leader is not trusted


def test_a_move_the_watch_already_reported_is_followed_at_once_without_a_lookup() -> None:
    r = Retry(30.0, "M/1")
    assert r.backoff(NotLeader("M/1", "n2", 4), moved=True) == 0.0
    assert not r.refresh  # the watch's state is in the cache: no ZooKeeper read
    assert r.backoff(NotLeader("M/1", None, 4)) == 0.02  # the new leader not ready yet: the usual backoff,
    assert r.refresh  # and a lookup
    assert r.backoff(NotLeader("M/1", "n3", 5), moved=True) == 0.0
    assert r.backoff(Unavailable("UNAVAILABLE", "down")) == 0.04  # the budget was not spent by the moves
    with pytest.raises(StalledGroup):  # only what is worth another try
        r.backoff(StalledGroup("M/1", ["n1"], 2), moved=True)


def test_other_errors_and_an_exhausted_deadline_are_raised() -> None:
    r = Retry(30.0, "M/1")
    stalled = StalledGroup("M/1", ["n1"], 2)
    with pytest.raises(StalledGroup):
        r.backoff(stalled)
    with pytest.raises(ValueError):
        r.backoff(ValueError("bad input"))
    late = Retry(0.01, "M/1")
    time.sleep(0.02)
    assert late.remaining() == 0.1  # a last call still gets a usable timeout
    with pytest.raises(NotLeader):
        late.backoff(NotLeader("M/1", None, None))


class _Status(grpc.RpcError):  # type: ignore[misc]
    """A finished call's status, as the client reads it."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[()]:
        return ()


def test_a_call_the_client_lost_to_a_reset_connection_is_retried_and_a_nodes_internal_error_is_not() -> None:
    """gRPC's asyncio layer reports a write on a connection reset by a dying node as INTERNAL with its own text."""
    r = Retry(30.0, "M/1")
    assert r.backoff(_Status(grpc.StatusCode.INTERNAL, "Internal error from Core")) == 0.02
    with pytest.raises(MillraceError, match="INTERNAL: disk on fire"):
        r.backoff(_Status(grpc.StatusCode.INTERNAL, "disk on fire"))


def test_router_caches_until_refresh_and_follows_observed_states() -> None:
    ms = metastore({0: "n1", 1: "n2"})
    router = LeaderRouter(ms)
    assert router.cached_address("M", 0) is None  # nothing read yet, and a cache lookup never reads
    assert router.leader("M", 0) == ("10.0.0.1:1", 3)
    assert router.leader("M", 0) == ("10.0.0.1:1", 3)
    assert ms.reads == ["groups", "node n1"]
    assert router.cached_address("M", 0) == "10.0.0.1:1"
    assert router.leader("M", 1, refresh=True) == ("10.0.0.2:1", 3)
    assert ms.reads == ["groups", "node n1", "groups", "node n2"]
    moved = GroupState("n2", 4, ("n1", "n2", "n9"), (), 6)
    assert router.observe("M", 0, moved).leader == "n1"  # type: ignore[union-attr]
    assert router.cached_address("M", 0) == "10.0.0.2:1"  # a watch moved it: no ZooKeeper read
    assert len(ms.reads) == 4


def test_router_reads_a_leaderless_group_again_before_giving_up() -> None:
    ms = metastore({0: None})
    router = LeaderRouter(ms)
    with pytest.raises(Unavailable, match="has no leader"):
        router.leader("M", 0)
    assert ms.reads == ["groups", "groups"]
    ms_gone = metastore({0: "n9"})
    with pytest.raises(Unavailable, match="not registered"):
        LeaderRouter(ms_gone).leader("M", 0)
