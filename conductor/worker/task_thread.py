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

import queue
import threading
from typing import TYPE_CHECKING

from conductor.worker.task_clock import MAX_SLEEP_MS, now_ms

if TYPE_CHECKING:
    from conductor.worker.replica_host import ReplicaHost


class TaskThread:
    """Runs the loops of the replicas added to it (see the module docstring)."""

    def __init__(self, name: str, dedicated: bool = False) -> None:
        #: serves one replica and ends once it is released (closed, or never started)
        self.dedicated = dedicated
        #: replicas posted to since the thread last looked, each at most once (its ``woken`` flag), so the
        #: queue holds no more than this thread's replicas; None stops the thread
        self._ready: queue.SimpleQueue[ReplicaHost | None] = queue.SimpleQueue()
        #: replicas this thread runs, in the order they were added (the thread's own list)
        self._hosts: list[ReplicaHost] = []
        #: replicas given to this thread and not closed yet (`claim`ed, until they leave it)
        self._load = 0
        self._lock = threading.Lock()
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

    def release(self) -> None:
        """A claimed replica stopped, or never opened (a dedicated thread ends with it)."""
        with self._lock:
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

        The thread clears ``woken`` before it drains that inbox, so a post it misses here was already drained.
        """
        if not host.woken:
            host.woken = True
            self._ready.put(host)

    def stop(self) -> None:
        """End the thread once it has woken (the worker stops its replicas first)."""
        self._ready.put(None)

    def _run(self) -> None:
        while True:
            now = now_ms()
            due = min((h.due_ms(now) for h in self._hosts), default=now + MAX_SLEEP_MS)
            woken: set[ReplicaHost] = set()
            try:
                got = self._ready.get(timeout=max(0.0, (due - now) / 1000))
                while True:
                    if got is None:
                        return
                    got.woken = False
                    woken.add(got)
                    got = self._ready.get_nowait()
            except queue.Empty:
                pass
            for h in woken:
                if h not in self._hosts and not h.closed.is_set():
                    self._hosts.append(h)
            now = now_ms()
            for h in list(self._hosts):
                items = h.drain_inbox()
                if not items and not h.stopping and h not in woken and h.due_ms(now) > now:
                    continue
                if not h.step(items):  # stopped or failed: its disk is closed
                    self._hosts.remove(h)
                    self.release()
