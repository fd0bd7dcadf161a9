"""What a replica does when it fails: name the fault, quarantine damaged data, restart with backoff.

A replica's task thread stops on the first error that is not one request's
fault (see ``ReplicaHost._client_appends``). Three kinds, each with its cure:

* ``corrupt``: RocksDB or the replog found damaged data (:class:`CorruptStore`,
  :class:`CorruptLog`, a damaged epoch file). The replica's directory is moved
  aside (:func:`quarantine`, kept for the operator) and the replica reopens
  empty; an empty replica is not eligible, leaves the ISR and rebuilds from an
  intact leader (far-horizon catchup).
* ``disk_full``: ``ENOSPC`` from the replog or RocksDB. Nothing is damaged; the
  replica reopens from disk, with backoff, until space returns.
* ``internal``: anything else (a bug, an I/O error). The replica reopens from
  disk with backoff: a worker never keeps a dead replica.

Whatever the kind, a leader gives up leadership first (the worker's abdicate),
so another in-sync replica takes over within moments, not after a session
timeout.
"""

from __future__ import annotations

import errno
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from pstate.errors import CorruptStore, StorageError
from replog.errors import CorruptEpochFile, CorruptLog, CorruptStorageMarks

log = logging.getLogger("millrace.node")

CORRUPT = "corrupt"
DISK_FULL = "disk_full"
INTERNAL = "internal"
KINDS = (CORRUPT, DISK_FULL, INTERNAL)

#: exceptions that are the replica's, never one request's (they stop the task thread)
REPLICA_FAULTS = (CorruptStore, CorruptLog, CorruptEpochFile, CorruptStorageMarks, StorageError, OSError)

#: restart delays: doubling from FIRST to MAX; a replica that ran STABLE_S without a fault starts over
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 30.0
STABLE_S = 120.0
#: quarantined copies kept per group (older ones are deleted: a disk must not fill with them)
KEEP_QUARANTINED = 1


def fault_kind(exc: BaseException) -> str:
    """``corrupt``, ``disk_full`` or ``internal``, from the exception that stopped a replica."""
    if isinstance(exc, CorruptStore | CorruptLog | CorruptEpochFile | CorruptStorageMarks):
        return CORRUPT
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return DISK_FULL
    if isinstance(exc, StorageError) and ("No space left" in exc.reason or "ENOSPC" in exc.reason):
        return DISK_FULL
    return INTERNAL


def describe(exc: BaseException) -> str:
    """One line for logs, status and metrics."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:500]


@dataclass
class Fault:
    """The last fault of one replica on this worker, carried across its restarts."""

    kind: str
    reason: str
    at: float
    restarts: int = 0
    #: times damaged data was moved aside
    quarantined: int = 0

    def line(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.at))
        return f"{self.kind} at {when}: {self.reason} (restarted {self.restarts} time(s))"


class Backoff:
    """Restart delays of one replica: 0.5 s doubling to 30 s; back to 0.5 s after two quiet minutes."""

    def __init__(self) -> None:
        self._next = FIRST_DELAY_S
        self._last_fault = 0.0

    def delay(self, now: float) -> float:
        if now - self._last_fault > STABLE_S:
            self._next = FIRST_DELAY_S
        self._last_fault = now
        d, self._next = self._next, min(MAX_DELAY_S, self._next * 2)
        return d


def quarantine(group_dir: Path, quarantine_root: Path, name: str) -> Path | None:
    """Move a replica's directory aside (replog, epochs, state) so it reopens empty; where it went.

    The damaged files stay for the operator under ``quarantine_root``; only the
    newest :data:`KEEP_QUARANTINED` per group are kept.
    """
    if not group_dir.exists():
        return None
    quarantine_root.mkdir(parents=True, exist_ok=True)
    prefix = name.replace("/", "-") + "-"
    dest = quarantine_root / f"{prefix}{time.strftime('%Y%m%dT%H%M%S')}-{time.monotonic_ns() % 1_000_000:06d}"
    shutil.move(str(group_dir), str(dest))
    older = sorted(p for p in quarantine_root.iterdir() if p.name.startswith(prefix) and p != dest)
    for p in older[:max(0, len(older) - KEEP_QUARANTINED + 1)]:
        shutil.rmtree(p, ignore_errors=True)
    return dest
