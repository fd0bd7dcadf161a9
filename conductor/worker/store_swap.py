"""A far-horizon install's new store, made ready off the task thread and swapped in on it (:class:`PreparedStore`).

A follower's install used to do all of its I/O on its task thread, which
every replica sharing that thread waits for (``--task-threads`` is 1 by
default): verifying and linking the fetched files, their fsyncs, and above
all opening RocksDB on them (17-25 ms, 40 on a loaded 2-core box, measured
in session 13 against the workers' logs). None of that touches the replica:
:func:`pstate.checkpoint.stage_install` builds a versioned directory beside
the store that nothing points at yet, and the new store is opened there, all
in the copy's own thread (:meth:`PreparedStore.prepare`). The task thread
keeps what orders the install against the replica's other steps, unchanged
(``ReplicaHost._start_install``; its writes on an install thread while the replica is
parked, :mod:`conductor.worker.checkpoint_install`): the refusal check, the epoch file, the
``installing`` mark, the old store's close where RocksDB names its files by
the path the swap redirects, the atomic swap (``rename(2)`` of a symlink) and
handing the opened store over, then the log reset and the marks. What is no
longer needed goes off the task thread again (:meth:`PreparedStore.finish`):
the old directory, and the old store when it was opened at its own versioned
directory rather than through the path the swap redirects.

A crash at any point leaves what the old order left: before the swap, the
store behind the replica's path is the old one (a versioned directory
nobody points at may be left, as a crash inside the old install left it);
after it, the new one, with the ``installing`` mark set until the log reset
(:func:`replog.eligibility.check_storage`).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from pstate import TaskGroupStore
from pstate.checkpoint import Checked, Manifest, stage_install

log = logging.getLogger("millrace.far_horizon")

_PENDING, _CLAIMED, _INSTALLED, _DROPPED = "pending", "claimed", "installed", "dropped"


class PreparedStore:
    """A fetched checkpoint verified into a versioned directory beside a replica's store, its RocksDB open.

    Not in use until the task thread :meth:`claim`\\ s it (before its first
    durable step) and swaps it in (``ReplicaStore.install_prepared``).
    Whichever thread handed it over calls :meth:`finish` once the task
    thread answered (or never will): it closes and deletes what is not in
    use, off the task thread. The state (pending, claimed, installed,
    dropped) is under a lock, so a hand-over that times out cannot delete a
    store the task thread is swapping in.
    """

    def __init__(self, target: str, store: TaskGroupStore, manifest: Manifest) -> None:
        self.target = target
        self.store = store
        self.manifest = manifest
        self._lock = threading.Lock()
        self._state = _PENDING
        #: what the swap retired, closed and deleted by :meth:`finish` (the old store when it was not closed first)
        self._retired: tuple[TaskGroupStore | None, str | None] = (None, None)

    @classmethod
    def prepare(cls, staging: Path, manifest: Manifest, dest: Path, checked: Checked,
                pstates: Mapping[str, Any], depots: Iterable[str]) -> PreparedStore:
        """Any thread but the task thread's: verify and link the files beside ``dest`` and open the store there.

        ``dest`` is not touched, so the replica goes on using its store meanwhile.
        """
        target = stage_install(staging, manifest, dest, checked)
        try:
            store = TaskGroupStore(target, pstates, depots)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        return cls(target, store, manifest)

    @property
    def state(self) -> str:
        return self._state

    def claim(self) -> bool:
        """Task thread, before it swaps: False when the hand-over gave up on it (then it is not installed)."""
        with self._lock:
            if self._state != _PENDING:
                return False
            self._state = _CLAIMED
            return True

    def installed(self, old_store: TaskGroupStore | None, old_dir: str | None) -> None:
        """Task thread: the store is in use; ``old_store`` (if not closed yet) and ``old_dir`` are for :meth:`finish`."""
        with self._lock:
            assert self._state == _CLAIMED, self._state
            self._state = _INSTALLED
            self._retired = (old_store, old_dir)

    def cancel(self) -> bool:
        """The hand-over gives up: True when the task thread had not claimed it (it never will now)."""
        with self._lock:
            if self._state == _PENDING:
                self._state = _DROPPED
            return self._state == _DROPPED

    def finish(self) -> None:
        """Off the task thread, once it answered: close and delete what is not in use (the prepared store, if it
        was not installed; else whatever the swap retired). Errors are logged: the replica goes on either way."""
        with self._lock:
            if self._state in (_PENDING, _CLAIMED):  # (claimed: the task thread failed before the swap)
                self._state = _DROPPED
            if self._state == _DROPPED:
                retired: tuple[TaskGroupStore | None, str | None] = (self.store, self.target)
            else:
                retired, self._retired = self._retired, (None, None)
        store, directory = retired
        try:
            if store is not None:
                store.discard()  # (its directory goes next: no atomic flush, which would hold the GIL)
        except Exception:
            log.exception("closing the store a far-horizon install retired (%s)", store.path if store else "")
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def hand_over(prepared: PreparedStore, post: Callable[[Future[str | None]], None], timeout_s: float) -> str | None:
    """Ask the task thread to install ``prepared`` (``post(done)``), wait for its answer, then :meth:`finish`.

    Returns None when installed, else why not. A task thread that has not
    claimed the store within ``timeout_s`` never will (it is cancelled, and
    the wait raises TimeoutError); one that has is waited for (an install is
    a few short steps).
    """
    done: Future[str | None] = Future()
    try:
        post(done)
        try:
            return done.result(timeout=timeout_s)
        except FutureTimeout:
            if prepared.cancel():
                raise
            return done.result()
    finally:
        prepared.finish()


def closes_after_swap(path: str, dest: Path) -> bool:
    """Whether a store opened at ``path`` may be closed after the swap at ``dest``: RocksDB names every file it
    writes by the path it was opened at, and the swap redirects ``dest`` (closed before the swap, then)."""
    return os.path.abspath(path) != os.path.abspath(dest)
