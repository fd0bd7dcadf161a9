"""A worker's side of a reassignment (``replog/reassignment.py``): host the replicas the group znode adds here.

The conductor starts a plan by writing the group znode with the target plus
the original replicas. A worker the znode now lists, and which hosts no live
replica of the group, opens an empty one (:meth:`ReplicaMembership.on_group`):
it follows the leader and catches up by the existing paths (a far-horizon
copy of the leader's checkpoint when what it lacks is gone from the leader's
log, then near-horizon replay), and the leader admits it to the ISR by its
usual rejoin rule. Its store is not created until first used
(``ReplicaStore.deferred``): a far-horizon install replaces it before, in the
common case. A replica the znode stops listing says ``Removed`` itself
(the state machine's action): its host stops and deletes its directory, and
a later plan that adds the worker back gets a new, empty replica here.

A replica the plan's last write *retired* instead (``replog/retirement.py``:
the znode lists it among the retired copies) stops but keeps its directory.
Once a znode lists this worker neither as a replica nor as retired (the kept
replicas reconfirmed their storage: released), the directory is deleted here;
if the group takes the copy back (a replica again), the replica is opened
from that directory, checked at open like any storage.

A worker that was down while a plan removed it finds, at its next start,
directories of groups whose znode no longer lists it (as a replica, or as a
retired copy): they are deleted (:meth:`ReplicaMembership.sweep_unlisted`);
their data is of an incarnation the group forgot, and a re-added replica must
start empty.
"""

from __future__ import annotations

import functools
import logging
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from conductor.metastore import GroupNotFound, Metastore, MetastoreError
from conductor.metastore.module_spec import REASSIGN_COPY_BYTES_PER_S
from conductor.worker.hosted import HostedReplica
from conductor.worker.replica_faults import describe
from conductor.worker.replica_host import ReplicaHost
from conductor.worker.runtime import LocalModules, ModuleRuntime
from conductor.worker.throttle import CopyBudget, CopyPacing
from pstate.checkpoint import remove_stale_versions
from replog.messages import GroupState, MetastoreChanged
from replog.retirement import retired_names

log = logging.getLogger("millrace.node")

#: how often an added replica looks again whether a removed predecessor on this worker closed (its data deleted)
REMOVED_CLOSE_POLL_S = 0.2


class OpenAdded(Protocol):
    """Opens a replica added here, not started: ``Worker.open_replica``."""

    def __call__(self, rt: ModuleRuntime, rec: HostedReplica, *, defer_empty: bool) -> ReplicaHost: ...


class ReplicaMembership:
    """Opens replicas the group znode adds to this worker; a collaborator of the worker (any thread)."""

    def __init__(self, node_id: str, data_dir: Path, metastore: Metastore, modules: LocalModules,
                 open_replica: OpenAdded) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        self.metastore = metastore
        self.modules = modules
        self._open_replica = open_replica
        #: (module, group) of the local replicas a reassignment is adding (their copies are throttled)
        self._adding: set[tuple[str, int]] = set()

    def on_group(self, rt: ModuleRuntime, g: int, st: GroupState) -> None:
        """The group znode changed: keep the local record's placement current, open a replica added here."""
        rec = rt.hosted.get(g)
        if self.node_id in st.adding:
            self._adding.add((rt.spec.name, g))
        else:
            self._adding.discard((rt.spec.name, g))
        if self.node_id not in st.replicas:
            # (a local replica learns it was removed from the same znode, posted to it by the worker; a retired
            # copy it kept goes once released)
            if self.node_id in retired_names(st) or not self._may_keep_retired(rt, g):
                return
        elif rec is not None and (rec.host is None or not rec.host.removed):
            rec.replicas = tuple(st.replicas)  # (the ISR CASes write this placement)
            return
        # keyed: one open (or release) per group at a time; a later znode of the same group replaces a waiting one
        self.metastore.submit(lambda: self._open_added(rt, g), key=("add-replica", rt.spec.name, g))

    def _may_keep_retired(self, rt: ModuleRuntime, g: int) -> bool:
        """This worker may keep a retired copy of ``g``: its replica said so, or may yet (it has not closed: it
        reads the znodes in order), or (restarted since) the directory is there with no replica."""
        rec = rt.hosted.get(g)
        if rec is None:
            return (self.data_dir / rt.spec.name / str(g)).is_dir()
        return rec.host is not None and (rec.host.retired or not rec.host.closed.is_set())

    def _open_added(self, rt: ModuleRuntime, g: int) -> None:
        """Metastore thread: open a replica of ``g`` (empty, or from the retired copy kept here) if the group still
        lists this worker; delete a retired copy the group released."""
        module = rt.spec.name
        try:
            st, _ = self.metastore.groups.get(module, g)
        except (GroupNotFound, MetastoreError):
            return  # destroyed, or ZooKeeper is away: the group watch calls again with the next znode
        old = rt.hosted.get(g)
        if not self.modules.is_open(rt):
            return
        if self.node_id not in st.replicas:
            if self.node_id not in retired_names(st) and self._may_keep_retired(rt, g):
                self._release(rt, g, old)
            return
        if old is not None and (old.host is None or not old.host.removed):
            return  # hosted already (opened by an earlier call)
        if old is not None and old.host is not None and not old.host.closed.is_set():
            self._look_again(rt, g)  # its directory is deleted (or kept, retired) once its disk closed
            return
        gdir = self.data_dir / module / str(g)
        if st.incarnation_of(self.node_id) is None:
            shutil.rmtree(gdir, ignore_errors=True)  # a retired copy left here, and then a plan added this worker anew
        kept = gdir.is_dir()  # (a retired copy taken back: the znode records its storage again)
        rec = HostedReplica(module, g, tuple(st.replicas))
        try:
            # (empty: its store is created when first used, never if a far-horizon install replaces it first)
            host = self._open_replica(rt, rec, defer_empty=True)
        except Exception as e:  # a full disk, say: the next znode of the group tries again
            log.error("%s/%d: could not open the replica a reassignment added here: %s", module, g, describe(e))
            return
        rec.host = host
        if not self.modules.adopt(rt, rec, old):
            host.store.close()
            host.log.close()
            host.task_thread.release(host)  # (never started)
            return
        host.start()
        host.post(MetastoreChanged(st))
        log.warning("%s/%d: a reassignment added a replica here (replicas %s, adding %s): it opened %s and "
                    "catches up from leader %s", module, g, list(st.replicas), list(st.adding),
                    "from the retired copy kept here (taken back)" if kept else "empty", st.leader)

    def _release(self, rt: ModuleRuntime, g: int, old: HostedReplica | None) -> None:
        """Metastore thread: delete the retired copy of ``g`` kept here, once its replica closed."""
        if old is not None and old.host is not None and not old.host.closed.is_set():
            self._look_again(rt, g)
            return
        if old is not None and (old.host is None or not old.host.retired):
            return  # (a replica removed without retiring deleted its directory itself)
        shutil.rmtree(self.data_dir / rt.spec.name / str(g), ignore_errors=True)
        log.warning("node %s deleted its retired copy of %s/%d: the replicas the plan kept reconfirmed their "
                    "storage", self.node_id, rt.spec.name, g)

    def _look_again(self, rt: ModuleRuntime, g: int) -> None:
        """Call :meth:`_open_added` again shortly instead of blocking the metastore's dispatcher (every watch of
        this worker waits behind it): one timer per group at a time, since the keyed submit replaces a waiting
        call."""
        timer = threading.Timer(REMOVED_CLOSE_POLL_S, lambda: self.metastore.submit(
            lambda: self._open_added(rt, g), key=("add-replica", rt.spec.name, g)))
        timer.daemon = True
        timer.start()

    def copy_limit(self, module: str, group: int) -> int:
        """Bytes per second the local replica of ``group`` may copy from its leader: the module's
        ``reassignment.copy.bytes.per.second`` while a reassignment adds it, else 0 (unpaced)."""
        rt = self.modules.get(module)
        if rt is None or (module, group) not in self._adding:
            return 0
        return rt.spec.option(REASSIGN_COPY_BYTES_PER_S)

    def copy_pacing(self, module: str, group: int) -> CopyPacing:
        """What paces a far-horizon copy of the local replica of ``group``: :meth:`copy_limit`, read live, drawn
        from the module runtime's budget (a module already closed here: a budget of its own, the copy stops)."""
        rt = self.modules.get(module)
        return CopyPacing(functools.partial(self.copy_limit, module, group),
                          rt.copy_budget if rt is not None else CopyBudget())

    def sweep_unlisted(self, module: str, groups: Mapping[int, GroupState]) -> None:
        """Delete local directories of ``module``'s groups whose znode does not list this worker (as a replica or
        a retired copy)."""
        root = self.data_dir / module
        if not root.is_dir():
            return
        for child in root.iterdir():
            st = groups.get(int(child.name)) if child.name.isdigit() else None
            if st is not None and self.node_id not in st.replicas + retired_names(st):
                shutil.rmtree(child, ignore_errors=True)
                log.warning("node %s deleted its data of %s/%s: the group no longer lists it (a reassignment "
                            "removed it while it was down)", self.node_id, module, child.name)

    def sweep_stale_stores(self, module: str, groups: Mapping[int, GroupState]) -> None:
        """Delete the store versions a crash mid-install left beside this worker's replicas of ``module``.

        Only at the module's first open in this process: no far-horizon install of it runs yet, so every
        version its ``state`` does not point at is left over (``pstate.checkpoint.remove_stale_versions``)."""
        for g, st in groups.items():
            if self.node_id in st.replicas:
                for stale in remove_stale_versions(self.data_dir / module / str(g) / "state"):
                    log.warning("node %s deleted %s, a store version a far-horizon install left behind",
                                self.node_id, stale)
