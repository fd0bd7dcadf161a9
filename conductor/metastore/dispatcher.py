"""The metastore's callback thread: kazoo's events run here, in order, never on kazoo's own threads.

kazoo calls listeners and watch functions on its own threads, where blocking
is forbidden: a state listener runs on the connection thread, which must keep
reading replies, and a blocking ZooKeeper call from a watch can deadlock the
client. So every user callback is handed to one :class:`Dispatcher` thread.

Its line is bounded, and nothing in it is ever lost:

* A **keyed** call (a watch's callback, the connection state) replaces the
  call of the same key still waiting, in its place in line. A watch reports
  the state of its znode *now*, so only the newest report matters: the callback
  runs once with it. So keyed calls take at most one slot per watch, however
  fast the znode changes, and their submitters never wait (kazoo's connection
  thread submits the connection state; a watch made on the dispatcher thread
  submits its first report from there).
* **Plain** calls (the worker's ISR changes, at most one in flight per group;
  its module syncs) take one slot each, at most ``capacity`` of them. A
  submitter finding the line full waits for room. That is safe on kazoo's
  watch thread: a ZooKeeper call the dispatcher makes meanwhile is completed
  by kazoo's connection thread, which never waits here. The dispatcher thread
  itself must never wait for its own line (asserted).

Connection states are coalesced by :func:`collapse_states`, which keeps what
the reactions to them need.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

log = logging.getLogger("millrace.metastore")

#: plain calls waiting at most (keyed ones add one per key: per watch, plus the connection state)
MAX_QUEUED_CALLS = 1024

SUSPENDED, LOST, CONNECTED = "SUSPENDED", "LOST", "CONNECTED"


class _Plain:
    """The key of one plain call: unique, so plain calls never replace each other."""

    __slots__ = ()


_STOP = _Plain()


def collapse_states(states: list[str]) -> list[str]:
    """Connection states not yet reacted to, shortened to at most three with the same reactions.

    The reactions (pause writes, step down, re-register and resume) need the
    first state, whether the session was lost in between and the last state:
    ``S C S C`` reacts as ``S C``, ``S L C S C`` as ``S L C``, ``C S C`` as ``C``.
    """
    if len(states) <= 2:
        return states
    out = [states[0]]
    if LOST in states[1:-1] and out[-1] != LOST:
        out.append(LOST)
    if states[-1] != out[-1]:
        out.append(states[-1])
    return out


class Dispatcher:
    """One thread running submitted calls in order; a bounded line, keyed calls coalesced (see the module)."""

    def __init__(self, name: str, capacity: int = MAX_QUEUED_CALLS) -> None:
        assert capacity >= 1, capacity
        self.capacity = capacity
        #: keyed calls that replaced a waiting one (for tests and status)
        self.coalesced = 0
        self._cond = threading.Condition()
        self._calls: OrderedDict[Hashable, Callable[[], None]] = OrderedDict()
        self._plain = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None], key: Hashable | None = None) -> None:
        """Run ``fn`` after every call already in line; a ``key`` replaces its waiting call instead."""
        with self._cond:
            if key is not None:
                if key in self._calls:
                    self._calls[key] = fn  # (keeps its place in line)
                    self.coalesced += 1
                    return
            else:
                while self._plain >= self.capacity and not self._stopping:
                    assert threading.current_thread() is not self._thread, (
                        "a metastore callback waits for room in its own dispatcher's line: it would wait forever")
                    self._cond.wait()
                self._plain += 1
                key = _Plain()
            self._calls[key] = fn
            self._cond.notify_all()

    def queued(self) -> int:
        """Calls waiting now (for tests and status)."""
        with self._cond:
            return len(self._calls)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._calls:
                    self._cond.wait()
                key, fn = self._calls.popitem(last=False)
                if key is _STOP:
                    return
                if isinstance(key, _Plain):
                    self._plain -= 1
                    self._cond.notify_all()
            try:
                fn()
            except Exception:
                log.exception("metastore callback failed")

    def stop(self) -> None:
        """Run what is in line, then end; calls submitted from now on never run."""
        with self._cond:
            self._stopping = True
            self._calls[_STOP] = lambda: None
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)
