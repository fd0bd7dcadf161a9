"""A task thread shared by several replicas of one worker: the ``--task-threads`` option.

A replica with a thread of its own wakes once for every message it is sent,
so a worker with many task groups pays a thread wake-up and a GIL hand-off
per group for each burst of messages; at 8 groups per worker that was most
of the extra CPU per record of ``bench.topology`` (WordCount at 8 vs 2
groups). A shared task thread wakes once for a burst aimed at several
replicas and steps each of them in turn; a worker's Python work runs on one
core at a time anyway (the GIL).

What sharing costs: one replica's step waits for the others' steps on the
same thread, fsyncs included, so a slow step (a far-horizon install, a long
fsync) delays the other replicas on that thread. Each replica still has its
own inbox, state machine, disk and faults: a replica that fails stops alone.
``--task-threads 0`` gives each replica a *dedicated* task thread, the same
loop serving one replica, which ends with it.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import TYPE_CHECKING

from conductor.worker.task_clock import MAX_SLEEP_MS, now_ms

if TYPE_CHECKING:
    from conductor.worker.replica_host import ReplicaHost


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
                    return
                woken, self._ready = self._ready, {}
            for h in woken:
                if h not in self._hosts and not h.closed.is_set():
                    self._hosts.append(h)
            now = now_ms()
            for h in list(self._hosts):
                items = h.drain_inbox()
                if not items and not h.stopping and h not in woken and dues.get(h, now) > now:
                    continue
                if not h.step(items):  # stopped or failed: its disk is closed
                    self._hosts.remove(h)
                    self.release(h)


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
