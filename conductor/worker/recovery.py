"""How a worker recovers a replica that failed or could not open (:class:`ReplicaRecovery`).

A failed replica gives up leadership and the ISR in one CAS (``replog.election.abdicate``), quarantines
damaged data, and is reopened from disk with backoff; a replica reopened empty is rebuilt from the leader
like any replica that lost its storage (``replog.eligibility``). The worker composes it with what it needs:
the data directory, the metastore, the table of local modules, and a way to open a replica from disk.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from conductor.metastore import Metastore, MetastoreError, VersionConflict
from conductor.worker.hosted import HostedReplica
from conductor.worker.replica_faults import CORRUPT, Fault, describe, fault_kind, quarantine
from conductor.worker.replica_host import ReplicaHost
from conductor.worker.runtime import LocalModules, ModuleRuntime
from replog.election import abdicate
from replog.messages import MetastoreChanged

log = logging.getLogger("millrace.node")

#: how often a reopened replica's group state is read again while ZooKeeper is away
STATE_RETRY_S = 0.5
#: opens a hosted replica from its directory (its host not started): ``Worker.open_replica``
OpenReplica = Callable[[ModuleRuntime, HostedReplica], ReplicaHost]


class ReplicaRecovery:
    """Restarts failed replicas and opens those that could not open (see the module docstring)."""

    def __init__(self, node_id: str, data_dir: Path, metastore: Metastore, modules: LocalModules,
                 open_replica: OpenReplica) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        self.metastore = metastore
        self.modules = modules
        self._open_replica = open_replica

    def quarantine(self, rt: ModuleRuntime, rec: HostedReplica, reason: str) -> None:
        """Move a replica's damaged data aside (it reopens empty and is rebuilt) and say so, once, clearly."""
        fault = rec.fault
        if fault is None or fault.kind != CORRUPT:
            fault = rec.fault = Fault(CORRUPT, reason, time.time(), fault.restarts if fault else 0,
                                      fault.quarantined if fault else 0)
        dest = quarantine(self.data_dir / rt.spec.name / str(rec.group), self.data_dir / "_quarantine", rec.name)
        fault.quarantined = fault.quarantined + 1
        log.error("%s: DAMAGED DATA on node %s (%s); moved the replica's files to %s and rebuilding it from an "
                  "intact replica (far-horizon catchup); the damaged copy is kept for inspection", rec.name,
                  self.node_id, fault.reason, dest)

    def on_replica_fault(self, host: ReplicaHost) -> None:
        """A replica's task thread stopped on a fault: give up leadership now, then restart it from disk.

        Runs on the failed replica's task thread, before it closes its disk; the
        restart waits for that and its backoff on a thread of its own, so a
        worker never keeps a dead replica.
        """
        rt = self.modules.get(host.module)
        rec = rt.hosted.get(host.group) if rt is not None else None
        if rt is None or rec is None or rec.host is not host:
            return  # closed meanwhile (module destroyed, worker stopping)
        assert host.fault is not None
        old = rec.fault
        fault = rec.fault = dataclasses.replace(host.fault, restarts=old.restarts if old else 0,
                                                quarantined=old.quarantined if old else 0)
        self._abdicate(host, fault)
        delay = rec.backoff.delay(time.monotonic())
        log.warning("%s: restarting the replica from disk in %.1fs", host.name, delay)
        # (the fault travels as words: a live exception's frames would hold RocksDB handles open)
        timer = threading.Timer(delay, self._restart_replica, args=(rt, rec, host))
        timer.daemon = True
        timer.start()

    def _restart_replica(self, rt: ModuleRuntime, rec: HostedReplica, failed: ReplicaHost) -> None:
        """Reopen a failed replica from disk (after quarantining damaged data); on failure, try again later.

        The one seam of recovery: quarantine + reopen. A replica reopened empty
        is rebuilt from the leader like any replica that lost its storage.
        """
        if threading.current_thread() is not failed.thread:
            failed.closed.wait(timeout=60)  # its disk is closed when its task thread lets go of it
        if self.metastore.closed or rec.host is not failed:
            return
        if failed.catchup is not None:
            failed.catchup.stop()
        try:
            if failed.fault is not None and failed.fault.kind == CORRUPT:
                self.quarantine(rt, rec, failed.fault.reason)
            host = self._open_replica(rt, rec)
        except Exception as e:  # the disk is still full, or worse: the same backoff, again
            failed.fault = Fault(fault_kind(e), describe(e), time.time())
            del e
            log.error("%s: reopening the replica failed (%s); trying again", failed.name, failed.fault.reason)
            self.on_replica_fault(failed)
            return
        self._start_reopened(rt, rec, host, failed)

    def _start_reopened(self, rt: ModuleRuntime, rec: HostedReplica, host: ReplicaHost,
                        replacing: ReplicaHost | None) -> None:
        """Put a reopened replica in place of ``replacing`` (None: of none), start it and tell it the group's state."""
        fault = rec.fault
        assert fault is not None, rec.name  # (what made it reopen)
        fault.restarts += 1
        if not self.modules.place(rt, rec, host, replacing):
            host.store.close()  # (closed meanwhile: module destroyed, worker stopping)
            host.log.close()
            host.task_thread.release(host)  # (never started: its task thread never saw it)
            return
        host.start()
        self._tell_state(rt, rec, host)
        log.warning("%s: replica restarted from disk (restart %d; last fault %s)", host.name, fault.restarts,
                    fault.line())

    def _tell_state(self, rt: ModuleRuntime, rec: HostedReplica, host: ReplicaHost) -> None:
        """Post the group's state to a reopened replica; with ZooKeeper away, again every :data:`STATE_RETRY_S`.

        The group watch reports changes only (kazoo calls it again after a new session only if the znode's
        version moved), so a replica reopened while the session was lost, in a group whose state did not change,
        never learnt its leader and never caught up (campaign seed 3604: a disk-full restart at the moment the
        worker's session expired).
        """
        if self.metastore.closed or rec.host is not host or host.closed.is_set():
            return
        try:
            st, _version = self.metastore.groups.get(rt.spec.name, rec.group)
        except MetastoreError:
            timer = threading.Timer(STATE_RETRY_S, self._tell_state, args=(rt, rec, host))
            timer.daemon = True
            timer.start()
            return
        host.post(MetastoreChanged(st))

    def open_later(self, rt: ModuleRuntime, rec: HostedReplica, kind: str, reason: str) -> None:
        """A replica that could not open (a full disk, damage the quarantine could not move) is tried again."""
        old = rec.fault
        rec.fault = Fault(kind, reason, time.time(), old.restarts if old else 0, old.quarantined if old else 0)
        delay = rec.backoff.delay(time.monotonic())
        log.error("%s: the replica could not open (%s); trying again in %.1fs", rec.name, rec.fault.reason, delay)
        timer = threading.Timer(delay, self._open_missing, args=(rt, rec))
        timer.daemon = True
        timer.start()

    def _open_missing(self, rt: ModuleRuntime, rec: HostedReplica) -> None:
        if self.metastore.closed or rec.host is not None:
            return
        try:
            fault = rec.fault
            if fault is not None and fault.kind == CORRUPT:  # (a damaged replog: reopening it fails the same way)
                self.quarantine(rt, rec, fault.reason)
            host = self._open_replica(rt, rec)
        except Exception as e:
            self.open_later(rt, rec, fault_kind(e), describe(e))
            return
        self._start_reopened(rt, rec, host, None)

    def _abdicate(self, host: ReplicaHost, fault: Fault) -> None:
        """A failed replica leaves the ISR and, if it led, gives up leadership: one CAS on the group znode.

        The successor is elected in the same CAS (``replog.election.abdicate``),
        instead of after this worker's session (which stays up) times out. A
        follower is left to its leader, which moves it to the OSR when it stops
        confirming.
        """
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
            rec = rt.hosted.get(group) if rt is not None else None
            old = rec.host if rec is not None else None
            if rt is None or rec is None or old is None:
                return
            log.error("%s: reopening the replica%s: %s", old.name, " with its storage discarded" if discard_storage
                      else "", why)
            old.stop()
            if old.thread.is_alive():
                old.closed.wait()
            if discard_storage:
                self.quarantine(rt, rec, why)
            if not self.modules.is_open(rt):
                return  # closed or redeployed meanwhile
            if rec.fault is None:
                rec.fault = Fault("internal" if not discard_storage else CORRUPT, why, time.time())
            self._start_reopened(rt, rec, self._open_replica(rt, rec), old)

        thread = threading.Thread(target=run, name=f"reopen-{module}/{group}", daemon=True)
        thread.start()
        return thread
