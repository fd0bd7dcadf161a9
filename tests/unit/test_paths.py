"""Path semantics on RocksDB equal the same path on plain Python values.

Hypothesis draws a schema (plain and subindexed maps, sets, records, lists,
optional values, tuple keys), a run of transforms and selects built from that
schema (key, all, map_vals, sorted_range, first, last, filter, view,
null_to_val, count; set, update, remove, add, discard — some deliberately
ill-typed), and checks after every step that the store holds exactly what the
plain-Python model (``pstate.path.transform_value`` on dicts/sets/lists)
holds, that selects agree, and that a failing transform raises the same error
class in both and writes nothing.  Several transforms share one ChangeSet, so
reads through pending writes are covered too.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pstate import (
    REMOVED,
    InvalidPath,
    List,
    Map,
    Optional,
    P,
    Path,
    PStateError,
    Record,
    SchemaError,
    SchemaMismatch,
    Set,
    TaskGroupStore,
    Tuple,
)
from pstate.path import select_value, transform_value, unwrap
from pstate.schema import NoneSchema, Scalar, Schema, check_top_level

STRS = ["", "a", "ab", "b", "c", "d\x00", "é"]
INTS = [-(1 << 70), -3, -1, 0, 1, 2, 5, 1 << 66]


def key_strategy(s: Schema) -> st.SearchStrategy[Any]:
    if isinstance(s, Scalar):
        if s.pytype is str:
            return st.sampled_from(STRS)
        if s.pytype is int:
            return st.sampled_from(INTS)
        if s.pytype is float:
            return st.sampled_from([-2.5, 0.0, 1.0, 3.25])
        if s.pytype is bytes:
            return st.sampled_from([b"", b"\x00", b"a", b"b\xff"])
        return st.booleans()
    if isinstance(s, NoneSchema):
        return st.none()
    assert isinstance(s, Tuple)
    return st.tuples(*(key_strategy(i) for i in s.items))


def value_strategy(s: Schema) -> st.SearchStrategy[Any]:
    if isinstance(s, Scalar | NoneSchema | Tuple):
        return key_strategy(s)
    if isinstance(s, Optional):
        return st.none() | value_strategy(s.inner)
    if isinstance(s, Map):
        return st.dictionaries(key_strategy(s.key), value_strategy(s.value), max_size=4)
    if isinstance(s, Set):
        return st.sets(key_strategy(s.elem), max_size=4)
    if isinstance(s, List):
        return st.lists(value_strategy(s.elem), max_size=3)
    assert isinstance(s, Record)
    return st.fixed_dictionaries({}, optional={f: value_strategy(fs) for f, fs in s.fields.items()})


def bad_value(s: Schema | None) -> Any:
    """A value of the wrong type for ``s`` (to exercise SchemaMismatch)."""
    s = unwrap(s)
    if isinstance(s, Scalar) and s.pytype is str:
        return 7
    return "not-that"


INNER = [
    Scalar(int),
    Scalar(str),
    Optional(int),
    List(Scalar(int)),
    Map(str, int),
    Set(int),
    Map(Tuple(str, int), int),
    Map(str, int).subindexed(),
    Set(str).subindexed(),
    Record(a=int, b=Optional(str)),
    Record(a=int, s=Set(int).subindexed()),
    Record(n=Optional(int), m=Map(int, Record(x=int, t=Set(str).subindexed())).subindexed()),
    Map(str, Set(int).subindexed()).subindexed(),
    Map(int, Map(str, List(int)).subindexed()).subindexed(),
]
KEYS = [Scalar(str), Scalar(int), Tuple(str, int)]


@st.composite
def schemas(draw: st.DrawFn) -> Map | Set:
    if draw(st.integers(0, 9)) == 0:
        return check_top_level("$$t", Set(draw(st.sampled_from(KEYS))))
    return check_top_level("$$t", Map(draw(st.sampled_from(KEYS)), draw(st.sampled_from(INNER))))


def canon(v: Any) -> Any:
    """Order-independent form of a value (views must not depend on dict insertion order)."""
    if isinstance(v, dict):
        return sorted((repr(k), canon(x)) for k, x in v.items())
    if isinstance(v, set):
        return sorted(repr(x) for x in v)
    if isinstance(v, list | tuple):
        return [canon(x) for x in v]
    return repr(v)


PREDS: list[Callable[[Any], bool]] = [
    lambda v: v is not None,
    lambda v: v is None,
    lambda v: len(repr(v)) % 2 == 0,
]


def draw_navs(data: st.DataObject, schema: Schema, for_select: bool) -> tuple[Path, Schema | None]:
    path = P
    cur: Schema | None = schema
    for _ in range(data.draw(st.integers(0, 4))):
        s = unwrap(cur)
        choices = ["stop", "filter", "null"]
        if isinstance(s, Map):
            choices += ["key", "key", "key", "map_vals", "all", "range", "first", "last"]
        elif isinstance(s, Set):
            choices += ["all", "range", "first", "last"]
        elif isinstance(s, List):
            choices += ["all", "first", "last"]
        elif isinstance(s, Record):
            choices += ["key", "key"]
        if for_select:
            choices += ["view", "count"]
        c = data.draw(st.sampled_from(choices))
        if c == "stop":
            break
        if c == "filter":
            path = path.filter(data.draw(st.sampled_from(PREDS)))
        elif c == "null":
            if cur is None:
                continue
            path = path.null_to_val(data.draw(value_strategy(cur)))
        elif c == "view":
            return path.view(canon), None
        elif c == "count":
            if isinstance(s, Map | Set | List):
                return path.count(), None
        elif c == "key" and isinstance(s, Map):
            path = path.key(data.draw(key_strategy(s.key)))
            cur = s.value
        elif c == "key" and isinstance(s, Record):
            f = data.draw(st.sampled_from(sorted(s.fields)))
            path = path.key(f)
            cur = s.fields[f]
        elif c == "map_vals" and isinstance(s, Map):
            path = path.map_vals()
            cur = s.value
        elif c == "all":
            path = path.all()
            if isinstance(s, Map):
                return path, None  # (k, v) pairs: only terminals follow
            assert isinstance(s, Set | List)
            cur = s.elem
        elif c == "range" and isinstance(s, Map | Set):
            ks = s.key if isinstance(s, Map) else s.elem
            a = data.draw(st.none() | key_strategy(ks))
            b = data.draw(st.none() | key_strategy(ks))
            path = path.sorted_range(a, b)
        elif c in ("first", "last"):
            n = data.draw(st.integers(0, 3))
            path = path.first(n) if c == "first" else path.last(n)
    return path, cur


def draw_transform(data: st.DataObject, schema: Schema) -> Any:
    path, cur = draw_navs(data, schema, for_select=False)
    s = unwrap(cur)
    choices = ["set", "update", "remove", "bad"]
    if isinstance(s, Set):
        choices += ["add", "add", "discard"]
    if isinstance(s, List):
        choices += ["add"]
    if cur is None:
        choices = ["remove", "pair_update"]
    c = data.draw(st.sampled_from(choices))
    if c == "set":
        return path.set(data.draw(value_strategy(cur)))  # type: ignore[arg-type]
    if c == "bad":
        return path.set(bad_value(cur))
    if c == "remove":
        return path.remove()
    if c == "update":
        if isinstance(s, Scalar) and s.pytype is int:
            return path.update(lambda x: (x or 0) + 1)
        new = data.draw(value_strategy(cur))  # type: ignore[arg-type]
        keep = data.draw(st.booleans())
        return path.update(lambda x: x if keep and x is not None else new)
    if c == "pair_update":
        parent = path.navs
        # find the map schema the pairs come from, to draw a new value of its value type
        return path.update(lambda kv: kv)  if not parent else path.update(lambda kv: (kv[0], kv[1]))
    assert isinstance(s, Set | List)
    items = data.draw(st.lists(key_strategy(s.elem) if isinstance(s, Set) else value_strategy(s.elem), max_size=3))
    return path.add(*items) if c == "add" else path.discard(*items)


_counter = itertools.count()


def run_model(schema: Map | Set, model: Any, t: Any) -> Any:
    r = transform_value(schema, model, t.path.navs, 0, t.term, t.arg)
    if r is REMOVED:
        return {} if isinstance(schema, Map) else set()
    return r


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(schema=schemas(), data=st.data())
def test_store_matches_plain_python(schema: Map | Set, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory(prefix="pstate-paths-") as d:
        store = TaskGroupStore(d, {"$$t": schema})
        try:
            initial = data.draw(value_strategy(schema))
            model: Any = initial
            cs = store.changes()
            cs.transform("$$t", P.set(initial))
            offset = 0
            store.apply(offset, cs.encode())
            assert store.select("$$t") == [model]
            cs = store.changes()
            for _ in range(data.draw(st.integers(1, 10))):
                if data.draw(st.integers(0, 3)) == 0:
                    path, _ = draw_navs(data, schema, for_select=True)
                    try:
                        want: Any = []
                        select_value(schema, model, path.navs, 0, want)
                    except PStateError as exc:
                        with pytest.raises(type(exc)):
                            cs.select("$$t", path)
                        continue
                    assert cs.select("$$t", path) == want, path
                    continue
                t = draw_transform(data, schema)
                try:
                    new_model = run_model(schema, model, t)
                except PStateError as exc:
                    event(f"transform raises {type(exc).__name__}")
                    before = len(cs)
                    with pytest.raises(type(exc)):
                        cs.transform("$$t", t)
                    assert len(cs) == before  # nothing written
                    continue
                cs.transform("$$t", t)
                event("transform changed state" if new_model != model else "transform kept state")
                model = new_model
                if data.draw(st.booleans()):
                    offset += 1
                    store.apply(offset, cs.encode())
                    cs = store.changes()
                    assert store.select("$$t") == [model]
            offset += 1
            store.apply(offset, cs.encode())
            assert store.select("$$t") == [model]
            # O(1) stored counts agree with the data for every subindexed collection reached by key
            assert store.select("$$t", P.count()) == [len(model)]
        finally:
            store.close()


# ---------------------------------------------------------------------------
# examples that document the semantics
# ---------------------------------------------------------------------------

USERS = Map(str, Record(age=Optional(int), follows=Set(str).subindexed(),
                        posts=Map(int, str).subindexed()))


@pytest.fixture
def store(tmp_path: Any) -> Any:
    s = TaskGroupStore(tmp_path / "state", {"$$users": USERS, "$$counts": Map(str, int)})
    yield s
    s.close()


def commit(store: TaskGroupStore, *transforms: tuple[str, Any]) -> None:
    cs = store.changes()
    for name, t in transforms:
        cs.transform(name, t)
    store.apply(store.applied_offset + 1, cs.encode())


def test_subindexed_examples(store: TaskGroupStore) -> None:
    commit(store,
           ("$$users", P.key("al").key("follows").add(*"edcba")),
           ("$$users", P.key("al").key("posts").key(3).set("three")),
           ("$$users", P.key("al").key("posts").key(1).set("one")),
           ("$$users", P.key("al").key("age").set(30)))
    sel = store.pstate("$$users")
    assert sel.select(P.key("al").key("follows").sorted_range("b", "d").all()) == ["b", "c"]
    assert sel.select(P.key("al").key("follows").first(2).all()) == ["a", "b"]
    assert sel.select(P.key("al").key("follows").last(2)) == [{"d", "e"}]
    assert sel.select_one(P.key("al").key("follows").count()) == 5
    assert sel.select(P.key("al").key("posts").all()) == [(1, "one"), (3, "three")]
    assert sel.select_one(P.key("al").key("age")) == 30
    assert sel.select_one(P.key("nobody").key("age")) is None
    commit(store, ("$$users", P.key("al").key("follows").sorted_range("b", "d").remove()))
    assert sel.select_one(P.key("al").key("follows")) == {"a", "d", "e"}
    assert sel.select_one(P.key("al").key("follows").count()) == 3
    commit(store, ("$$users", P.key("al").remove()))
    assert sel.select(P.all()) == []


def test_word_count_and_null_to_val(store: TaskGroupStore) -> None:
    cs = store.changes()
    for w in ["the", "cat", "sat", "on", "the", "mat", "the", "end"]:
        cs.transform("$$counts", P.key(w).null_to_val(0).update(lambda n: n + 1))
    store.apply(0, cs.encode())
    assert store.select_one("$$counts", "the") == 3
    assert store.select("$$counts", P.sorted_range("m", "t").map_vals()) == [1, 1, 1]
    commit(store, ("$$counts", P.map_vals().filter(lambda n: n > 1).remove()))
    assert store.select_one("$$counts", "the") is None
    commit(store, ("$$counts", P.key("zz").null_to_val(9)))
    assert store.select_one("$$counts", "zz") == 9


def test_schema_mismatch_names_path_and_writes_nothing(store: TaskGroupStore) -> None:
    cs = store.changes()
    cs.transform("$$users", P.key("al").key("age").set(1))
    with pytest.raises(SchemaMismatch) as ei:
        cs.transform("$$users", P.key("al").key("follows").add("ok", 5))
    assert "follows" in str(ei.value) and "str" in ei.value.expected and "int" in ei.value.received
    with pytest.raises(SchemaMismatch):
        cs.set("$$counts", "x", "not an int")
    with pytest.raises(SchemaMismatch):
        cs.set_many("$$counts", [("a", 1), ("b", True)])
    assert len(cs) == 1
    with pytest.raises(InvalidPath):
        cs.transform("$$users", P.key("al").key("nofield").set(1))
    with pytest.raises(InvalidPath):
        cs.transform("$$counts", P.key("a").view(str).set(1))


def test_schema_definition_errors() -> None:
    with pytest.raises(SchemaError):
        check_top_level("$$x", Map(str, Map(str, Set(int).subindexed())))  # blob map holding a subindexed set
    with pytest.raises(SchemaError):
        List(int).subindexed()
    with pytest.raises(SchemaError):
        check_top_level("$$x", List(int))
    with pytest.raises(SchemaError):
        Map(List(int), int)


def test_set_into_a_subindexed_map_writes_what_the_general_path_writes(tmp_path: Any, monkeypatch: Any) -> None:
    """The two-level set fast path (timelines, indexes) must be byte-for-byte the general path."""
    from pstate.engine import Engine

    schema = {"$$t": Map(str, Map(int, str).subindexed()), "$$f": Map(str, Map(float, str).subindexed())}
    ops = [("$$t", P.key("ann").key(3).set("x")), ("$$t", P.key("ann").key(1).set("y")),
           ("$$t", P.key("ann").key(3).set("z")), ("$$t", P.key("bob").key(3).set("x")),
           ("$$f", P.key("a").key(1.5).set("v"))]

    def payload(store: TaskGroupStore) -> bytes:
        cs = store.changes()
        for name, t in ops:
            cs.transform(name, t)
        return cs.encode()

    fast = TaskGroupStore(tmp_path / "fast", schema)
    general = TaskGroupStore(tmp_path / "general", schema)
    try:
        got = payload(fast)
        monkeypatch.setattr(Engine, "_set_in_submap", lambda *a: False)
        assert got == payload(general)
        fast.apply(0, got)
        assert fast.select_one("$$t", P.key("ann").count()) == 2
        assert fast.select("$$t", P.key("ann").all()) == [(1, "y"), (3, "z")]
        with pytest.raises(SchemaMismatch):  # types that do not fit go the validating way
            fast.changes().transform("$$t", P.key("ann").key("3").set("x"))
    finally:
        fast.close()
        general.close()
