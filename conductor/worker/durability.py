"""When a replica's replog writes reach the disk: the two durability modes of ``replication.fsync``.

``always`` (the default contract): every drain's writes are fsynced before anything written is acknowledged
(group commit: one fsync per drain), and the storage marks with them: written beside the log's fsync, claiming
the flush in flight, and synced on another thread while the log's fsync runs (replog.eligibility's unsure
storage says why that is enough; docs/data-on-disk.md, "The storage marks"). ``interval``: what a drain
wrote is acknowledged once it is in the page cache, which a killed process does not lose; the log is fsynced
at most ``replication.flush.ms`` later, so only a power loss (or a kernel crash) of the machine can lose
acknowledged entries, and only on this replica: an entry is applied once every ISR member holds it, so the
others keep it. Before the first such acknowledgement the storage marks say so (``volatile``, with the
machine's boot id, in a synced write): a replica whose machine restarted without a clean close then counts
as lost storage at open (replog.eligibility's page-cache rule) and rebuilds from the leader instead of
being elected (KIP-966's unclean-shutdown rule). docs/replication.md, "Durability modes", says what each
mode survives.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from pathlib import Path

from conductor.worker.lazy_pool import LazyPool
from replog.config import ReplicationConfig
from replog.eligibility import UNKNOWN_BOOT
from replog.log import Log
from replog.marks_file import MarksFile

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def machine_boot() -> int:
    """An id of the running kernel's boot (Linux's random boot id, 64 bits of it): it changes with every
    restart of the machine, never with a restart of the process. UNKNOWN_BOOT where the kernel does not say
    (then the page-cache rule counts every unclean restart in interval mode as a power loss)."""
    try:
        return uuid.UUID(BOOT_ID.read_text().strip()).int & ((1 << 64) - 1) or 1
    except (OSError, ValueError):
        return UNKNOWN_BOOT


#: threads syncing storage marks beside the log's fsync, shared by a worker's replicas. Each flush waits for its
#: own marks' sync before it returns, so at most one per flush in progress is queued: one per task thread plus its
#: helper threads (conductor.worker.task_thread.MAX_SYNC_THREADS), a bound the pool's queue inherits
MARKS_SYNC_THREADS = 8
_marks_sync_pool = LazyPool(MARKS_SYNC_THREADS, "millrace-marks-sync")


class LogDurability:
    """One replica's fsync placement (task thread only): :meth:`written` after a drain wrote entries, before
    they are reported flushed; :meth:`sync_if_due` on every drain; :attr:`next_sync_ms` for the wake-up."""

    def __init__(self, log: Log, marks: MarksFile, boot: int) -> None:
        self._log = log
        self._marks = marks
        self._boot = boot
        #: interval mode: when written entries must be fsynced at the latest (None: nothing unsynced)
        self.next_sync_ms: int | None = None

    def written(self, config: ReplicationConfig, now_ms: int) -> tuple[float, float]:
        """Make what the log holds acknowledgeable under ``config``'s mode; returns the seconds spent in the
        replog's fsync and then waiting for the storage marks' (which runs beside it)."""
        marks = self._marks.current
        assert marks is not None, "marks are saved at open, before anything is written"
        acked = self._log.end_offset - 1
        if config.acks_from_page_cache:
            if not marks.volatile or marks.boot != self._boot:
                self._marks.update(volatile=True, boot=self._boot)  # synced: before the first page-cache ack
            self._marks.update(acked=acked, sync=False)
            if self.next_sync_ms is None:
                self.next_sync_ms = now_ms + config.flush_ms
            return 0.0, 0.0
        t0 = time.perf_counter()
        # The marks claim this flush (its last offset), acked covering the flushes reported before it; once both
        # fsyncs returned, everything written so far is on disk, page-cache acknowledgements of an earlier
        # interval mode included: the storage no longer depends on the page cache.
        self._marks.save(replace(marks, acked=min(self._log.flushed_offset - 1, acked), claimed=acked,
                                 volatile=False), sync=False)
        marks_synced = _marks_sync_pool.get().submit(self._marks.sync)
        try:
            self._log.flush()
        finally:
            t1 = time.perf_counter()
            marks_synced.result()  # (never left running: nothing else may touch the marks meanwhile)
        self.next_sync_ms = None
        return t1 - t0, time.perf_counter() - t1

    def sync_if_due(self, now_ms: int) -> bool:
        """Interval mode: fsync the log and the marks once the oldest unsynced write is ``flush.ms`` old."""
        if self.next_sync_ms is None or now_ms < self.next_sync_ms:
            return False
        self._log.flush()
        self._marks.update()  # syncs the acknowledged mark written to the page cache since
        self.next_sync_ms = None
        return True
