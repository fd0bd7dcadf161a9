"""The stream runtime on one task group: hops, travelling functions, units that fail whole, the module API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path as FsPath
from typing import Any

import msgpack
import pytest

from pstate import Map, P, Set, TaskGroupStore
from topology import Module, ModuleDefinitionError, hash_by, random, task_for_key
from topology import envelope as env
from topology.dataflow.entries import build_client_append
from topology.errors import ForeignRead, HopFailed, TopologyError
from topology.module import DEAD_LETTERS
from topology.stream import MAX_LOCAL_STEPS, StreamRunner

TASKS, GROUPS = 8, 2


def add(old: int | None, n: int) -> int:
    return (old or 0) + n


def is_big(n: int) -> bool:
    return n > 10


def key_on(task: int, prefix: str = "k") -> str:
    """A key owned by `task` (of TASKS tasks; group task % GROUPS)."""
    return next(f"{prefix}{i}" for i in range(1000) if task_for_key(f"{prefix}{i}", TASKS) == task)


# records are appended to task 0 (group 0): HERE is on their task, SIBLING on another task of their group
HERE, SIBLING, THERE = key_on(0), key_on(2), key_on(1)


class Hops(Module):
    def define(self, m):
        events = m.depot("*events", hash_by(lambda e: e["user"]))
        m.depot("*audit", hash_by(lambda a: a["id"]))
        m.pstate("$$n", Map(str, int))
        m.pstate("$$tags", Map(str, Set(str)))
        m.pstate("$$log", Map(str, str))

        @m.stream(events)
        def on_event(ctx, e):
            op = e["op"]
            if op == "update":
                ctx.update("$$n", e["key"], add, e.get("by", 1))
            elif op == "lambda":
                ctx.update("$$n", e["key"], lambda n: 1)
            elif op == "send":
                ctx.send(tag, e["key"], e["tag"], "first")
                ctx.send("tag", e["key"], e["tag"], "second")  # by name works too
            elif op == "transform":
                ctx.transform("$$tags", e["key"], P.add(e["tag"]))
            elif op == "set":
                ctx.set("$$log", e["key"], e["tag"])
            elif op == "remove":
                ctx.remove("$$log", e["key"])
            elif op == "append":
                ctx.depot_append("*audit", {"id": e["key"]})
            elif op == "read":
                return ctx.select_one("$$n", e["key"])
            elif op == "fail_after_write":
                ctx.update("$$n", HERE, add, 100)
                ctx.send(tag, e["key"], "x", "first")
                raise RuntimeError("boom")
            elif op == "loop":
                ctx.send(loop, HERE)
            elif op == "bad_value":
                ctx.send(tag, e["key"], object(), "first")
            return e.get("ack")

        @m.handler
        def tag(ctx, key, t, when):
            # handlers run after the function that sent them, in send order, and see earlier writes
            before = ctx.select("$$tags", key, P.all())
            ctx.transform("$$tags", key, P.add(f"{when}:{t}:{len(before)}"))

        @m.handler
        def loop(ctx, key):
            ctx.send(loop, key)


@pytest.fixture
def store(tmp_path: FsPath) -> Iterator[TaskGroupStore]:
    md = Hops.build()
    s = TaskGroupStore(tmp_path / "s", {n: d.schema for n, d in md.pstates.items()}, md.depot_names())
    yield s
    s.close()


@pytest.fixture
def runner() -> StreamRunner:
    return StreamRunner(Hops.build(), TASKS, GROUPS, 0)


def run(store: TaskGroupStore, runner: StreamRunner, *events: dict[str, Any]) -> tuple[Any, dict[str, list[Any]]]:
    """Append events (all to partition 0, which group 0 owns) in one entry; apply it."""
    records = [msgpack.packb({"user": "u", **e}) for e in events]
    b, _firsts, acks = build_client_append(store, runner, [("*events", 0, records)])
    store.apply(store.applied_offset + 1, b.encode())
    return b, acks


def sent(store: TaskGroupStore, dst: int) -> list[list[Any]]:
    from pstate import outbox

    msgs = []
    for _seq, raw in outbox.iter_envelopes(store.applied_reader(), dst, 0):
        parents, messages = env.decode_envelope(raw)
        assert parents == [env.ROOT, 0]
        msgs += messages
    return msgs


def test_writes_to_local_keys_apply_here_and_foreign_ones_become_messages(store: TaskGroupStore,
                                                                        runner: StreamRunner) -> None:
    _b, acks = run(store, runner, {"op": "update", "key": HERE, "by": 5, "ack": "a"},
                   {"op": "update", "key": THERE, "by": 7, "ack": "b"},
                   {"op": "set", "key": THERE, "tag": "v"}, {"op": "remove", "key": THERE},
                   {"op": "transform", "key": THERE, "tag": ("t", 1)})
    assert acks == {"on_event": ["a", "b", None, None, None]}
    assert store.select_one("$$n", HERE) == 5
    assert store.select_one("$$n", THERE) is None
    task = task_for_key(THERE, TASKS)
    msgs = sent(store, 1)
    assert msgs[:3] == [[env.UPDATE, task, THERE, ["$$n", "tests.unit.test_stream_runtime:add", [7]]],
                        [env.SET, task, THERE, ["$$log", "v"]],
                        [env.TRANSFORM, task, THERE, ["$$log", [[[0, THERE, None]], 2, None]]]]
    assert msgs[3][0] == env.TRANSFORM and env.decode_transform(msgs[3][3][1]).arg == (["t", 1],)  # add()'s tuple kept
    assert sent(store, 0) == []  # nothing hopped to ourselves


def test_messages_run_where_they_land_and_update_functions_resolve_by_name(tmp_path: FsPath) -> None:
    md = Hops.build()
    stores = [TaskGroupStore(tmp_path / str(g), {n: d.schema for n, d in md.pstates.items()}, md.depot_names())
              for g in range(GROUPS)]
    try:
        r0, r1 = (StreamRunner(md, TASKS, GROUPS, g) for g in range(GROUPS))
        run(stores[0], r0, {"op": "update", "key": THERE, "by": 7}, {"op": "transform", "key": THERE, "tag": "x"},
            {"op": "send", "key": THERE, "tag": "y"}, {"op": "set", "key": THERE, "tag": "v"})
        b = stores[1].changes()
        for m in sent(stores[0], 1):
            assert r1.run_message(b, m) == {}
        stores[1].apply(0, b.encode())
        assert stores[1].select_one("$$n", THERE) == 7
        assert stores[1].select_one("$$tags", THERE) == {"x", "first:y:1", "second:y:2"}
        assert stores[1].select_one("$$log", THERE) == "v"
        with pytest.raises(HopFailed, match="belongs to group 1"):
            r0.run_message(stores[0].changes(), [env.SET, task_for_key(THERE, TASKS), THERE, ["$$log", "v"]])
    finally:
        for s in stores:
            s.close()


def test_local_hops_run_after_the_sender_in_order_in_the_same_entry(store: TaskGroupStore,
                                                                   runner: StreamRunner) -> None:
    run(store, runner, {"op": "transform", "key": HERE, "tag": "pre"}, {"op": "send", "key": HERE, "tag": "z"})
    assert store.select_one("$$tags", HERE) == {"pre", "first:z:1", "second:z:2"}
    assert sent(store, 1) == []


def test_functions_must_travel_by_name_wherever_the_key_lives(store: TaskGroupStore, runner: StreamRunner) -> None:
    for key in (HERE, THERE):
        with pytest.raises(TopologyError, match=r"not a module-level function.*define it with `def`"):
            run(store, runner, {"op": "lambda", "key": key})
    from topology.stream import StreamContext, _Unit

    b = store.changes()
    ctx = StreamContext(runner, b, _Unit(), "t", 0)
    with pytest.raises(TopologyError, match=r"^topology t: ctx.transform\('\$\$n', ...\): <lambda> .* not a module-level"):
        ctx.transform("$$n", HERE, P.filter(lambda n: n > 1).update(is_big))
    assert len(b) == 0


def test_a_failing_unit_keeps_nothing_and_says_which_hop_failed(store: TaskGroupStore, runner: StreamRunner) -> None:
    with pytest.raises(HopFailed, match="RuntimeError: boom") as e:
        run(store, runner, {"op": "update", "key": HERE, "by": 1}, {"op": "fail_after_write", "key": THERE})
    assert e.value.hop == "on_event" and e.value.task == 0
    b = store.changes()
    ok = runner.run_record(b, "*events", 0, {"op": "update", "key": HERE, "by": 1})
    assert ok == {}
    with pytest.raises(HopFailed):
        runner.run_record(b, "*events", 0, {"op": "fail_after_write", "key": THERE})
    assert runner.run_record(b, "*events", 0, {"op": "update", "key": THERE, "by": 2})
    store.apply(0, b.encode())
    assert store.select_one("$$n", HERE) == 1  # the failed unit's +100 is gone, its neighbours stayed


def test_a_send_loop_is_stopped_and_a_value_that_cannot_travel_fails_at_the_call(store: TaskGroupStore,
                                                                                 runner: StreamRunner) -> None:
    with pytest.raises(HopFailed, match=f"more than {MAX_LOCAL_STEPS:,} local hops") as e:
        run(store, runner, {"op": "loop"})
    assert e.value.hop == "loop"
    with pytest.raises(HopFailed, match="cannot be sent"):
        run(store, runner, {"op": "bad_value", "key": THERE})


def test_reads_of_foreign_keys_say_how_to_hop(store: TaskGroupStore, runner: StreamRunner) -> None:
    _b, acks = run(store, runner, {"op": "update", "key": HERE, "by": 3})
    _b, acks = run(store, runner, {"op": "read", "key": HERE})
    assert acks == {"on_event": [3]}
    for other in (SIBLING, THERE):  # another task, in this group or not: the same answer
        with pytest.raises(HopFailed, match=r"from task 0; hop to the key's task with ctx.send") as e:
            run(store, runner, {"op": "read", "key": other})
        assert isinstance(e.value.__cause__, ForeignRead)


def test_depot_append_always_hops_to_the_owning_group_which_runs_its_topologies(store: TaskGroupStore,
                                                                              runner: StreamRunner) -> None:
    run(store, runner, {"op": "append", "key": HERE}, {"op": "append", "key": THERE})
    mine, theirs = sent(store, 0), sent(store, 1)
    assert [m[0] for m in mine + theirs] == [env.APPEND, env.APPEND]
    assert store.depot("*audit").partition_info(mine[0][1]).end == 0  # not yet: in the entry that consumes it
    b = store.changes()
    runner.run_message(b, mine[0])
    store.apply(store.applied_offset + 1, b.encode())
    assert store.depot("*audit").read(mine[0][1], 0) == [(0, {"id": HERE})]


def test_module_api_handlers_and_the_dead_letter_depot() -> None:
    md = Hops.build()
    assert list(md.handlers) == ["tag", "loop"]
    assert md.depot_names()[-1] == DEAD_LETTERS

    class Twice(Module):
        def define(self, m):
            m.depot("*a")

            @m.handler
            def a(ctx, key):
                return None

            @m.stream("*a")
            def a(ctx, r):  # noqa: F811 - the point of the test
                return None

    with pytest.raises(ModuleDefinitionError, match="declared twice"):
        Twice.build()

    class Reserved(Module):
        def define(self, m):
            m.depot(DEAD_LETTERS, random)

    with pytest.raises(ModuleDefinitionError, match="dead-letter depot"):
        Reserved.build()

    class Subscribes(Module):
        def define(self, m):
            m.depot("*a")

            @m.stream(DEAD_LETTERS)
            def t(ctx, r):
                return None

    with pytest.raises(ModuleDefinitionError, match="cannot subscribe"):
        Subscribes.build()


def test_send_needs_a_handler_of_the_module(store: TaskGroupStore, runner: StreamRunner) -> None:
    from topology.stream import StreamContext, _Unit

    ctx = StreamContext(runner, store.changes(), _Unit(), "t", 0)
    with pytest.raises(TopologyError, match=r"@m.handler function of this module.*\['loop', 'tag'\]"):
        ctx.send(add, HERE)
    with pytest.raises(TopologyError, match=r"@m\.handler"):
        ctx.send("nope", HERE)


def test_envelopes_round_trip_values_and_split_by_size() -> None:
    msgs = [env.pack_message(["h", 1, ("a", 2), [{"s": {1, 2}}, b"x" * 400, 2**70, None]]) for _ in range(10)]
    pieces = env.encode_envelopes([3, 9, env.ROOT, 0], msgs, max_bytes=1000)
    assert len(pieces) == 5
    out = []
    for p in pieces:
        parents, ms = env.decode_envelope(p)
        assert parents == [3, 9, env.ROOT, 0] == env.envelope_parents(p)
        out += ms
    assert out == [["h", 1, ("a", 2), [{"s": {1, 2}}, b"x" * 400, 2**70, None]]] * 10
    with pytest.raises(ValueError, match="not a dataflow envelope"):
        env.decode_envelope(b"\x01")


class Flaky(Module):
    def define(self, m):
        m.depot("*events", hash_by(lambda e: e["user"]))
        m.pstate("$$n", Map(str, int))

        @m.stream("*events")
        def on_event(ctx, e):
            ctx.send(boom, e["key"])
            ctx.update("$$n", e["key"], explode)
            ctx.update("$$n", e["key"], add, 1)
            return "ok"

        @m.handler
        def boom(ctx, key):
            ctx.update("$$n", key, add, 100)
            ctx.send(boom2, key)
            raise RuntimeError("handler failed")

        @m.handler
        def boom2(ctx, key):
            ctx.update("$$n", key, add, 1000)


def explode(old: int | None) -> int:
    raise KeyError("update failed")


def test_a_failing_hop_fails_alone_and_locally_becomes_a_message_to_retry(store: TaskGroupStore) -> None:
    """Whether a hop fails in this group or another, the record is accepted and the hop retried on its own."""
    runner = StreamRunner(Flaky.build(), TASKS, GROUPS, 0)
    for key, group in ((SIBLING, 0), (THERE, 1)):
        b = store.changes()
        acks: dict[str, list[Any]] = {}
        out = runner.run_record(b, "*events", 0, {"user": "u", "key": key}, acks)
        assert acks == {"on_event": ["ok"]}
        assert sorted(out) == [group]
        msgs = [env.decode_envelope(raw)[1][0] for raw in env.encode_envelopes([], out[group], max_bytes=1)]
        if group == 1:  # sent in call order
            assert [m[0] for m in msgs] == ["boom", env.UPDATE, env.UPDATE]
            continue
        # here: the failed update is sent at once, the failed handler when it has run (after on_event)
        assert [m[0] for m in msgs] == [env.UPDATE, "boom"]
        store.apply(store.applied_offset + 1, b.encode())
        assert store.select_one("$$n", key) == 1  # the good update stayed; boom's +100 and boom2 are gone
        with pytest.raises(HopFailed, match="RuntimeError: handler failed") as e:
            runner.run_message(store.changes(), msgs[1])  # the retry fails as the hop itself
        assert e.value.hop == "boom"
        with pytest.raises(HopFailed, match="KeyError"):
            runner.run_message(store.changes(), msgs[0])
    # a write to the record's own task is part of the record: failing, it refuses the append
    with pytest.raises(HopFailed, match="KeyError: 'update failed'"):
        runner.run_record(store.changes(), "*events", 0, {"user": "u", "key": HERE})
