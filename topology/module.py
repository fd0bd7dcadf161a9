"""The public module API: a module declares depots, PStates and topologies in `define`.

Module code is imported by reference (`pkg.mod:Class`, from the code artifact
the module was deployed with) on every worker and on the client, never pickled, so what a module declares must be reproducible from
its code alone: `define` is called once per process and must be deterministic.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from topology.combiners import Combiner, as_combiner, merge
from topology.partitioners import Partitioner
from topology.partitioners import random as random_partitioner

_NAME = r"[A-Za-z_][A-Za-z0-9_\-]*"
DEPOT_NAME = re.compile(rf"^\*{_NAME}$")
PSTATE_NAME = re.compile(rf"^\$\${_NAME}$")
#: every module's dead-letter depot: records and hop messages its topologies failed on, with the error
DEAD_LETTERS = "*dead_letters"


class ModuleDefinitionError(ValueError):
    """A module's `define` declared something invalid; the message names it and the fix."""


@dataclass(frozen=True)
class DepotDecl:
    name: str
    partitioner: Partitioner


@dataclass(frozen=True)
class Migration:
    """A PState schema change: ``fn(old_value) -> new_value``, named by ``id`` (Rama's ``migrated``).

    ``m.pstate("$$accounts", Map(str, Record(balance=int, currency=str)), migration=Migration("add-currency",
    add_currency))``. The id says which migration this is: an update whose PState declares a new id starts it
    (reads see migrated values at once, stored values are rewritten in the background); keeping the same id in
    later versions changes nothing. ``fn`` must be a module-level function and idempotent: it may be given a
    value that is already migrated (one written by the new code), and must return it unchanged.
    """

    id: str
    fn: Callable[[Any], Any]


@dataclass(frozen=True)
class PStateDecl:
    name: str
    schema: Any
    migration: Migration | None = None


@dataclass(frozen=True)
class TopologyDecl:
    name: str
    kind: str  # "stream" | "microbatch"
    depots: tuple[str, ...]
    fn: Callable[..., Any]


@dataclass(frozen=True)
class HandlerDecl:
    name: str
    fn: Callable[..., Any]


@dataclass(frozen=True)
class QueryDecl:
    """A query topology (``@m.query``): read-only, on demand; see :mod:`topology.query`."""

    name: str
    fn: Callable[..., Any]
    every_task: bool
    combine: Combiner


@dataclass
class ModuleDefinition:
    """What `define` declared, in declaration order (column families follow this order)."""

    name: str
    depots: dict[str, DepotDecl] = field(default_factory=dict)
    pstates: dict[str, PStateDecl] = field(default_factory=dict)
    topologies: dict[str, TopologyDecl] = field(default_factory=dict)
    handlers: dict[str, HandlerDecl] = field(default_factory=dict)
    queries: dict[str, QueryDecl] = field(default_factory=dict)

    def _check_free(self, name: str) -> None:
        if name in self.depots or name in self.pstates or name in self.topologies or name in self.handlers \
                or name in self.queries:
            raise ModuleDefinitionError(f"module {self.name}: {name!r} is declared twice; names must be unique")

    def depot(self, name: str, partitioner: Partitioner = random_partitioner) -> DepotDecl:
        """Declare a depot `*name`: a partitioned, replicated append-only log."""
        if not DEPOT_NAME.match(name):
            raise ModuleDefinitionError(
                f"module {self.name}: depot name {name!r} must start with '*' (e.g. '*sentences')"
            )
        if name == DEAD_LETTERS:
            raise ModuleDefinitionError(f"module {self.name}: {DEAD_LETTERS} is every module's dead-letter depot "
                                        "(declared for you); choose another name")
        if not isinstance(partitioner, Partitioner):
            raise ModuleDefinitionError(
                f"module {self.name}: depot {name} needs a Partitioner (random, global_, hash_by(fn) or "
                f"custom(name, fn)), got {type(partitioner).__name__}"
            )
        self._check_free(name)
        decl = DepotDecl(name, partitioner)
        self.depots[name] = decl
        return decl

    def pstate(self, name: str, schema: Any, migration: Migration | None = None) -> PStateDecl:
        """Declare a PState `$$name` with a schema from `pstate` (Map, Set, List, Record...).

        A schema that differs from the running version's needs a ``migration`` (see :class:`Migration`).
        """
        if not PSTATE_NAME.match(name):
            raise ModuleDefinitionError(
                f"module {self.name}: PState name {name!r} must start with '$$' (e.g. '$$counts')"
            )
        if migration is not None and not (isinstance(migration, Migration) and isinstance(migration.id, str)
                                          and migration.id and callable(migration.fn)):
            raise ModuleDefinitionError(f"module {self.name}: PState {name} takes migration=Migration(id, fn) with a "
                                        f"non-empty id and a function, got {migration!r}")
        self._check_free(name)
        decl = PStateDecl(name, schema, migration)
        self.pstates[name] = decl
        return decl

    def _topology(self, kind: str, depots: tuple[DepotDecl | str, ...]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        names = tuple(d.name if isinstance(d, DepotDecl) else d for d in depots)
        for n in names:
            if n == DEAD_LETTERS:
                raise ModuleDefinitionError(
                    f"module {self.name}: a topology cannot subscribe to {DEAD_LETTERS} (a failure there would "
                    "have nowhere to go); read it with the client or Spark"
                )
            if n not in self.depots:
                raise ModuleDefinitionError(
                    f"module {self.name}: {kind} topology subscribes to unknown depot {n!r}; "
                    f"declared depots: {sorted(self.depots)}"
                )

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._check_free(fn.__name__)
            self.topologies[fn.__name__] = TopologyDecl(fn.__name__, kind, names, fn)
            return fn

        return register

    def stream(self, *depots: DepotDecl | str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorate `fn(ctx, record)` to run per record on the task leaders of `depots`."""
        return self._topology("stream", depots)

    def microbatch(self, *depots: DepotDecl | str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorate `fn(batch_df, ctx)` to run on Spark over `depots` with exactly-once commits."""
        return self._topology("microbatch", depots)

    def handler(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate `fn(ctx, key, *values)`: code that `ctx.send(fn, key, *values)` runs where `key` lives.

        A handler runs on the task that owns `key` (a hop), with reads and writes
        local there; the values come with the message. Returns `fn` unchanged,
        so a topology passes the function itself to `ctx.send`.
        """
        if not callable(fn) or not isinstance(getattr(fn, "__name__", None), str):
            raise ModuleDefinitionError(f"module {self.name}: @m.handler decorates a function, got {fn!r}")
        self._check_free(fn.__name__)
        self.handlers[fn.__name__] = HandlerDecl(fn.__name__, fn)
        return fn

    def query(self, name: str, *, every_task: bool = False,
              combine: Combiner | Callable[[Any, Any], Any] = merge) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorate ``fn(q, *args)``: a query topology, run by ``cluster.query(module, name, *args)``.

        It starts on the task that owns ``args[0]`` (or, ``every_task=True``, on every task), reads PStates
        there through ``q``, may ``q.send(other_query, key, *values)`` to run another query function of the
        module on the task owning ``key``, and every call's result is combined with ``combine`` (``sum_``,
        ``count``, ``merge``, ``top_n(n)`` from :mod:`topology.combiners`, or a function ``f(a, b)``).
        Read-only: nothing it does is replicated (see :mod:`topology.query`).
        """
        if not isinstance(name, str) or not re.match(rf"^{_NAME}$", name):
            raise ModuleDefinitionError(f"module {self.name}: query name {name!r} must be an identifier")
        try:
            combiner = as_combiner(combine)
        except TypeError as e:
            raise ModuleDefinitionError(f"module {self.name}: query {name}: {e}") from None

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if not callable(fn):
                raise ModuleDefinitionError(f"module {self.name}: @m.query decorates a function, got {fn!r}")
            self._check_free(name)
            self.queries[name] = QueryDecl(name, fn, every_task, combiner)
            return fn

        return register

    def depot_names(self) -> list[str]:
        return list(self.depots)

    def pstate_names(self) -> list[str]:
        return list(self.pstates)


class Module:
    """Subclass and implement `define(self, m)`; the class name is the default module name."""

    name: str | None = None

    def define(self, m: ModuleDefinition) -> None:
        raise ModuleDefinitionError(f"{type(self).__name__} must implement define(self, m)")

    @classmethod
    def module_name(cls) -> str:
        return cls.name or cls.__name__

    @classmethod
    def build(cls) -> ModuleDefinition:
        md = ModuleDefinition(cls.module_name())
        cls().define(md)
        if not md.depots and not md.pstates:
            raise ModuleDefinitionError(f"module {md.name} declares no depot and no PState")
        md.depots[DEAD_LETTERS] = DepotDecl(DEAD_LETTERS, random_partitioner)
        return md


def split_module_ref(ref: str) -> tuple[str, str]:
    """(module, class) of a reference ``pkg.mod:Class``."""
    mod_name, sep, cls_name = ref.partition(":")
    if not sep or not mod_name or not cls_name:
        raise ModuleDefinitionError(f"module reference {ref!r} must look like 'package.module:ClassName'")
    return mod_name, cls_name


def module_class(mod: Any, ref: str) -> type[Module]:
    """The Module subclass `ref` names in the imported module `mod` (the class may be nested: ``Outer.Inner``)."""
    obj: Any = mod
    for part in split_module_ref(ref)[1].split("."):
        obj = getattr(obj, part, None)
    if not (isinstance(obj, type) and issubclass(obj, Module)):
        raise ModuleDefinitionError(f"{ref!r} does not name a Module subclass in {split_module_ref(ref)[0]}")
    return obj


def load_module(ref: str) -> type[Module]:
    """Import `pkg.mod:Class` from this interpreter's path (modules deployed without shipped code, and tools);
    deployed code artifacts load through :mod:`topology.code_loader` instead."""
    mod_name, _cls = split_module_ref(ref)
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ModuleDefinitionError(f"cannot import {mod_name!r} for module {ref!r}: {e}") from e
    return module_class(mod, ref)
