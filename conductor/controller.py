"""The conductor: the cluster's brain for placement, leader election and module lifecycle.

Several conductors may run; they campaign with kazoo's ``Election`` on
``/millrace/conductor/election`` and exactly one is *active*. Only the active
conductor changes leadership. Everything it decides comes from the pure
functions in ``conductor.placement`` and is written with a versioned
compare-and-set, so even two conductors that briefly both believe they are
active (one with an expired session it has not noticed yet) cannot corrupt a
group: the slower one gets ``VersionConflict``, re-reads and finds nothing
left to do.

The active conductor is *level-triggered*: on every change of
``/millrace/nodes`` (and every ``reconcile_interval`` as a safety net) it
compares every group with the live node set and repairs what is wrong. That
is what makes takeover safe: a node lost while no conductor was active is
handled by whichever conductor wins next, without replaying missed events.

ZooKeeper outages: while the connection is merely SUSPENDED the conductor
stays active (its election znode survives; kazoo reconnects). When the session
is LOST the election znode is gone, so it stops acting and campaigns again.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from kazoo.exceptions import CancelledError, KazooException
from kazoo.recipe.election import Election

from conductor.metastore import (
    GroupNotFound,
    Metastore,
    MetastoreError,
    ModuleNotFound,
    VersionConflict,
)
from conductor.module_spec import ModuleSpec
from conductor.placement import (
    GroupState,
    balance_leaders,
    leaderless_reason,
    next_leadership,
    place,
    switch_leader,
)

log = logging.getLogger("millrace.conductor")

# A group whose CAS keeps losing races is left for the next reconcile rather than spun on.
_MAX_CAS_ATTEMPTS = 10


def _fmt(nodes: Iterable[str]) -> str:
    return "[" + ",".join(nodes) + "]"


class Conductor:
    """One conductor process: campaigns for leadership and, while active, keeps every group led.

    ``deploy``/``destroy``/``balance`` work whether or not this instance is
    active (they are plain metastore operations guarded by CAS or
    transactions); automatic failover only runs on the active one.
    """

    def __init__(self, hosts: str, name: str, *, session_timeout: float = 10.0,
                 reconcile_interval: float = 5.0) -> None:
        self.hosts = hosts
        self.name = name
        self.reconcile_interval = reconcile_interval
        self.ms = Metastore(hosts, session_timeout=session_timeout, step_down=self._on_session_lost,
                            resume=self._on_resume)
        self._stopping = threading.Event()
        self._active = threading.Event()
        self._term_over = threading.Event()
        self._kick = threading.Event()
        self._election: Election | None = None
        self._election_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._known_live: set[str] | None = None
        self._started = False

    # ---- lifecycle ----------------------------------------------------------------------------

    @property
    def is_active(self) -> bool:
        return self._active.is_set()

    def wait_active(self, timeout: float | None = None) -> bool:
        """Block until this conductor is active (or the timeout passes); True if it is."""
        return self._active.wait(timeout)

    def start(self) -> Conductor:
        """Connect and start campaigning in a background thread; returns at once."""
        if self._started:
            return self
        self._started = True
        self.ms.start()
        # Any membership change wakes the active term; the callback runs on the metastore's thread.
        self.ms.watch_nodes(lambda _nodes: self._kick.set())
        self._thread = threading.Thread(target=self._campaign, name=f"conductor-{self.name}", daemon=True)
        self._thread.start()
        log.info("conductor %s started (ZooKeeper %s); campaigning for leadership", self.name, self.hosts)
        return self

    def run_forever(self) -> None:
        """Start and serve until ``stop()`` (or ``request_stop()`` from a signal handler)."""
        self.start()
        try:
            while not self._stopping.wait(0.5):
                pass
        finally:
            self.stop()

    def request_stop(self) -> None:
        """Ask ``run_forever`` to return; safe to call from a signal handler (it only sets events)."""
        self._stopping.set()
        self._term_over.set()
        self._kick.set()

    def stop(self) -> None:
        """Leave the election and close the session so a standby takes over immediately."""
        self.request_stop()
        with self._election_lock:
            if self._election is not None:
                self._election.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10.0)
        self.ms.close()
        log.info("conductor %s stopped", self.name)

    def _on_session_lost(self) -> None:
        # Our election znode died with the session: someone else may be active now.
        if self._active.is_set():
            log.warning("conductor %s lost its ZooKeeper session; no longer active, campaigning again", self.name)
        self._term_over.set()
        self._kick.set()

    def _on_resume(self) -> None:
        self._kick.set()  # reconcile at once: changes may have happened while we were disconnected

    def _campaign(self) -> None:
        while not self._stopping.is_set():
            self._term_over.clear()
            with self._election_lock:
                if self._stopping.is_set():
                    return
                election = self._election = self.ms.election(self.name)
            try:
                election.run(self._lead)
            except CancelledError:
                return
            except (KazooException, MetastoreError) as e:
                log.warning("conductor %s: election interrupted (%s); campaigning again", self.name, e)
                self._stopping.wait(0.5)
            except Exception:
                log.exception("conductor %s: unexpected error in the election; campaigning again", self.name)
                self._stopping.wait(0.5)

    def _lead(self) -> None:
        """The active term: reconcile on every kick until stopped or the session is lost."""
        if self._stopping.is_set() or self._term_over.is_set():
            return
        self._active.set()
        self._known_live = None
        log.info("conductor %s is now active", self.name)
        try:
            while not (self._stopping.is_set() or self._term_over.is_set()):
                self._kick.clear()
                try:
                    self.reconcile()
                except (MetastoreError, KazooException) as e:
                    log.warning("conductor %s: reconcile failed (%s); retrying", self.name, e)
                self._kick.wait(self.reconcile_interval)
        finally:
            self._active.clear()
            if not self._stopping.is_set():
                log.warning("conductor %s is no longer active", self.name)

    # ---- failover -------------------------------------------------------------------------------

    def reconcile(self) -> None:
        """Bring every group in line with the live nodes (elect, fence, recover leaderless groups)."""
        sessions = self.ms.live_sessions()
        live = set(sessions)
        previous = self._known_live
        if previous is not None:
            for node in sorted(previous - live):
                log.warning("node %s lost", node)
            for node in sorted(live - previous):
                log.info("node %s joined", node)
        self._known_live = live
        for module in self.ms.list_modules():
            try:
                groups = self.ms.list_groups(module)
            except ModuleNotFound:
                continue  # destroyed meanwhile
            for g, (state, version) in groups.items():
                if self._stopping.is_set() or self._term_over.is_set():
                    return
                self._settle_group(module, g, state, version, sessions)

    def _settle_group(self, module: str, g: int, state: GroupState, version: int,
                      live: dict[str, int]) -> None:
        """Apply ``next_leadership`` with a CAS, re-deciding from fresh state on every conflict."""
        for _ in range(_MAX_CAS_ATTEMPTS):
            new = next_leadership(state, live)
            if new is None:
                return
            try:
                self.ms.cas_group(module, g, new, version)
            except VersionConflict as c:
                if c.current is None:
                    return
                state, version = c.current, c.current_version
                continue
            except GroupNotFound:
                return
            self._log_transition(module, g, state, new, live)
            return
        log.warning("group %s/%d: gave up after %d conflicting updates; will retry on the next reconcile",
                    module, g, _MAX_CAS_ATTEMPTS)

    @staticmethod
    def _log_transition(module: str, g: int, old: GroupState, new: GroupState, live: dict[str, int]) -> None:
        epochs = f"epoch {old.epoch} -> {new.epoch}"
        if old.leader is not None and old.leader in live and old.leader_session != live[old.leader]:
            log.warning("node %s restarted (new session): group %s/%d leader %s -> %s, %s, ISR %s",
                        old.leader, module, g, old.leader, new.leader, epochs, _fmt(new.isr))
        elif old.leader is None:
            log.info("node %s returned: group %s/%d leader none -> %s, %s, ISR %s",
                     new.leader, module, g, new.leader, epochs, _fmt(new.isr))
        elif new.leader is None:
            log.error("node %s lost: group %s/%d is now leaderless, %s: %s",
                      old.leader, module, g, epochs, leaderless_reason(new, live))
        else:
            log.warning("node %s lost: group %s/%d leader %s -> %s, %s, ISR %s",
                        old.leader, module, g, old.leader, new.leader, epochs, _fmt(new.isr))

    # ---- lifecycle of modules ---------------------------------------------------------------------

    def deploy(self, spec: ModuleSpec) -> dict[int, GroupState]:
        """Place the module's task groups on live nodes and create it atomically in the metastore.

        The ``spec.workers`` least-loaded live nodes (by replicas of already
        deployed modules) are used, so successive deployments spread out.
        """
        sessions = self.ms.live_sessions()
        live = sorted(sessions)
        spec.check_placeable(live)
        load: Counter[str] = Counter()
        for module in self.ms.list_modules():
            try:
                for state, _ in self.ms.list_groups(module).values():
                    load.update(state.replicas)
            except ModuleNotFound:
                continue
        nodes = sorted(live, key=lambda n: (load[n], n))[: spec.workers]
        placement = place(spec.threads, nodes, spec.replication_factor)
        groups = {g: GroupState.initial(replicas, leader_session=sessions[replicas[0]])
                  for g, replicas in placement.items()}
        self.ms.create_module(spec, groups)
        log.info("deployed module %s (%s): %d tasks in %d task groups, RF %d, on %s", spec.name, spec.module_ref,
                 spec.tasks, spec.threads, spec.replication_factor, _fmt(nodes))
        return groups

    def destroy(self, module: str) -> None:
        """Remove a module and all its coordination state (workers drop their replicas on the watch)."""
        self.ms.delete_module(module)
        log.info("destroyed module %s", module)

    def status(self, module: str) -> list[dict[str, Any]]:
        """Per-group leadership for ``conductor status``, with the reason when a group has no leader."""
        live = self.ms.live_sessions()
        rows = []
        for g, (state, version) in self.ms.list_groups(module).items():
            rows.append({"group": g, **state.to_dict(), "version": version,
                         "leaderless_reason": leaderless_reason(state, live)})
        return rows

    def balance(self, modules: Sequence[str] | None = None, disallowed: Iterable[str] = (),
                direct: bool = False) -> dict[tuple[str, int], str]:
        """Even out leadership with the minimal set of switches (``placement.balance_leaders``).

        By default each switch is a resign request for the current leader to
        hand off once the follower is caught up (no write is lost in flight).
        ``direct=True`` switches at once with a CAS (safe, the target is in the
        ISR, but writes in flight on the old leader fail and are retried).
        """
        live = self.ms.live_sessions()
        states: dict[tuple[str, int], tuple[GroupState, int]] = {}
        for module in modules if modules is not None else self.ms.list_modules():
            try:
                for g, sv in self.ms.list_groups(module).items():
                    states[(module, g)] = sv
            except ModuleNotFound:
                continue
        moves = balance_leaders({k: s for k, (s, _) in states.items()}, live, disallowed)
        for (module, g), to in sorted(moves.items()):
            state, version = states[(module, g)]
            if direct:
                try:
                    # complete_resign also clears a pending request for this group (or is a plain CAS).
                    self.ms.complete_resign(module, g, switch_leader(state, to, live[to]), version)
                except (VersionConflict, GroupNotFound) as e:
                    log.info("balance: skipped %s/%d (%s)", module, g, e)
                    continue
                log.info("balance: group %s/%d leader %s -> %s, epoch %d -> %d", module, g, state.leader, to,
                         state.epoch, state.epoch + 1)
            else:
                self.ms.request_resign(module, g, to, state.epoch)
                log.info("balance: asked %s to hand group %s/%d to %s", state.leader, module, g, to)
        return moves


# ---- entry point ------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m conductor.controller --zk HOST:PORT [--name c1]``: run one conductor until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m conductor.controller",
                                     description="Run a Millrace conductor (one of them is active at a time).")
    parser.add_argument("--zk", required=True, help="ZooKeeper connect string, e.g. 127.0.0.1:2181")
    parser.add_argument("--name", default=f"c-{socket.gethostname()}-{os.getpid()}",
                        help="conductor name shown in logs and in the election")
    parser.add_argument("--session-timeout", type=float, default=10.0,
                        help="ZooKeeper session timeout in seconds (failover takes about this long)")
    parser.add_argument("--reconcile-interval", type=float, default=5.0,
                        help="seconds between safety-net reconciles while active")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    conductor = Conductor(args.zk, args.name, session_timeout=args.session_timeout,
                          reconcile_interval=args.reconcile_interval)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: conductor.request_stop())
    try:
        conductor.run_forever()
    except MetastoreError as e:
        log.error("conductor %s cannot run: %s", args.name, e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
