"""A task thread shared by several replicas of one worker: the ``--task-threads`` option.

A replica with a thread of its own wakes once for every message it is sent,
so a worker with many task groups pays a thread wake-up and a GIL hand-off
per group for each burst of messages; at 8 groups per worker that was most
of the extra CPU per record of ``bench.topology`` (WordCount at 8 vs 2
groups). A shared task thread wakes once for a burst aimed at several
replicas and steps each of them in turn; a worker's Python work runs on one
core at a time anyway (the GIL).

What sharing costs: one replica's step waits for the others' steps on the
same thread, so a slow step (a long build) delays the other replicas on that
thread; a far-horizon install's writes do not: its replica is parked while an
install thread writes them (:mod:`conductor.worker.checkpoint_install`). Not their fsyncs: a pass runs each replica's
drain up to its fsync, hands that fsync to a helper thread while it goes on
with the next replica, and ends the drain (acks, applies, replies) once it is
over (``TaskThread._pass``; ``ReplicaHost.begin``, ``sync_ahead``,
``finish``). On the reference box three write+fdatasync of three files in a
row took 2.4-4.1 ms, against 0.43-0.57 ms at once: a disk takes concurrent
flushes together. Issue 32's two-hop topology replicates three groups at once
on every worker, whose thread fsynced one leader and two followers in series.
Each replica still has its own inbox, state machine, disk and faults: a
replica that fails stops alone.
``--task-threads 0`` gives each replica a *dedicated* task thread, the same
loop serving one replica, which ends with it.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from conductor.worker.pending_entry import PendingEntry
from conductor.worker.task_clock import MAX_SLEEP_MS, now_ms

if TYPE_CHECKING:
    from conductor.worker.replica_host import ReplicaHost

#: most fsyncs of one task thread's pass that run at once on helper threads (beside its own)
MAX_SYNC_THREADS = 4


class LoopWakes:
    """Wake-ups asked for on the worker's event loop, handed to the task threads once per loop iteration.

    The event loop posts a burst of work (the appends a read of the client streams brought, the peer frames of
    one read) one item at a time. Waking the task thread at the first item makes it drain that one alone while
    the loop still holds the GIL and reads the rest: more drains, flushes and replication frames per record,
    and a futex wake per drain. Deferred to the end of the loop's iteration (``call_soon``: after the callbacks
    of this pass), the task thread drains the whole burst, when the loop is about to release the GIL anyway.
    Only posts made on the loop thread are deferred (``bind`` names it); any other thread wakes at once.
    Bounded: a replica waits here at most once.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ident: int | None = None
        self._hosts: dict[ReplicaHost, None] = {}
        self._scheduled = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop's thread: posts made on it from now on are deferred."""
        self._loop = loop
        self._ident = threading.get_ident()

    def defer(self, host: ReplicaHost) -> bool:
        """Wake ``host``'s task thread at the end of this loop iteration; False when not on the loop thread."""
        if self._ident != threading.get_ident() or self._loop is None:
            return False
        if not self._scheduled:
            try:
                self._loop.call_soon(self._wake)
            except RuntimeError:  # the loop is closed: the caller wakes the thread itself
                return False
            self._scheduled = True
        self._hosts[host] = None
        return True

    def _wake(self) -> None:
        self._scheduled = False
        hosts, self._hosts = self._hosts, {}
        for h in hosts:
            h.task_thread.wake(h)


class TaskThread:
    """Runs the loops of the replicas added to it (see the module docstring)."""

    def __init__(self, name: str, dedicated: bool = False, wakes: LoopWakes | None = None) -> None:
        #: serves one replica and ends once it is released (closed, or never started)
        self.dedicated = dedicated
        #: the worker's deferred wake-ups (None: every wake is at once)
        self.wakes = wakes
        #: replicas posted to since the thread last looked, in that order. Bounded by construction: a replica
        #: is in it at most once, only while it is open (a closed one is not woken, and its release takes it
        #: out), and an open replica of this thread was claimed: it never holds more than ``load`` (asserted)
        self._ready: dict[ReplicaHost, None] = {}
        self._stopping = False
        #: replicas this thread runs, in the order they were added (the thread's own list)
        self._hosts: list[ReplicaHost] = []
        #: replicas given to this thread and not closed yet (`claim`ed, until they leave it)
        self._load = 0
        self._lock = threading.Lock()
        #: the thread sleeps on this doorbell (a C-level queue: a post costs no Python-level Condition, a
        #: wake-up no lock allocated per wait). A wake rings it when ``_ready`` goes from empty to not empty,
        #: ``stop`` once; the thread empties it before each take of ``_ready``, so it holds at most the rings
        #: of one take (one) and a stop's: bounded by construction
        self._doorbell: queue.SimpleQueue[None] = queue.SimpleQueue()
        #: helper threads for the fsyncs of a pass (started on the first pass that overlaps two)
        self._sync_pool: ThreadPoolExecutor | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    @property
    def load(self) -> int:
        """How many replicas run here: a worker gives a new replica to its least loaded task thread."""
        return self._load

    def claim(self) -> None:
        """A replica will run here (counted from before it is opened, so replicas opened together spread)."""
        with self._lock:
            self._load += 1

    def release(self, host: ReplicaHost | None = None) -> None:
        """A claimed replica (``host``, if it ever ran) stopped, or never opened (a dedicated thread ends with it)."""
        with self._lock:
            if host is not None:
                self._ready.pop(host, None)
            self._load -= 1
            assert self._load >= 0, self._load
            done = self.dedicated and self._load == 0
        if done:
            self.stop()

    def add(self, host: ReplicaHost) -> None:
        """Start running ``host`` (its ``start``)."""
        self.wake(host)

    def wake(self, host: ReplicaHost) -> None:
        """``host`` was posted something (after it went into its inbox): step it soon.

        The thread takes ``host`` out of the ready replicas before it drains that inbox, so a post it misses
        here was already drained.
        """
        if host in self._ready:
            return  # (a lock-free look: the thread takes the ready replicas before it drains their inboxes)
        with self._lock:
            if host in self._ready or host.closed.is_set():
                return
            assert len(self._ready) < self._load, (host.name, len(self._ready), self._load)
            ring = not self._ready
            self._ready[host] = None
        if ring:
            self._doorbell.put(None)

    def wake_soon(self, host: ReplicaHost) -> None:
        """``wake``, deferred to the end of the event loop's iteration when called on it (:class:`LoopWakes`)."""
        if self.wakes is None or not self.wakes.defer(host):
            self.wake(host)

    def stop(self) -> None:
        """End the thread once it has woken (the worker stops its replicas first)."""
        with self._lock:
            self._stopping = True
        self._doorbell.put(None)

    def _run(self) -> None:
        while True:
            now = now_ms()
            # Each replica's deadline, once per pass: a replica not posted to meanwhile keeps it (only its own
            # step changes it), so the pass below reads it rather than asking again.
            dues = {h: h.due_ms(now) for h in self._hosts}
            due = min(dues.values(), default=now + MAX_SLEEP_MS)
            if not self._ready and not self._stopping:  # (a lock-free look; a wake after it rings the bell)
                try:
                    self._doorbell.get(timeout=max(0.0, (due - now) / 1000))
                except queue.Empty:
                    pass
            while not self._doorbell.empty():  # rings this take answers (one consumer: no race)
                self._doorbell.get_nowait()
            with self._lock:
                if self._stopping:
                    if self._sync_pool is not None:
                        self._sync_pool.shutdown(wait=False)
                    return
                woken, self._ready = self._ready, {}
            for h in woken:
                if h not in self._hosts and not h.closed.is_set():
                    self._hosts.append(h)
            self._pass(woken, dues)

    def _pass(self, woken: dict[ReplicaHost, None], dues: dict[ReplicaHost, int]) -> None:
        """Step every replica that was posted to or is due, overlapping their fsyncs (see the module docstring).

        Each replica's drain runs up to its fsync (``begin``); when another replica is still to step in this
        pass, that fsync goes to a helper thread while this one goes on, and the drain ends (``finish``: acks,
        applies, replies) once its fsync is over, as soon as this thread sees it. A lone replica, or the last
        one, does its fsync here (the others' run meanwhile). A replica with client appends to build first ends
        the drains whose fsyncs are out: a build can take milliseconds, and their acks must not wait for it.
        """
        now = now_ms()
        order = self._pass_order(woken)
        # the last replica sure to step in this pass; one posted to meanwhile steps too if it comes later
        last = max((i for i, h in enumerate(order) if h in woken or h.stopping or dues.get(h, now) <= now),
                   default=-1)
        position = {h: i for i, h in enumerate(order)}
        syncing: list[tuple[ReplicaHost, Future[None]]] = []
        for i, h in enumerate(order):
            items = h.drain_inbox()
            if items or h.stopping or h in woken or dues.get(h, now) <= now:
                if syncing and items and isinstance(items[-1], PendingEntry):
                    # client appends (last in a drain) can take milliseconds to build (10,000 records: about
                    # 10 ms); the acks and replies of the drains whose fsyncs are out must not wait behind them
                    syncing = self._finish_synced(syncing, wait=True)
                if not h.begin(items):
                    self._drop(h)
                elif h.sync_owed and (i < last or any(position.get(r, -1) > i for r in list(self._ready))):
                    syncing.append((h, self._syncer().submit(h.sync_ahead)))
                elif not h.finish():
                    self._drop(h)
            if syncing and syncing[0][1].done():
                syncing = self._finish_synced(syncing)
        self._finish_synced(syncing, wait=True)

    def _finish_synced(self, syncing: list[tuple[ReplicaHost, Future[None]]], wait: bool = False
                       ) -> list[tuple[ReplicaHost, Future[None]]]:
        """End the drains whose fsync is over (``wait``: all of them, once it is); returns those still waiting."""
        left = []
        for h, fut in syncing:
            if not wait and not fut.done():
                left.append((h, fut))
                continue
            fut.result()  # (sync_ahead keeps its own error for finish)
            if not h.finish():
                self._drop(h)
        return left

    def _syncer(self) -> ThreadPoolExecutor:
        """The helper threads of this task thread's fsyncs, up to ``MAX_SYNC_THREADS`` started as needed. Its
        queue holds at most one fsync per replica of a pass, which waits for all of them before the next:
        bounded by the thread's load."""
        if self._sync_pool is None:
            self._sync_pool = ThreadPoolExecutor(MAX_SYNC_THREADS, thread_name_prefix=f"{self.thread.name}-fsync")
        return self._sync_pool

    def _drop(self, h: ReplicaHost) -> None:
        """``h`` stopped or failed: its disk is closed."""
        self._hosts.remove(h)
        self.release(h)

    def _pass_order(self, woken: dict[ReplicaHost, None]) -> list[ReplicaHost]:
        """The replicas to look at in this pass: those posted to first, in the order they were posted to, then
        the others (a deadline may be due).

        Not the order they were added in: a step can take a fsync or two, so with three replicas posted to
        at once the last in a fixed order waited for the others' fsyncs even when its message came first.
        On the path of a hop that was the wait that mattered: a destination leader's envelopes (the next
        replication round of a topology's tree) queued behind the follower steps of other groups posted to
        after them (issue 32).
        """
        present = set(self._hosts)
        first = [h for h in woken if h in present]
        if len(first) == len(self._hosts):
            return first
        return first + [h for h in self._hosts if h not in woken]


class TaskThreadPool:
    """A worker's task threads: ``size`` shared ones, started as replicas need them, or (``size`` 0) a
    dedicated one per replica (``--task-threads``)."""

    def __init__(self, node_id: str, size: int) -> None:
        assert size >= 0, size
        self.node_id = node_id
        self.size = size
        #: posts on the worker's event loop wake the task threads once per loop iteration (bound by the worker)
        self.wakes = LoopWakes()
        self._threads: list[TaskThread] = []
        self._lock = threading.Lock()

    def claim(self, name: str) -> TaskThread:
        """The task thread replica ``name`` will run on, claimed: the least loaded, or one dedicated to it,
        which ends with it."""
        if self.size == 0:
            dedicated = TaskThread(f"task-{name}", dedicated=True, wakes=self.wakes)
            dedicated.claim()
            return dedicated
        with self._lock:
            if len(self._threads) < self.size:
                self._threads.append(TaskThread(f"task-{self.node_id}-{len(self._threads)}", wakes=self.wakes))
            chosen = min(self._threads, key=lambda r: r.load)
            chosen.claim()
            return chosen

    def stop(self) -> None:
        """End the shared threads (the worker stopped its replicas first)."""
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.stop()
