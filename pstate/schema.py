"""PState schemas, modelled on Rama's: ``Map(K, V)``, ``Set(T)``, ``List(T)``, ``Record(...)``.

A schema does three jobs:

1. **Validation.**  Every write is checked before anything reaches the
   WriteBatch; a mismatch raises :class:`SchemaMismatch` naming the path, the
   expected and the received type.  Types are exact (``True`` is not an
   ``int``, ``1`` is not a ``float``) because keys of different Python types
   encode differently and a lenient check would make ``1`` and ``1.0`` two
   keys in RocksDB but one key in a dict.
2. **Storage layout.**  ``.subindexed()`` on a ``Map`` or ``Set`` stores one
   RocksDB key per element (sorted, range-queryable, with a stored count)
   instead of one msgpack blob, so a 10-million-follower set costs a point
   write per change, not a rewrite.  A ``Record`` holding a subindexed field
   is stored as a blob of its plain fields plus the subindexed fields beside
   it.  Subindexed collections may nest in the PState's top level, in other
   subindexed collections and in such records; not inside a plain (blob)
   ``Map``/``Set``/``List``, whose whole value is one msgpack blob.
3. **Wire form.**  Values are msgpack (never pickle).  msgpack has no set or
   tuple, so schemas convert those to lists on the way out and back on the
   way in; schemas made only of msgpack-native parts skip the conversion
   (``plain``), which keeps the hot path free of per-value Python work.

Python values of each schema: ``Map`` → ``dict``, ``Set`` → ``set``,
``List`` → ``list``, ``Record`` → ``dict`` holding a subset of the fields (an
absent field reads as ``None``), ``Tuple`` → ``tuple``, ``Optional(T)`` →
``None`` or a ``T``.  Maps and sets iterate in key order (sorted), as they
do on disk.
"""

from __future__ import annotations

from typing import Any

from pstate.errors import SchemaError, SchemaMismatch

_SCALARS: dict[type, str] = {str: "str", int: "int", float: "float", bytes: "bytes", bool: "bool"}


def _received(v: Any) -> str:
    text = repr(v)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(v).__name__} {text}"


class Schema:
    """Base class of every schema node."""

    #: True when the Python value equals its msgpack round trip (no conversion needed).
    plain: bool = True
    #: True when this node needs RocksDB keys of its own (subindexed, or a record holding one).
    storage: bool = False
    #: True for schemas that may be map keys / set elements.
    keyable: bool = False

    def validate(self, v: Any, path: str) -> None:
        """Raise :class:`SchemaMismatch` unless ``v`` is a value of this schema."""
        raise SchemaError(f"{type(self).__name__} cannot validate")  # overridden by every subclass

    def describe(self) -> str:
        """Human-readable form used in error messages."""
        return type(self).__name__

    def to_wire(self, v: Any) -> Any:
        """Convert a validated Python value into msgpack-native form."""
        return v

    def from_wire(self, w: Any) -> Any:
        """Inverse of :meth:`to_wire`."""
        return w

    def __repr__(self) -> str:
        return self.describe()


class Scalar(Schema):
    """``str``, ``int``, ``float``, ``bytes`` or ``bool`` (exact type)."""

    keyable = True

    def __init__(self, pytype: type) -> None:
        if pytype not in _SCALARS:
            raise SchemaError(f"unsupported scalar type {pytype!r}; use one of {sorted(_SCALARS.values())}")
        self.pytype = pytype

    def validate(self, v: Any, path: str) -> None:
        if type(v) is not self.pytype:
            raise SchemaMismatch(path, _SCALARS[self.pytype], _received(v))
        if self.pytype is float and v != v:
            raise SchemaMismatch(path, "float (not NaN: NaN has no order)", "NaN")

    def describe(self) -> str:
        return _SCALARS[self.pytype]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scalar) and other.pytype is self.pytype

    def __hash__(self) -> int:
        return hash(self.pytype)


class NoneSchema(Schema):
    """The value ``None`` only (useful inside ``Tuple`` keys)."""

    keyable = True

    def validate(self, v: Any, path: str) -> None:
        if v is not None:
            raise SchemaMismatch(path, "None", _received(v))

    def describe(self) -> str:
        return "None"


def as_schema(x: Any) -> Schema:
    """Accept a Schema, a scalar Python type or ``None``/``type(None)``."""
    if isinstance(x, Schema):
        return x
    if x is None or x is type(None):
        return NoneSchema()
    if isinstance(x, type) and x in _SCALARS:
        return Scalar(x)
    raise SchemaError(
        f"{x!r} is not a schema; use str, int, float, bytes, bool, None, Map, Set, List, Record, Tuple or Optional"
    )


class Optional(Schema):
    """``None`` or a value of the inner schema."""

    def __init__(self, inner: Any) -> None:
        self.inner = as_schema(inner)
        if self.inner.storage:
            raise SchemaError("Optional(...) cannot wrap a subindexed schema; absence already reads as None")
        self.plain = self.inner.plain

    def validate(self, v: Any, path: str) -> None:
        if v is not None:
            self.inner.validate(v, path)

    def describe(self) -> str:
        return f"Optional({self.inner.describe()})"

    def to_wire(self, v: Any) -> Any:
        return None if v is None else self.inner.to_wire(v)

    def from_wire(self, w: Any) -> Any:
        return None if w is None else self.inner.from_wire(w)


class Tuple(Schema):
    """A fixed-length tuple, e.g. a composite key ``Tuple(str, int)``."""

    plain = False

    def __init__(self, *items: Any) -> None:
        self.items = [as_schema(i) for i in items]
        self.keyable = all(i.keyable for i in self.items)
        if any(i.storage for i in self.items):
            raise SchemaError("Tuple(...) cannot hold subindexed schemas")

    def validate(self, v: Any, path: str) -> None:
        if type(v) is not tuple or len(v) != len(self.items):
            raise SchemaMismatch(path, self.describe(), _received(v))
        for i, (s, x) in enumerate(zip(self.items, v, strict=True)):
            s.validate(x, f"{path}[{i}]")

    def describe(self) -> str:
        return "Tuple(" + ", ".join(i.describe() for i in self.items) + ")"

    def to_wire(self, v: Any) -> Any:
        return [s.to_wire(x) for s, x in zip(self.items, v, strict=True)]

    def from_wire(self, w: Any) -> Any:
        return tuple(s.from_wire(x) for s, x in zip(self.items, w, strict=True))


class _Collection(Schema):
    subindex: bool = False

    def subindexed(self) -> _Collection:
        """Store one RocksDB key per element (sorted, range-queryable, O(1) size)."""
        raise SchemaError(f"{self.describe()} cannot be subindexed; subindex a Map or a Set")



class Map(_Collection):
    """A sorted map ``K -> V``."""

    def __init__(self, key: Any, value: Any, *, subindexed: bool = False) -> None:
        self.key = as_schema(key)
        self.value = as_schema(value)
        if not self.key.keyable:
            raise SchemaError(f"map key {self.key.describe()} is not orderable; use a scalar or Tuple of scalars")
        self.subindex = subindexed
        self.storage = subindexed
        # msgpack keeps dicts with scalar keys; tuple keys need conversion
        self.plain = isinstance(self.key, Scalar | NoneSchema) and self.value.plain

    def subindexed(self) -> Map:
        return Map(self.key, self.value, subindexed=True)

    def validate(self, v: Any, path: str) -> None:
        if type(v) is not dict:
            raise SchemaMismatch(path, self.describe(), _received(v))
        ks, vs = self.key, self.value
        for k, x in v.items():
            ks.validate(k, f"{path}[{k!r}] (key)")
            vs.validate(x, f"{path}[{k!r}]")

    def describe(self) -> str:
        sub = ".subindexed()" if self.subindex else ""
        return f"Map({self.key.describe()}, {self.value.describe()}){sub}"

    def to_wire(self, v: Any) -> Any:
        if self.plain:
            return v
        if isinstance(self.key, Scalar | NoneSchema):
            return {k: self.value.to_wire(x) for k, x in v.items()}
        return [[self.key.to_wire(k), self.value.to_wire(x)] for k, x in v.items()]

    def from_wire(self, w: Any) -> Any:
        if self.plain:
            return w
        if isinstance(w, dict):
            return {k: self.value.from_wire(x) for k, x in w.items()}
        return {self.key.from_wire(k): self.value.from_wire(x) for k, x in w}


class Set(_Collection):
    """A sorted set of keyable values."""

    plain = False

    def __init__(self, elem: Any, *, subindexed: bool = False) -> None:
        self.elem = as_schema(elem)
        if not self.elem.keyable:
            raise SchemaError(f"set element {self.elem.describe()} is not orderable")
        self.subindex = subindexed
        self.storage = subindexed

    def subindexed(self) -> Set:
        return Set(self.elem, subindexed=True)

    def validate(self, v: Any, path: str) -> None:
        if type(v) is not set:
            raise SchemaMismatch(path, self.describe(), _received(v))
        for x in v:
            self.elem.validate(x, f"{path}{{{x!r}}}")

    def describe(self) -> str:
        sub = ".subindexed()" if self.subindex else ""
        return f"Set({self.elem.describe()}){sub}"

    def to_wire(self, v: Any) -> Any:
        return [self.elem.to_wire(x) for x in v]

    def from_wire(self, w: Any) -> Any:
        return {self.elem.from_wire(x) for x in w}


class List(_Collection):
    """A list, stored as one blob (list positions shift, so they make poor RocksDB keys)."""

    def __init__(self, elem: Any) -> None:
        self.elem = as_schema(elem)
        self.plain = self.elem.plain

    def validate(self, v: Any, path: str) -> None:
        if type(v) is not list:
            raise SchemaMismatch(path, self.describe(), _received(v))
        for i, x in enumerate(v):
            self.elem.validate(x, f"{path}[{i}]")

    def describe(self) -> str:
        return f"List({self.elem.describe()})"

    def to_wire(self, v: Any) -> Any:
        return v if self.plain else [self.elem.to_wire(x) for x in v]

    def from_wire(self, w: Any) -> Any:
        return w if self.plain else [self.elem.from_wire(x) for x in w]


class Record(Schema):
    """A fixed-key record: ``Record(name=str, age=int)``; values are dicts holding a subset of the fields.

    Any field may be absent (it reads as ``None``); a present field must match
    its schema (``None`` only if declared ``Optional``); unknown fields are
    refused.  Fields that are subindexed collections make the record a
    storage node: its plain fields are one blob, each subindexed field lives
    in its own key range.
    """

    def __init__(self, fields: dict[str, Any] | None = None, /, **kw: Any) -> None:
        spec = dict(fields or {})
        spec.update(kw)
        if not spec:
            raise SchemaError("Record(...) needs at least one field")
        for name in spec:
            if type(name) is not str:
                raise SchemaError(f"record field names must be str, got {name!r}")
        self.fields: dict[str, Schema] = {k: as_schema(v) for k, v in spec.items()}
        self.storage = any(s.storage for s in self.fields.values())
        self.plain = all(s.plain for s in self.fields.values())
        self.inline_fields = {k: s for k, s in self.fields.items() if not s.storage}
        self.storage_fields = {k: s for k, s in self.fields.items() if s.storage}

    def validate(self, v: Any, path: str) -> None:
        if type(v) is not dict:
            raise SchemaMismatch(path, self.describe(), _received(v))
        fields = self.fields
        for k, x in v.items():
            s = fields.get(k) if type(k) is str else None
            if s is None:
                raise SchemaMismatch(f"{path}.{k}", f"one of the fields {sorted(fields)}", f"unknown field {k!r}")
            s.validate(x, f"{path}.{k}")

    def describe(self) -> str:
        return "Record(" + ", ".join(f"{k}={s.describe()}" for k, s in self.fields.items()) + ")"

    def to_wire(self, v: Any) -> Any:
        if self.plain:
            return v
        f = self.fields
        return {k: f[k].to_wire(x) for k, x in v.items()}

    def from_wire(self, w: Any) -> Any:
        if self.plain:
            return w
        f = self.fields
        return {k: f[k].from_wire(x) for k, x in w.items()}


#: ``Fixed({...})`` is an alias of ``Record({...})`` for people who know Rama's fixed-keys schema.
Fixed = Record


def _inner(s: Schema) -> list[Schema]:
    if isinstance(s, Map):
        return [s.value]
    if isinstance(s, List):
        return [s.elem]
    if isinstance(s, Record):
        return list(s.fields.values())
    return []


def _check_nesting(s: Schema, where: str) -> None:
    """Subindexed parts need their own key range, so no blob (plain Map/List) may hold one."""
    for child in _inner(s):
        if child.storage and isinstance(s, Map | List) and not (isinstance(s, Map) and s.subindex):
            raise SchemaError(
                f"{where}: {s.describe()} is stored as one blob but holds subindexed {child.describe()}; "
                "subindex the outer Map too (or move the subindexed part up)"
            )
        _check_nesting(child, where)


def check_top_level(name: str, schema: Any) -> Map | Set:
    """A PState's top level must be a Map or a Set: it is always stored one key per element."""
    s = as_schema(schema)
    if isinstance(s, Map):
        top: Map | Set = s if s.subindex else s.subindexed()
    elif isinstance(s, Set):
        top = s if s.subindex else s.subindexed()
    else:
        raise SchemaError(f"PState {name}: the top level must be a Map or a Set, got {s.describe()}")
    _check_nesting(top, f"PState {name}")
    return top
