"""Diffs read off an entry's writes (pstate.diffs) fold into exactly the value the entry leaves."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pstate import Map, P, Set, TaskGroupStore
from pstate.diffs import WHOLE, Watch, diffs_of, fold, pack_event, unpack_event
from pstate.store import pstate_cf

SCHEMAS = {
    "$$counts": Map(str, int),
    "$$follows": Map(str, Set(str).subindexed()),
    "$$timeline": Map(str, Map(int, str).subindexed()),
    "$$nested": Map(str, Map(str, Map(int, int).subindexed()).subindexed()),
    "$$tags": Map(str, Set(str)),
}


def _value(store: TaskGroupStore, pstate: str, key: Any) -> Any:
    view = store.pstate(pstate)
    return view.select_one(P) if key is WHOLE else view.select_one(P.key(key))


def _run(tmp_path: Any, pstate: str, key: Any, steps: list[Any]) -> None:
    store = TaskGroupStore(tmp_path / "s", SCHEMAS)
    watch = Watch.of(pstate_cf(pstate), store.schemas[pstate], key)
    value = _value(store, pstate, key)
    for offset, step in enumerate(steps):
        cs = store.changes()
        step(cs)
        payload = cs.encode()
        store.apply(offset, payload)
        d = diffs_of(cs.changeset(), watch)
        assert d is not None, step
        value = fold(copy.deepcopy(value), d)
        assert value == _value(store, pstate, key) or (not value and not _value(store, pstate, key)), (offset, d)
    store.close()


def test_plain_key_and_whole_map(tmp_path: Any) -> None:
    steps = [lambda cs: cs.set("$$counts", "a", 1), lambda cs: cs.set("$$counts", "b", 2),
             lambda cs: cs.update("$$counts", "a", lambda n: n + 1),
             lambda cs: cs.transform("$$counts", P.key("b").remove())]
    _run(tmp_path / "1", "$$counts", "a", steps)
    _run(tmp_path / "2", "$$counts", WHOLE, steps)


def test_subindexed_collections(tmp_path: Any) -> None:
    steps = [lambda cs: cs.transform("$$follows", P.key("al").add("bo", "cy")),
             lambda cs: cs.transform("$$follows", P.key("al").discard("bo")),
             lambda cs: cs.transform("$$timeline", P.key("al").key(3).set("hi")),
             lambda cs: cs.transform("$$timeline", P.key("al").key(4).set("yo")),
             lambda cs: cs.transform("$$timeline", P.key("al").key(3).remove()),
             lambda cs: cs.transform("$$follows", P.key("al").set({"dd"})),
             lambda cs: cs.transform("$$follows", P.key("al").remove())]
    _run(tmp_path / "1", "$$follows", "al", steps)
    _run(tmp_path / "2", "$$timeline", "al", steps)
    _run(tmp_path / "3", "$$follows", WHOLE, steps)


def test_nested_subindexed(tmp_path: Any) -> None:
    steps = [lambda cs: cs.transform("$$nested", P.key("x").key("y").key(1).set(5)),
             lambda cs: cs.transform("$$nested", P.key("x").key("y").key(2).set(6)),
             lambda cs: cs.transform("$$nested", P.key("x").key("z").key(1).set(7)),
             lambda cs: cs.transform("$$nested", P.key("x").key("y").remove())]
    _run(tmp_path / "1", "$$nested", "x", steps)


def test_plain_set_value_and_untouched_keys(tmp_path: Any) -> None:
    steps = [lambda cs: cs.set("$$tags", "t", {"a", "b"}), lambda cs: cs.set("$$tags", "u", {"c"})]
    _run(tmp_path / "1", "$$tags", "t", steps)
    store = TaskGroupStore(tmp_path / "2", SCHEMAS)
    cs = store.changes()
    cs.set("$$counts", "other", 1)
    assert diffs_of(cs.changeset(), Watch.of(pstate_cf("$$counts"), store.schemas["$$counts"], "a")) == []
    assert diffs_of(cs.changeset(), Watch.of(pstate_cf("$$tags"), store.schemas["$$tags"], "a")) == []
    store.close()


@pytest.mark.parametrize("value", [{"a": 1}, {"s", "t"}, 1 << 70, None, [1, "x"]])
def test_events_round_trip(value: Any) -> None:
    assert unpack_event(pack_event(2, 7, value)) == (2, 7, value)
