"""Stream topologies: plain Python functions run per depot record, and hops that move work between tasks.

What a user writes::

    @m.stream(posts)
    def fanout(ctx, post):                       # runs on the task the post was appended to
        for follower in ctx.select("$$followers", post["author"], P.all()):
            ctx.send(deliver, follower, post)     # a hop: runs `deliver` where `follower` lives

    @m.handler
    def deliver(ctx, follower, post):            # on the task that owns `follower`
        ctx.transform("$$timelines", follower, P.add(post["id"]))

Execution model (why it looks like this):

* A record runs once, on its *home* task group (the one owning its depot
  partition), while that group builds the append's replog entry: the append,
  its effects there and the hop messages it sends are one atomic entry. The
  topology's return value is the append's ack value.
* A hop is explicit, ``ctx.send(handler, key, *values)``, because Python cannot
  capture "the rest of this function" as a continuation. The handler runs on
  the task owning ``key``, with reads and writes local there. What travels is a
  message naming the handler plus plain values, never a pickled closure. A hop
  to a key of the same task group runs in the same entry; a hop to another
  group becomes an envelope in the entry's outbox, which that group consumes
  exactly once (:mod:`topology.dataflow` has the protocol). Work per record is
  proportional to its hops, never to the number of groups.
* ``ctx.update/set/remove/transform`` on another task's key is sugar for such
  a hop; so ``update``'s function travels by name and must be defined at module
  level (extra values go as arguments: ``ctx.update(p, key, add, 5)``). This is
  checked wherever the key lives, so a module that works on one task group
  works on eight. ``ctx.depot_append`` always hops to the group owning the
  record's partition (its own group included), and the record then runs
  through that depot's topologies like a client append.
* A send never runs inside the function that sends: handlers run after it
  returns, in send order, whichever group owns the key.
* Code runs on one task (``ctx.task``), like a Rama partition: reads and writes
  of that task's keys happen there and then, and see what this record wrote so
  far. A read of another task's key raises :class:`ForeignRead` (hop there with
  ``ctx.send``), whichever group holds that task, so a module never works
  on one task group and fails on eight.
* Failures, the same however tasks are spread over groups. A topology function
  that raises (or a write of its own task that fails) on the record's home
  group refuses the client's append (:class:`HopFailed`: nothing of the record
  is stored, the appender is told). Every hop (a handler, or a write to another
  task's key) is a unit of its own: if it raises, its writes and sends are
  undone and it is retried on its own with backoff, then moved to the
  dead-letter depot with the error (:mod:`topology.dataflow.poison`). A hop to
  another task of the same group runs in the same entry and takes the same
  path if it fails, as a message the group sends itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from pstate import P
from pstate.errors import CorruptStore, StorageError, StoreClosed
from pstate.path import KEY, Path, Transform, as_transform
from pstate.store import ChangeSetBuilder
from topology import envelope as env
from topology.errors import ForeignRead, HopFailed, TopologyError
from topology.module import ModuleDefinition, TopologyDecl
from topology.partitioners import random as random_partitioner
from topology.partitioners import task_for_key
from topology.refs import MissingModule, UnsendableFunction, fn_ref, known_ref, resolve

#: local steps (handlers run on this group) one record or message may cause: a guard against send loops;
#: also the most local hops queued at once (`_Unit.local`), however many one handler sends
MAX_LOCAL_STEPS = 100_000

#: failures of the store itself, never blamed on user code (the entry fails and the replica handles it)
_INFRA = (StorageError, StoreClosed, CorruptStore)

Outbound = dict[int, list[bytes]]  # destination group -> packed messages


class _TooManyLocalHops(TopologyError):
    """One input caused more than MAX_LOCAL_STEPS local hops: its whole unit fails (never one hop alone)."""

    def __init__(self, hop: str) -> None:
        super().__init__(hop, f"more than {MAX_LOCAL_STEPS:,} local hops for one input: a handler sends to "
                         "itself without end")


class _Unit:
    """One record or message, the hops it sends, and the local ones it runs (each may fail on its own)."""

    __slots__ = ("hop", "local", "out", "steps", "task")

    def __init__(self) -> None:
        #: local hops to run: (handler, task, key, values, the packed message should it have to be sent after all)
        self.local: deque[tuple[str, int, Any, tuple[Any, ...], bytes]] = deque()
        self.out: Outbound = {}
        self.steps = 0
        self.hop = ""
        self.task = -1

    def send(self, group: int, raw: bytes) -> None:
        out = self.out.get(group)
        if out is None:
            self.out[group] = [raw]
        else:
            out.append(raw)


#: the unit of a built-in write message: it never sends or queues anything
_NO_UNIT = _Unit()


class StreamContext:
    """What a topology or handler function receives as `ctx`."""

    __slots__ = ("_b", "_hop", "_key", "_r", "_task", "_unit")

    def __init__(self, runner: StreamRunner, builder: ChangeSetBuilder, unit: _Unit, hop: str, task: int,
                 key: Any = None) -> None:
        self._r = runner
        self._b = builder
        self._unit = unit
        self._hop = hop
        self._task = task
        self._key = key  # a handler's key: writes to it need no hash (the common case)

    @property
    def task(self) -> int:
        """The task this code runs on: the record's, or the task owning the key a handler was sent to."""
        return self._task

    @property
    def tasks(self) -> int:
        return self._r.tasks

    def _task_of(self, key: Any) -> int:
        k = self._key
        if type(key) is type(k) and key == k and k is not None:
            return self._task
        return self._r.task_of(key, self._hop)

    # ---- hops ----

    def send(self, handler: Callable[..., Any] | str, key: Any, *values: Any) -> None:
        """Run ``handler(ctx, key, *values)`` on the task that owns ``key``, after this function returns."""
        name = handler if isinstance(handler, str) else getattr(handler, "__name__", "")
        decl = self._r.definition.handlers.get(name)
        if decl is None or not (isinstance(handler, str) or decl.fn is handler):
            raise TopologyError(self._hop, f"ctx.send needs a @m.handler function of this module, got {handler!r}; "
                                f"declared handlers: {sorted(self._r.definition.handlers)}")
        self._hop_to(name, key, values)

    def _hop_to(self, name: str, key: Any, values: tuple[Any, ...]) -> None:
        task = self._task_of(key)
        group = task % self._r.groups
        try:  # also for a local hop: a value that cannot travel fails
            raw = env.pack_message([name, task, key, list(values)])
        except (TypeError, ValueError, OverflowError):
            raw = self._pack([name, task, key, list(values)])  # (raises the error that says so)
        if group == self._r.group:                        # here whatever group owns the key
            local = self._unit.local
            if len(local) >= MAX_LOCAL_STEPS:  # each would cost a step: the unit would fail anyway
                raise _TooManyLocalHops(self._hop)
            local.append((name, task, key, values, raw))
        else:
            self._unit.send(group, raw)

    def _pack(self, message: list[Any]) -> bytes:
        try:
            return env.pack_message(message)
        except (TypeError, ValueError, OverflowError) as e:
            raise TopologyError(self._hop, f"a hop to {message[0]} holds a value that cannot be sent ({e}); "
                                "send plain values: str, int, float, bytes, bool, None, lists, dicts, "
                                "tuples, sets") from e

    def _emit(self, group: int, message: list[Any]) -> None:
        self._unit.send(group, self._pack(message))


    # ---- writes (local, or hops to the group that owns the key) ----

    def transform(self, pstate: str, key: Any, t: Transform | Path) -> None:
        """Apply ``t``, a path transform relative to ``key``'s value: ``ctx.transform(p, k, P.key("f").add(1))``.

        Functions in ``t`` (``update``, ``filter``, ``view``) must be module-level
        functions, wherever the key lives: they may have to travel, by name.
        """
        t = as_transform(t)
        full = Transform(Path(((KEY, key, None), *t.path.navs)), t.term, t.arg)
        # functions must have a name to travel by, wherever the key lives: checked (and encoded) now
        wire = self._wire(pstate, full) if env.has_functions(t) else None
        self._r.check_pstate(self._hop, pstate)
        task = self._task_of(key)
        if task == self._task:  # a handler writing its own key (the common case): no closures
            self._b.transform(pstate, full)
            return
        self._write(task, lambda: self._b.transform(pstate, full),
                    lambda: [env.TRANSFORM, task, key, [pstate, wire or self._wire(pstate, full)]])

    def _write(self, task: int, here: Callable[[], None], message: Callable[[], list[Any]]) -> None:
        """A write to a key of another task than this one (the callers write their own task's keys at once).

        A hop to another task of this group runs at once (one builder call,
        atomic) but fails alone, like a hop to another group: if it raises, it
        goes out as a message to this group, to be retried and dead-lettered.
        """
        group = task % self._r.groups
        if group != self._r.group:
            self._emit(group, message())
            return
        try:
            here()
        except _INFRA:
            raise
        except Exception:
            self._unit.send(self._r.group, self._pack(message()))

    def _wire(self, pstate: str, t: Transform) -> list[Any]:
        try:
            return env.encode_transform(t, f"ctx.transform({pstate!r}, ...)")
        except UnsendableFunction as e:
            raise TopologyError(self._hop, str(e)) from None

    def set(self, pstate: str, key: Any, value: Any) -> None:
        """``pstate[key] = value`` where ``key`` lives."""
        self._r.check_pstate(self._hop, pstate)
        task = self._task_of(key)
        if task == self._task:
            self._b.set(pstate, key, value)
            return
        self._write(task, lambda: self._b.set(pstate, key, value), lambda: [env.SET, task, key, [pstate, value]])

    def update(self, pstate: str, key: Any, fn: Callable[..., Any], *args: Any) -> None:
        """``pstate[key] = fn(old, *args)`` (``old`` None when absent), run where ``key`` lives.

        ``fn`` must be a module-level function, wherever the key lives: it may
        have to travel to another task group, by name.
        """
        ref = known_ref(fn)
        if ref is None:
            try:
                ref = fn_ref(fn, f"ctx.update({pstate!r}, ...)")
            except UnsendableFunction as e:
                raise TopologyError(self._hop, str(e)) from None
        self._r.check_pstate(self._hop, pstate)
        task = self._task_of(key)
        if task == self._task:
            self._b.update(pstate, key, _bind(fn, args))
            return
        group = task % self._r.groups
        if group != self._r.group:  # the hot path of a counter (WordCount): straight to the message
            self._unit.send(group, self._pack([env.UPDATE, task, key, [pstate, ref, list(args)]]))
            return
        self._write(task, lambda: self._b.update(pstate, key, _bind(fn, args)),
                    lambda: [env.UPDATE, task, key, [pstate, ref, list(args)]])

    def remove(self, pstate: str, key: Any) -> None:
        """Remove ``key`` from ``pstate`` where it lives."""
        self.transform(pstate, key, P.remove())

    def depot_append(self, depot: str, record: Any) -> None:
        """Append ``record`` to a depot of this module; it then runs through that depot's topologies.

        A `random` depot takes it on this task (every replay must agree on one).
        """
        decl = self._r.definition.depots.get(depot)
        if decl is None:
            raise TopologyError(self._hop, f"unknown depot {depot!r}; declared: {self._r.definition.depot_names()}")
        task = self._task if decl.partitioner is random_partitioner else decl.partitioner(record, self._r.tasks)
        self._emit(task % self._r.groups, [env.APPEND, task, None, [depot, record]])

    # ---- reads (keys of this task) ----

    def select_one(self, pstate: str, key: Any, path: Path | None = None) -> Any:
        """The value at ``key`` (then ``path``, relative to it); None if absent."""
        out = self.select(pstate, key, path)
        return out[0] if out else None

    def select(self, pstate: str, key: Any, path: Path | None = None) -> list[Any]:
        """Every value ``path`` reaches under ``key`` (e.g. ``P.all()`` for a set's members), in order."""
        self._r.check_pstate(self._hop, pstate)
        task = self._task_of(key)
        if task != self._task:
            raise ForeignRead(self._hop, f"read of {pstate}[{key!r}] (task {task}) from task {self._task}; "
                              "hop to the key's task with ctx.send(handler, key, ...) and read there")
        full = P.key(key) if path is None else Path((*P.key(key).navs, *path.navs))
        return self._b.select(pstate, full)


def _bind(fn: Callable[..., Any], args: tuple[Any, ...] | list[Any]) -> Callable[[Any], Any]:
    if not args:
        return fn
    return lambda old: fn(old, *args)


class StreamRunner:
    """Runs a module's stream topologies and handlers on one task group, writing into a change set.

    Each ``run_*`` call is one unit (see the module docstring): it returns the
    messages the unit sends to other groups, or raises :class:`HopFailed` with
    the builder exactly as it was before the call.
    """

    def __init__(self, definition: ModuleDefinition, tasks: int, groups: int, group: int, *,
                 on_missing: MissingModule | None = None) -> None:
        self.definition = definition
        #: asked to import the module of a function reference a hop names that this process has not imported
        self.on_missing = on_missing
        self.tasks = tasks
        self.groups = groups
        self.group = group
        self.by_depot: dict[str, list[TopologyDecl]] = {}
        for t in definition.topologies.values():
            if t.kind == "stream":
                for d in t.depots:
                    self.by_depot.setdefault(d, []).append(t)
        self._builtins: dict[str, Callable[[StreamContext, Any, list[Any]], None]] = {
            env.UPDATE: _run_update, env.SET: _run_set, env.TRANSFORM: _run_transform}

    @property
    def active(self) -> bool:
        """True when records of some depot run code (so appends may hop)."""
        return bool(self.by_depot)

    def owns_task(self, task: int) -> bool:
        return task % self.groups == self.group

    def task_of(self, key: Any, hop: str) -> int:
        try:
            return task_for_key(key, self.tasks)
        except TypeError as e:
            raise TopologyError(hop, str(e)) from None

    def check_pstate(self, topology: str, pstate: str) -> None:
        if pstate not in self.definition.pstates:
            raise TopologyError(topology, f"unknown PState {pstate!r}; declared: {self.definition.pstate_names()}")

    # ---------------------------------------------------------------------------- units

    def run_record(self, builder: ChangeSetBuilder, depot: str, task: int, record: Any,
                   acks: dict[str, list[Any]] | None = None) -> Outbound:
        """Run every topology on ``depot`` over one ``record`` of partition ``task`` (already appended).

        Each topology's return value is appended to ``acks[topology]``.
        """
        values: list[tuple[str, Any]] = []
        out = self._unit(builder, lambda unit: self._topologies(builder, unit, depot, task, record, values),
                         lambda: f"record {record!r:.200} of {depot}[{task}]")
        if acks is not None:
            for name, v in values:
                acks.setdefault(name, []).append(v)
        return out

    def run_message(self, builder: ChangeSetBuilder, message: list[Any]) -> Outbound:
        """Run one hop message that another group (or this one) sent here."""
        builtin = self._builtins.get(message[0]) if type(message) is list and len(message) == 4 else None
        if builtin is not None and self.owns_task(message[1]):
            # A write sent here (ctx.update/set/transform elsewhere): one atomic builder call that sends
            # nothing, so it needs no unit around it (the hottest kind of message).
            _name, task, key, args = message
            try:
                builtin(StreamContext(self, builder, _NO_UNIT, message[0], task, key), key, args)
            except _INFRA:
                raise
            except Exception as e:
                raise HopFailed(message[0], task, _error(e), f"message {message!r:.200}") from e
            return {}
        return self._unit(builder, lambda unit: self._message(builder, unit, message),
                          lambda: f"message {message!r:.200}")

    def run_messages(self, builder: ChangeSetBuilder, messages: list[Any]) -> Outbound:
        """Run an envelope's messages as ONE unit: what :meth:`run_message` on each, in order, would do.

        The common case (nothing fails) then pays for one unit and one
        savepoint per envelope instead of per message; each message's local
        hops still run right after it. If any message fails, nothing of the
        envelope is kept (:class:`HopFailed`) and the caller runs the messages
        one by one to tell which failed.
        """
        unit = _Unit()
        mark = builder.writes.savepoint()
        builtins, groups, group = self._builtins, self.groups, self.group
        m: Any = None
        try:
            for m in messages:
                builtin = builtins.get(m[0]) if type(m) is list and len(m) == 4 else None
                if builtin is not None and m[1] % groups == group:  # a write sent here: no unit of its own
                    builtin(StreamContext(self, builder, _NO_UNIT, m[0], m[1], m[2]), m[2], m[3])
                    continue
                unit.steps = 0
                self._message(builder, unit, m)
                if unit.local:
                    self._drain(builder, unit)
        except _INFRA:
            raise
        except Exception as e:
            builder.writes.rollback(mark)
            raise _failed(unit, e, f"message {m!r:.200}") from e
        return unit.out

    def _unit(self, builder: ChangeSetBuilder, body: Callable[[_Unit], None], what: Callable[[], str]) -> Outbound:
        """Run one unit, then its local hops; if it fails, nothing it wrote or sent is kept."""
        unit = _Unit()
        mark = builder.writes.savepoint()
        try:
            body(unit)
            self._drain(builder, unit)
        except _INFRA:
            raise
        except Exception as e:
            builder.writes.rollback(mark)
            raise _failed(unit, e, what()) from e
        return unit.out

    def _topologies(self, builder: ChangeSetBuilder, unit: _Unit, depot: str, task: int, record: Any,
                    values: list[tuple[str, Any]] | None = None) -> None:
        for topo in self.by_depot.get(depot, ()):
            unit.hop, unit.task = topo.name, task
            v = topo.fn(StreamContext(self, builder, unit, topo.name, task), record)
            if values is not None:
                values.append((topo.name, v))

    def _message(self, builder: ChangeSetBuilder, unit: _Unit, message: list[Any]) -> None:
        name, task, key, args = message
        if not self.owns_task(task):
            raise TopologyError(name, f"message for task {task} reached group {self.group}; "
                                f"it belongs to group {task % self.groups}")
        if name == env.APPEND:  # a record some code appended: it runs through its depot's topologies
            depot, record = args
            builder.depot_append(depot, task, [record])
            self._topologies(builder, unit, depot, task, record)
        else:
            self._step(builder, unit, name, task, key, args)

    def _step(self, builder: ChangeSetBuilder, unit: _Unit, name: str, task: int, key: Any,
              args: list[Any] | tuple[Any, ...]) -> None:
        unit.hop, unit.task = name, task
        ctx = StreamContext(self, builder, unit, name, task, key)
        builtin = self._builtins.get(name)
        if builtin is not None:
            builtin(ctx, key, list(args))
            return
        decl = self.definition.handlers.get(name)
        if decl is None:
            raise TopologyError(name, f"no handler {name!r} in module {self.definition.name} (is every "
                                "worker running the same module version?)")
        decl.fn(ctx, key, *args)

    def _drain(self, builder: ChangeSetBuilder, unit: _Unit) -> None:
        """Run the unit's local hops in send order, each after the function that sent it, each failing alone.

        A hop that raises is undone (its writes, and what it sent or queued) and
        goes out as a message to this group instead, to be retried and
        dead-lettered like a hop to any other group.
        """
        local = unit.local
        while local:
            unit.steps += 1
            if unit.steps > MAX_LOCAL_STEPS:
                raise _TooManyLocalHops(unit.hop)
            name, task, key, args, raw = local.popleft()
            mark, queued = builder.writes.savepoint(), len(local)
            sent = {g: len(msgs) for g, msgs in unit.out.items()}
            try:
                self._step(builder, unit, name, task, key, args)
            except (*_INFRA, _TooManyLocalHops):
                raise
            except Exception:
                builder.writes.rollback(mark)
                while len(local) > queued:
                    local.pop()
                for g in list(unit.out):
                    n = sent.get(g, 0)
                    del unit.out[g][n:]
                    if not n:
                        del unit.out[g]
                unit.send(self.group, raw)


def _failed(unit: _Unit, e: Exception, what: str) -> HopFailed:
    if isinstance(e, HopFailed):
        return e
    return HopFailed(unit.hop or "?", unit.task, _error(e), what)


def _error(e: Exception) -> str:
    return e.message if isinstance(e, TopologyError) else f"{type(e).__name__}: {e}"


# ------------------------------------------------------------------ built-in hops (ctx writes elsewhere)


def _run_update(ctx: StreamContext, key: Any, args: list[Any]) -> None:
    pstate, ref, extra = args
    ctx._b.update(pstate, key, _bind(resolve(ref, ctx._r.on_missing), extra))


def _run_set(ctx: StreamContext, key: Any, args: list[Any]) -> None:
    pstate, value = args
    ctx._b.set(pstate, key, value)


def _run_transform(ctx: StreamContext, key: Any, args: list[Any]) -> None:
    pstate, wire = args
    ctx._b.transform(pstate, env.decode_transform(wire, ctx._r.on_missing))
