"""A replica's code version follows its replog: the switch entry staged, dropped, applied, reopened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pstate import Map, TaskGroupStore
from topology import Module
from topology.group_code import GroupCode, ModuleCode, tag_entry


def plus(n: Any, k: int) -> int:
    return int(n or 0) + k


def version(weight: int, extra: bool) -> Any:
    class M(Module):
        name = "M"

        def define(self, m: Any) -> None:
            events = m.depot("*events")
            m.pstate("$$counts", Map(str, int))
            if extra:
                m.pstate("$$last", Map(str, int))

            @m.stream(events)
            def count(ctx: Any, r: Any) -> int:
                ctx.update("$$counts", r, plus, weight)
                return weight

    return M.build()


DEFS = {"v1": version(1, False), "v2": version(10, True)}


def open_store(path: Path) -> tuple[TaskGroupStore, GroupCode]:
    store = TaskGroupStore(path, {}, ())
    code = GroupCode(ModuleCode("M", "v1", "v2", DEFS.__getitem__), tasks=1, groups=1, group=0)
    code.open(store)
    return store, code


def stage(store: TaskGroupStore, code: GroupCode, offset: int, b: Any) -> None:
    tag_entry(offset, b)
    store.stage(offset, b)
    code.staged_entry(offset, b, store)


def test_the_build_version_follows_staged_and_applied_switch_entries(tmp_path: Path) -> None:
    store, code = open_store(tmp_path / "db")
    assert (code.applied, code.build) == ("v1", "v1") and set(store.schemas) == {"$$counts"}
    assert code.runner is not None and code.runner.definition is DEFS["v1"]
    b = code.switch_entry(store, "v2")
    assert b is not None
    stage(store, code, 0, b)
    assert code.build == "v2" and code.runner.definition is DEFS["v2"] and "$$last" in store.schemas
    assert code.switch_entry(store, "v2") is None  # appended already: no second switch
    store.drop_staged()
    code.dropped_staged(store)
    assert code.build == "v1" and "$$last" not in store.schemas
    b = code.switch_entry(store, "v2")
    assert b is not None
    stage(store, code, 0, b)
    w = store.changes()
    w.set("$$last", "a", 5)
    stage(store, code, 1, w)
    for offset, builder in ((0, b), (1, w)):
        cs = builder.changeset()
        store.apply(offset, cs)
        code.applied_entry(offset, cs, store)
    assert (code.applied, code.staged) == ("v2", None) and store.select_one("$$last", "a") == 5
    store.close()
    store, code = open_store(tmp_path / "db")  # a restart: the applied state says v2
    assert code.applied == "v2" and store.select_one("$$last", "a") == 5
    store.close()


def test_a_reference_to_code_not_imported_asks_the_hook_first(monkeypatch: Any) -> None:
    import sys
    import types

    from topology import refs

    asked: list[str] = []

    def load(module: str) -> None:  # what a worker does: import the code version the name belongs to
        asked.append(module)
        mod = types.ModuleType(module)
        mod.__dict__["add"] = plus
        sys.modules[module] = mod

    monkeypatch.delitem(sys.modules, "_millrace_code_feed.app", raising=False)
    try:
        assert refs.resolve("_millrace_code_feed.app:add", load) is plus and asked == ["_millrace_code_feed.app"]
    finally:
        sys.modules.pop("_millrace_code_feed.app", None)
        refs._RESOLVED.pop("_millrace_code_feed.app:add", None)
