"""How a worker recovers a replica that failed or could not open (:class:`ReplicaRecovery`, a part of ``Worker``).

A failed replica gives up leadership and the ISR in one CAS (``replog.election.abdicate``), quarantines
damaged data, and is reopened from disk with backoff; a replica reopened empty is rebuilt from the leader
like any replica that lost its storage (``replog.eligibility``). Kept apart from ``worker.py`` so each file
has one reason to change: the worker's lifecycle and watches there, recovery here.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from conductor.metastore import Metastore, MetastoreError, VersionConflict
from conductor.worker.replica_faults import CORRUPT, Backoff, Fault, describe, fault_kind, quarantine
from conductor.worker.replica_host import ReplicaHost
from conductor.worker.runtime import ModuleRuntime
from replog.election import abdicate
from replog.messages import MetastoreChanged

log = logging.getLogger("millrace.node")


class ReplicaRecovery:
    """The recovery half of ``Worker``: what it needs of the worker is declared below."""

    node_id: str
    data_dir: Path
    metastore: Metastore | None
    modules: dict[str, ModuleRuntime]
    _lock: threading.Lock

    if TYPE_CHECKING:
        def _open_replica(self, rt: ModuleRuntime, g: int) -> ReplicaHost: ...

    def _quarantine(self, rt: ModuleRuntime, g: int, reason: str) -> None:
        """Move a replica's damaged data aside (it reopens empty and is rebuilt) and say so, once, clearly."""
        name = f"{rt.spec.name}/{g}"
        fault = rt.faults.get(g)
        if fault is None or fault.kind != CORRUPT:
            fault = rt.faults[g] = Fault(CORRUPT, reason, time.time(), fault.restarts if fault else 0,
                                         fault.quarantined if fault else 0)
        dest = quarantine(self.data_dir / rt.spec.name / str(g), self.data_dir / "_quarantine", name)
        fault.quarantined = fault.quarantined + 1
        log.error("%s: DAMAGED DATA on node %s (%s); moved the replica's files to %s and rebuilding it from an "
                  "intact replica (far-horizon catchup); the damaged copy is kept for inspection", name,
                  self.node_id, fault.reason, dest)

    def _on_replica_fault(self, host: ReplicaHost) -> None:
        """A replica's task thread stopped on a fault: give up leadership now, then restart it from disk.

        Runs on the failed replica's task thread, before it closes its disk; the
        restart waits for that and its backoff on a thread of its own, so a
        worker never keeps a dead replica.
        """
        rt = self.modules.get(host.module)
        if rt is None or rt.hosts.get(host.group) is not host:
            return  # closed meanwhile (module destroyed, worker stopping)
        assert host.fault is not None
        old = rt.faults.get(host.group)
        fault = rt.faults[host.group] = dataclasses.replace(host.fault, restarts=old.restarts if old else 0,
                                                            quarantined=old.quarantined if old else 0)
        self._abdicate(host, fault)
        delay = rt.backoffs.setdefault(host.group, Backoff()).delay(time.monotonic())
        log.warning("%s: restarting the replica from disk in %.1fs", host.name, delay)
        # (the fault travels as words: a live exception's frames would hold RocksDB handles open)
        timer = threading.Timer(delay, self._restart_replica, args=(rt, host))
        timer.daemon = True
        timer.start()

    def _restart_replica(self, rt: ModuleRuntime, failed: ReplicaHost) -> None:
        """Reopen a failed replica from disk (after quarantining damaged data); on failure, try again later.

        The one seam of recovery: quarantine + reopen. A replica reopened empty
        is rebuilt from the leader like any replica that lost its storage.
        """
        if threading.current_thread() is not failed.thread:
            failed.closed.wait(timeout=60)  # its disk is closed when its task thread lets go of it
        if self.metastore is None or self.metastore.closed or rt.hosts.get(failed.group) is not failed:
            return
        g = failed.group
        if failed.catchup is not None:
            failed.catchup.stop()
        try:
            if failed.fault is not None and failed.fault.kind == CORRUPT:
                self._quarantine(rt, g, failed.fault.reason)
            host = self._open_replica(rt, g)
        except Exception as e:  # the disk is still full, or worse: the same backoff, again
            failed.fault = Fault(fault_kind(e), describe(e), time.time())
            del e
            log.error("%s: reopening the replica failed (%s); trying again", failed.name, failed.fault.reason)
            self._on_replica_fault(failed)
            return
        host.stats.update(failed.stats)
        self._start_reopened(rt, g, host, failed)

    def _start_reopened(self, rt: ModuleRuntime, g: int, host: ReplicaHost, replacing: ReplicaHost | None) -> None:
        """Put a reopened replica in place of ``replacing`` (None: of none), start it and tell it the group's state."""
        assert self.metastore is not None
        fault = rt.faults[g]
        fault.restarts += 1
        with self._lock:
            if rt.hosts.get(g) is not replacing or self.modules.get(rt.spec.name) is not rt:
                host.store.close()  # (closed meanwhile: module destroyed, worker stopping)
                host.log.close()
                host.task_thread.release()  # (never started: its task thread never saw it)
                return
            rt.hosts[g] = host
        host.start()
        try:
            st, _version = self.metastore.groups.get(rt.spec.name, g)
            host.post(MetastoreChanged(st))
        except MetastoreError:
            pass  # the group watch delivers it when ZooKeeper is back
        log.warning("%s: replica restarted from disk (restart %d; last fault %s)", host.name, fault.restarts,
                    fault.line())

    def _open_later(self, rt: ModuleRuntime, g: int, kind: str, reason: str) -> None:
        """A replica that could not open (a full disk, damage the quarantine could not move) is tried again."""
        old = rt.faults.get(g)
        rt.faults[g] = Fault(kind, reason, time.time(), old.restarts if old else 0, old.quarantined if old else 0)
        delay = rt.backoffs.setdefault(g, Backoff()).delay(time.monotonic())
        log.error("%s/%d: the replica could not open (%s); trying again in %.1fs", rt.spec.name, g,
                  rt.faults[g].reason, delay)
        timer = threading.Timer(delay, self._open_missing, args=(rt, g))
        timer.daemon = True
        timer.start()

    def _open_missing(self, rt: ModuleRuntime, g: int) -> None:
        if self.metastore is None or self.metastore.closed or g in rt.hosts:
            return
        try:
            fault = rt.faults.get(g)
            if fault is not None and fault.kind == CORRUPT:  # (a damaged replog: reopening it fails the same way)
                self._quarantine(rt, g, fault.reason)
            host = self._open_replica(rt, g)
        except Exception as e:
            self._open_later(rt, g, fault_kind(e), describe(e))
            return
        self._start_reopened(rt, g, host, None)

    def _abdicate(self, host: ReplicaHost, fault: Fault) -> None:
        """A failed replica leaves the ISR and, if it led, gives up leadership: one CAS on the group znode.

        The successor is elected in the same CAS (``replog.election.abdicate``),
        instead of after this worker's session (which stays up) times out. A
        follower is left to its leader, which moves it to the OSR when it stops
        confirming.
        """
        assert self.metastore is not None
        ms = self.metastore
        reason = f"{fault.kind}: {fault.reason}"
        for _ in range(5):
            try:
                st, version = ms.groups.get(host.module, host.group)
                new = abdicate(st, self.node_id, ms.nodes.sessions(), ms.drains.nodes())
                if new is None:
                    return
                ms.groups.cas(host.module, host.group, dataclasses.replace(new, placement=st.replicas), version)
                log.warning("%s: gave up leadership because the replica failed (%s): epoch %d -> %d, leader %s, "
                            "ISR %s", host.name, reason, st.epoch, new.epoch, new.leader or "none (elected next)",
                            list(new.isr))
                return
            except VersionConflict:
                continue
            except MetastoreError as e:
                log.warning("%s: could not give up leadership (%s); the session timeout moves it", host.name, e)
                return

    def reopen_replica(self, module: str, group: int, discard_storage: bool, why: str) -> threading.Thread:
        """Close one replica and open it again from its directory, in a thread of its own (returned).

        With ``discard_storage`` the group's directory is quarantined first (moved
        aside), so the replica reopens empty; either way the open-time check
        (``replog.eligibility``) finds what it lost, and the replica leaves the
        ISR before serving anything and rebuilds from the leader.
        """
        def run() -> None:
            rt = self.modules.get(module)
            old = rt.hosts.get(group) if rt is not None else None
            if rt is None or old is None:
                return
            log.error("%s: reopening the replica%s: %s", old.name, " with its storage discarded" if discard_storage
                      else "", why)
            old.stop()
            if old.thread.is_alive():
                old.closed.wait()
            if discard_storage:
                self._quarantine(rt, group, why)
            if self.modules.get(module) is not rt:
                return  # closed or redeployed meanwhile
            rt.faults.setdefault(group, Fault("internal" if not discard_storage else CORRUPT, why, time.time()))
            self._start_reopened(rt, group, self._open_replica(rt, group), old)

        thread = threading.Thread(target=run, name=f"reopen-{module}/{group}", daemon=True)
        thread.start()
        return thread
