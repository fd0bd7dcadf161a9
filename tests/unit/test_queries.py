"""Queries without a cluster: named server-side filters on the wire, paged scans, combiners, query topologies."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path as FsPath
from typing import Any

import msgpack
import pytest

from pstate import Map, P, TaskGroupStore
from pstate.errors import InvalidPath
from pstate.path import ALL, FILTER
from pstate.query import decode_query, encode_query
from pstate.scan import MAX_PAGE
from topology import Module
from topology.combiners import count, merge, sum_, top_n
from topology.errors import ForeignRead, QueryFailed, QueryTimeout
from topology.module import ModuleDefinitionError
from topology.partitioners import task_for_key
from topology.query import OverBudget, QueryContext, QueryRun, run_calls
from topology.refs import module_code_function, path_function_ref

TASKS, GROUPS = 4, 2


def is_long(pair: Any) -> bool:
    return len(pair[0]) > 3


def doubled(pair: Any) -> Any:
    return pair[1] * 2


def resolve_here(ref: str) -> Any:
    return module_code_function(ref, "tests")


def test_named_filter_and_view_travel_by_name_and_run_on_the_worker() -> None:
    raw = encode_query(P.all().filter(is_long).view(doubled), None, path_function_ref)
    assert b"tests.unit.test_queries:is_long" in raw
    path = decode_query(raw, resolve_here)
    assert [n[1] for n in path.navs[1:]] == [is_long, doubled]


def test_anonymous_functions_are_refused_with_how_to_name_them() -> None:
    with pytest.raises(InvalidPath, match="top level of the module's code"):
        encode_query(P.all().filter(lambda kv: True), None, path_function_ref)

    def nested(kv: Any) -> bool:
        return True

    with pytest.raises(InvalidPath, match="module-level name"):
        encode_query(P.all().view(nested), None, path_function_ref)
    with pytest.raises(InvalidPath, match="cannot be sent"):  # no way to name functions: refused as before
        encode_query(P.all().filter(is_long))


def test_the_worker_runs_only_functions_of_the_module_code() -> None:
    for ref in ("os:system", "builtins:eval", "tests.unit.test_queries:TASKS", "tests.unit.test_queries:Any"):
        with pytest.raises(InvalidPath):
            decode_query(_with_ref(ref), resolve_here)
    with pytest.raises(InvalidPath, match="takes a function name"):  # no resolver: refused
        decode_query(_with_ref("tests.unit.test_queries:is_long"))


def _with_ref(ref: str) -> bytes:
    raw: bytes = msgpack.packb([[ALL, None, None], [FILTER, ref, None]])
    return raw


@pytest.fixture
def store(tmp_path: FsPath) -> Iterator[TaskGroupStore]:
    s = TaskGroupStore(tmp_path / "state", {"$$counts": Map(str, int), "$$posts": Map(int, str)})
    b = s.changes()
    for i in range(2500):
        b.set("$$counts", f"w{i:05d}", i % 97)
    for i in range(50):
        b.set("$$posts", i, f"post {i}")
    s.apply(0, b.changeset())
    yield s
    s.close()


def test_paged_scan_returns_each_key_once_and_resumes(store: TaskGroupStore) -> None:
    view = store.pstate("$$counts")
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        page = view.scan_page(None, None, after, 300, 1 << 20)
        assert len(page.items) <= 300
        seen += [k for k, _ in page.items]
        pages += 1
        if page.after is None:
            break
        after = page.after
    assert seen == sorted(f"w{i:05d}" for i in range(2500)) and pages >= 9
    # one task's keys, filtered on the worker's side; a range; a named filter on each pair
    mine = view.scan_page(None, None, None, MAX_PAGE, 1 << 30, lambda k: task_for_key(k, TASKS) == 1).items
    assert {k for k, _ in mine} == {f"w{i:05d}" for i in range(2500) if task_for_key(f"w{i:05d}", TASKS) == 1}
    ranged = view.scan_page("w00010", "w00020", None, 100, 1 << 20, None, P.view(doubled).navs).items
    assert ranged == [(i % 97) * 2 for i in range(10, 20)]


def test_combiners() -> None:
    t = top_n(3, key=1)
    assert t.combine(t.lift([("a", 1), ("b", 5)]), t.lift([["c", 3], ("d", 5)])) == [("d", 5), ("b", 5), ("c", 3)]
    assert sum_.add(sum_.add(None, 2), 3) == 5 and count.add(count.add(None, [1, 2]), "x") == 3
    assert merge.combine({"a": 1}, {"b": 2}) == {"a": 1, "b": 2} and merge.add([1], None) == [1]


def second(pair: Any) -> Any:
    return pair[1]


class Queries(Module):
    def define(self, m):
        m.pstate("$$counts", Map(str, int))
        m.pstate("$$posts", Map(int, str))

        @m.query("top", every_task=True, combine=top_n(5, key=1))
        def top(q):
            return q.scan("$$counts")

        @m.query("bodies", combine=merge)
        def bodies(q, word, ids):
            for i in ids:
                q.send(body, i, word)

        @m.query("body", combine=merge)
        def body(q, post_id, word):
            return {post_id: [word, q.select_one("$$posts", post_id)]}

        @m.query("spin", combine=sum_)
        def spin(q, word):
            while True:
                q.select_one("$$counts", word)

        @m.query("foreign", combine=sum_)
        def foreign(q, word, other):
            return q.select_one("$$counts", other)


def _run(store: TaskGroupStore, root: str, calls: list[Any], timeout_s: float = 5.0) -> tuple[Any, list[Any]]:
    """``calls`` on one task group holding every task (the store)."""
    run = QueryRun(Queries.build(), store, TASKS, 1, 0, root, time.monotonic() + timeout_s, timeout_s)
    return run_calls(run, calls)


def test_every_task_top_n_equals_the_top_n_of_a_full_scan(store: TaskGroupStore) -> None:
    every = store.pstate("$$counts").scan_page(None, None, None, MAX_PAGE, 1 << 30).items
    result, hops = _run(store, "top", [(t, "top", []) for t in range(TASKS)])  # one pass for every task
    assert hops == [] and result == top_n(5, key=1).lift(every)
    some = [t for t in range(TASKS) if t != 2]  # one pass, keeping those tasks' keys
    result, hops = _run(store, "top", [(t, "top", []) for t in some])
    assert result == top_n(5, key=1).lift(kv for kv in every if task_for_key(kv[0], TASKS) in some)
    listed = Queries.build()
    assert len(list(_scan_of(store, listed, 3))) == sum(1 for kv in every if task_for_key(kv[0], TASKS) == 3)


def _scan_of(store: TaskGroupStore, definition: Any, task: int) -> Any:
    run = QueryRun(definition, store, TASKS, 1, 0, "top", time.monotonic() + 5, 5)
    return QueryContext(run, task, "top").scan("$$counts")


def test_hops_run_in_the_group_or_come_back_for_the_others(store: TaskGroupStore) -> None:
    ids = list(range(10))
    home = task_for_key("w00001", TASKS)
    run = QueryRun(Queries.build(), store, TASKS, GROUPS, home % GROUPS, "bodies", time.monotonic() + 5, 5)
    result, hops = run_calls(run, [(home, "bodies", ["w00001", ids])])
    local = {i for i in ids if task_for_key(i, TASKS) % GROUPS == home % GROUPS}
    assert set(result) == local and result[min(local)] == ["w00001", f"post {min(local)}"]
    assert sorted(h[2][0] for h in hops) == sorted(set(ids) - local)
    assert all(h[1] == "body" and h[0] == task_for_key(h[2][0], TASKS) for h in hops)


def test_a_query_past_its_deadline_stops_with_a_typed_error(store: TaskGroupStore) -> None:
    task = task_for_key("w00001", TASKS)
    errors: list[BaseException] = []

    def go() -> None:
        try:
            run = QueryRun(Queries.build(), store, TASKS, GROUPS, task % GROUPS, "spin", time.monotonic() + 0.3, 0.3)
            run_calls(run, [(task, "spin", ["w00001"])])
        except BaseException as e:
            errors.append(e)

    th = threading.Thread(target=go)
    began = time.monotonic()
    th.start()
    th.join(5)
    assert not th.is_alive() and time.monotonic() - began < 2  # nothing left running
    assert len(errors) == 1 and isinstance(errors[0], QueryTimeout)


def test_foreign_reads_and_failures_are_typed(store: TaskGroupStore) -> None:
    a = "w00001"
    other = next(f"w{i:05d}" for i in range(100) if task_for_key(f"w{i:05d}", TASKS) != task_for_key(a, TASKS))
    t = task_for_key(a, TASKS)
    run = QueryRun(Queries.build(), store, TASKS, GROUPS, t % GROUPS, "foreign", time.monotonic() + 5, 5)
    with pytest.raises(ForeignRead):
        run_calls(run, [(t, "foreign", [a, other])])
    run = QueryRun(Queries.build(), store, TASKS, GROUPS, t % GROUPS, "body", time.monotonic() + 5, 5)
    with pytest.raises(QueryFailed, match="TypeError"):
        run_calls(run, [(t, "body", [])])


def test_query_declarations() -> None:
    class Clash(Module):
        def define(self, m):
            m.pstate("$$a", Map(str, int))
            m.query("x")(lambda q: None)
            m.query("x")(lambda q: None)

    with pytest.raises(ModuleDefinitionError, match="declared twice"):
        Clash.build()
    d = Queries.build().queries
    assert d["top"].every_task and not d["body"].every_task and d["spin"].combine is sum_


def test_a_run_over_its_inline_budget_stops_at_its_next_read(store: TaskGroupStore) -> None:
    calls = [(t, "top", []) for t in range(TASKS)]
    over = QueryRun(Queries.build(), store, TASKS, 1, 0, "top", time.monotonic() + 5, 5, budget_s=-1.0)
    with pytest.raises(OverBudget):  # (at its first read; the caller runs the calls again without a budget)
        run_calls(over, calls)
    assert run_calls(QueryRun(Queries.build(), store, TASKS, 1, 0, "top", time.monotonic() + 5, 5, budget_s=60),
                     calls) == _run(store, "top", calls)
