"""Query topologies: distributed, read-only, on-demand computations that hop between tasks.

What a user writes (examples/word_count.py, examples/timeline.py)::

    @m.query("top_words", every_task=True, combine=top_n(10, key=1))
    def top_words(q):
        return q.scan("$$counts")                         # this task's (word, count) pairs, paged

    @m.query("timeline_page", combine=merge)
    def timeline_page(q, user, n):
        for post_id, author in q.select("$$timelines", user, P.last(n).all()):
            q.send(post_author, author, post_id)          # a hop: runs on `author`'s task

    @m.query("post_author", combine=merge)
    def post_author(q, author, post_id):
        return {post_id: {"author": author, "followers": q.select_one("$$followers", author, P.count())}}

Execution model:

* A query starts on the task owning its first argument, or on every task (``every_task=True``); its
  function gets a :class:`QueryContext` ``q`` for that task. Reads (``select``, ``select_one``, ``scan``,
  every path navigator, ``filter`` and ``view`` included) are of the group leader's applied state, and of
  that task's keys only (a read of another task's key is :class:`ForeignRead`: hop there).
* ``q.send(query, key, *values)`` is the dataflow's hop shape without a replog entry: it runs another query
  function of the module on the task owning ``key``, after this call returns. Every call's result, the
  first one's and each hop's, is combined with the starting query's combiner (:mod:`topology.combiners`).
* One request to a group leader runs a list of calls (:func:`run_calls`); hops to a task of the same group
  run in the same request, hops to other groups come back to the caller, which sends them on to those
  groups' leaders. Nothing is written and nothing stays behind: a request holds its calls, its partial
  result and its hops, each bounded. The ``q.scan`` results its calls return un-read are read together,
  one pass over the group's range (:class:`TaskScan`).
* A deadline bounds it all: every read, page and send checks it, and a call past it raises
  :class:`QueryTimeout`, which ends the request (a function computing without reading is not interrupted).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import msgpack

from pstate.errors import CorruptStore, StorageError, StoreClosed
from pstate.path import Path
from pstate.query import path_navs
from pstate.store import TaskGroupStore
from topology.errors import ForeignRead, QueryFailed, QueryTimeout, TopologyError
from topology.module import ModuleDefinition, QueryDecl
from topology.partitioners import task_for_key

#: calls one request runs on a group (its own and the hops that stay in the group)
MAX_CALLS_PER_REQUEST = 100_000
#: hops one request sends to other groups
MAX_HOPS_OUT = 100_000
#: entries one page of ``q.scan`` holds
SCAN_PAGE = 4096
SCAN_PAGE_BYTES = 1 << 20

#: failures of the store itself, never blamed on the query's code
_INFRA: tuple[type[Exception], ...] = (StorageError, StoreClosed, CorruptStore, QueryTimeout, QueryFailed)


class OverBudget(Exception):
    """A run given a budget (``QueryRun(budget_s=...)``) reached it at a read: its caller drops it (nothing was
    written: a query only reads) and runs the calls again without one."""

    def __init__(self, root: str) -> None:
        super().__init__(f"query {root} outgrew its inline budget")

Call = tuple[int, str, list[Any]]  # (task, query name, arguments)
_INFRA += (OverBudget,)


class QueryRun:
    """One request's calls on one task group: what its contexts share (store, deadline, hops out)."""

    def __init__(self, definition: ModuleDefinition, store: TaskGroupStore, tasks: int, groups: int, group: int,
                 root: str, deadline: float, timeout_s: float, budget_s: float | None = None) -> None:
        self.definition = definition
        self.store = store
        self.tasks = tasks
        self.groups = groups
        self.group = group
        self.root = root
        self.deadline = deadline
        self.timeout_s = timeout_s
        #: the CPU time of its thread at which a run tried inline (``budget_s``) gives up at its next read (CPU
        #: time: a busy machine preempting the thread must not make a small request start again)
        self.budget_end = None if budget_s is None else time.thread_time() + budget_s
        self.local: deque[Call] = deque()
        self.remote: list[Call] = []
        #: a scan of a whole PState found its store's memtables worth flushing (the caller flushes, off the loop)
        self.flush_due = False

    def check_deadline(self) -> None:
        if time.monotonic() > self.deadline:
            raise QueryTimeout(self.root, self.timeout_s)
        if self.budget_end is not None and time.thread_time() > self.budget_end:
            raise OverBudget(self.root)

    def decl(self, name: str) -> QueryDecl:
        d = self.definition.queries.get(name)
        if d is None:
            raise TopologyError(name, f"no query {name!r} in module {self.definition.name} (is every worker "
                                f"running the same code version?); declared: {sorted(self.definition.queries)}")
        return d

    def hop(self, call: Call) -> None:
        if call[0] % self.groups == self.group:
            if len(self.local) >= MAX_CALLS_PER_REQUEST:
                raise QueryFailed(self.root, call[0], f"more than {MAX_CALLS_PER_REQUEST} hops queued")
            self.local.append(call)
        else:
            if len(self.remote) >= MAX_HOPS_OUT:
                raise QueryFailed(self.root, call[0], f"more than {MAX_HOPS_OUT} hops to other task groups")
            self.remote.append(call)


class QueryContext:
    """What a query function receives as ``q``: reads of its task's keys, hops, its task."""

    __slots__ = ("_name", "_run", "_task")

    def __init__(self, run: QueryRun, task: int, name: str) -> None:
        self._run = run
        self._task = task
        self._name = name

    @property
    def task(self) -> int:
        """The task this call runs on."""
        return self._task

    @property
    def tasks(self) -> int:
        return self._run.tasks

    def _own(self, pstate: str, key: Any) -> None:
        self._run.check_deadline()
        if task_for_key(key, self._run.tasks) != self._task:
            raise ForeignRead(self._name, f"{pstate} key {key!r:.60} belongs to task "
                              f"{task_for_key(key, self._run.tasks)}, not {self._task}; q.send a query there")

    def select(self, pstate: str, key: Any, *path: Path) -> list[Any]:
        """Every value ``path`` reaches under ``key`` (a key of this task)."""
        self._own(pstate, key)
        return self._run.store.pstate(pstate).select(Path(path_navs(key, path)))

    def select_one(self, pstate: str, key: Any, *path: Path) -> Any:
        """The one value ``path`` reaches under ``key`` (a key of this task), or None."""
        self._own(pstate, key)
        return self._run.store.pstate(pstate).select_one(Path(path_navs(key, path)))

    def scan(self, pstate: str, start: Any = None, end: Any = None, *path: Path) -> TaskScan:
        """This task's ``(key, value)`` pairs of a map PState in ``[start, end)``, in key order, read a page at a time
        when iterated (``path``: navigators applied to each pair, as after ``all()``). Returned un-read as the
        call's result, the scans of a request's calls are read together in one pass (see :class:`TaskScan`)."""
        return TaskScan(self._run, self._task, (pstate, start, end, path_navs(Path(), path) if path else ()))

    def send(self, query: Callable[..., Any] | str, key: Any, *values: Any) -> None:
        """Run query function ``query(q, key, *values)`` on the task owning ``key``; its result is combined in."""
        run = self._run
        run.check_deadline()
        name = query if isinstance(query, str) else getattr(query, "__name__", "")
        decl = run.definition.queries.get(name)
        if decl is None or decl.every_task or not (isinstance(query, str) or decl.fn is query):
            raise TopologyError(self._name, f"q.send needs a query of this module that starts at a key, got "
                                f"{query!r}; declared: {sorted(run.definition.queries)}")
        args = [key, *values]
        try:
            msgpack.packb(args, use_bin_type=True)  # a hop within the group must travel like one that leaves it
        except (TypeError, ValueError, OverflowError) as e:
            raise TopologyError(self._name, f"a hop to {name} holds a value that cannot be sent ({e}); send "
                                "plain values") from None
        run.hop((task_for_key(key, run.tasks), name, args))


class TaskScan:
    """``q.scan(...)``: iterate it for the task's entries, a page at a time; or return it un-read.

    A group's store holds the keys of all its tasks, so a scan of one task reads the whole group's range and
    keeps that task's keys: a query on every task would read each group ``tasks / groups`` times. When calls
    return their scans un-read and the combiner allows it (``Combiner.chunks``), :func:`run_calls` reads the
    scans of one range for all those tasks together, once, a page at a time.
    """

    __slots__ = ("range", "run", "task")

    def __init__(self, run: QueryRun, task: int, scan_range: tuple[str, Any, Any, tuple[Any, ...]]) -> None:
        self.run = run
        self.task = task
        #: (pstate, start, end, navigators)
        self.range = scan_range

    def __iter__(self) -> Iterator[Any]:
        for page in _pages(self.run, self.range, {self.task}):
            yield from page


def _pages(run: QueryRun, scan_range: tuple[str, Any, Any, tuple[Any, ...]], tasks: set[int]) -> Iterator[list[Any]]:
    """The entries of ``tasks`` (all of the group's: no key filter) in ``scan_range``, a page at a time."""
    pstate, start, end, navs = scan_range
    ntasks = run.tasks
    everyone = tasks >= set(range(run.group, ntasks, run.groups))

    def keep(k: Any) -> bool:
        return task_for_key(k, ntasks) in tasks

    after: bytes | None = None
    scanned = 0
    while True:
        run.check_deadline()
        page = run.store.pstate(pstate).scan_page(start, end, after, SCAN_PAGE, SCAN_PAGE_BYTES,
                                                  None if everyone else keep, navs)
        scanned += page.scanned
        yield page.items
        if page.after is None:
            if start is None and end is None and run.store.scanned_whole(pstate, scanned):
                run.flush_due = True  # (the old versions it stepped over cost a flush: pstate.hidden_versions)
            return
        after = page.after


def run_calls(run: QueryRun, calls: list[Call]) -> tuple[Any, list[Call]]:
    """Run ``calls`` (each on a task of ``run.group``) and the hops they make within the group; return the
    combined result and the hops to other groups."""
    combine = run.decl(run.root).combine
    acc: Any = None
    for c in calls:
        run.hop(c)
    done = 0
    fused: dict[tuple[str, Any, Any, tuple[Any, ...]], set[int]] = {}
    while run.local:
        run.check_deadline()
        task, name, args = run.local.popleft()
        assert task % run.groups == run.group, (task, run.group)
        done += 1
        if done > MAX_CALLS_PER_REQUEST:
            raise QueryFailed(run.root, task, f"more than {MAX_CALLS_PER_REQUEST} calls in one task group")
        decl = run.decl(name)
        try:
            result = decl.fn(QueryContext(run, task, name), *args)
            if isinstance(result, TaskScan) and combine.chunks and result.run is run:
                fused.setdefault(result.range, set()).add(result.task)  # read below, with the others
                continue
            if isinstance(result, Iterator | TaskScan) and not combine.streams:  # (read here, in the deadline)
                result = list(result)
            acc = combine.add(acc, result)
        except _INFRA:
            raise
        except TopologyError:
            raise
        except Exception as e:
            raise QueryFailed(name, task, f"{type(e).__name__}: {e}") from None
    for scan_range, tasks in fused.items():
        try:
            for items in _pages(run, scan_range, tasks):
                acc = combine.combine(acc, combine.lift(items) if items else None)
        except _INFRA:
            raise
        except TopologyError:
            raise
        except Exception as e:  # (a named filter's or the combiner's own error)
            raise QueryFailed(run.root, min(tasks), f"{type(e).__name__}: {e}") from None
    return acc, run.remote
