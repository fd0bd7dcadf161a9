"""The queue of local hops one input causes is bounded by MAX_LOCAL_STEPS.

Every queued local hop costs a step when it runs, so a unit queueing more than
MAX_LOCAL_STEPS would fail at the step guard anyway; it fails at the send past
the bound instead, before the queue grows further, and the whole input fails
(not the one hop that sent), as the step guard has it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path as FsPath

import msgpack
import pytest

from pstate import Map, TaskGroupStore
from topology import Module, hash_by, stream, task_for_key
from topology.dataflow.entries import build_client_append
from topology.errors import HopFailed
from topology.stream import StreamRunner

TASKS, GROUPS = 4, 2
HERE = next(f"k{i}" for i in range(1000) if task_for_key(f"k{i}", TASKS) == 0)
SIBLING = next(f"k{i}" for i in range(1000) if task_for_key(f"k{i}", TASKS) == 2)  # same group, another task


def add(old: int | None, n: int) -> int:
    return (old or 0) + n


class Burst(Module):
    def define(self, m):
        events = m.depot("*events", hash_by(lambda e: e["user"]))
        m.pstate("$$n", Map(str, int))

        @m.stream(events)
        def on_event(ctx, e):
            if e["op"] == "burst":
                ctx.send(burst, HERE, e["n"])
            else:
                ctx.update("$$n", HERE, add, 1)

        @m.handler
        def burst(ctx, key, n):  # one handler queueing n local hops at once
            for _ in range(n):
                ctx.send(count, SIBLING)

        @m.handler
        def count(ctx, key):
            ctx.update("$$n", key, add, 1)


@pytest.fixture
def store(tmp_path: FsPath) -> Iterator[TaskGroupStore]:
    md = Burst.build()
    s = TaskGroupStore(tmp_path / "s", {n: d.schema for n, d in md.pstates.items()}, md.depot_names())
    yield s
    s.close()


def _append(store: TaskGroupStore, runner: StreamRunner, event: dict[str, object]) -> None:
    b, _firsts, _acks = build_client_append(store, runner, [("*events", 0, [msgpack.packb({"user": "u", **event})])])
    store.apply(store.applied_offset + 1, b.encode())


def test_a_burst_within_the_bound_runs_and_one_past_it_fails_the_whole_input(store: TaskGroupStore,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "MAX_LOCAL_STEPS", 50)
    runner = StreamRunner(Burst.build(), TASKS, GROUPS, 0)
    longest = 0
    hop_to = stream.StreamContext._hop_to

    def watching(ctx: stream.StreamContext, *args: object) -> None:
        nonlocal longest
        try:
            hop_to(ctx, *args)  # type: ignore[arg-type]
        finally:
            longest = max(longest, len(ctx._unit.local))

    monkeypatch.setattr(stream.StreamContext, "_hop_to", watching)
    _append(store, runner, {"op": "burst", "n": 48})  # 1 + 48 local steps: within the bound
    assert store.select_one("$$n", SIBLING) == 48
    with pytest.raises(HopFailed, match="more than 50 local hops") as e:
        _append(store, runner, {"op": "burst", "n": 10_000})
    assert e.value.hop == "burst"
    assert longest <= 50  # the queue never held more than the bound
    assert store.select_one("$$n", SIBLING) == 48  # nothing of the failed input was kept
    _append(store, runner, {"op": "plain"})  # the next input runs as ever
    assert store.select_one("$$n", HERE) == 1
