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
``/millrace/nodes``, whenever a worker's own compare-and-set leaves a group
leaderless (a leader giving up after a fault, the last in-sync replica
finding its storage lost), and every ``reconcile_interval`` as a safety net,
it compares every group with the live node set and repairs what is wrong. That
is what makes takeover safe: a node lost while no conductor was active is
handled by whichever conductor wins next, without replaying missed events.

ZooKeeper outages: while the connection is merely SUSPENDED the conductor
stays active (its election znode survives; kazoo reconnects). When the session
is LOST the election znode is gone, so it stops acting and campaigns again.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.exceptions import CancelledError, KazooException
from kazoo.recipe.election import Election

from conductor.metastore import (
    GroupNotFound,
    GroupState,
    Metastore,
    MetastoreError,
    ModuleNotFound,
    VersionConflict,
)
from conductor.metastore.module_spec import DEPOT_APPEND_TIMEOUT_MS, ModuleSpec
from conductor.metastore.versions import CodeVersion
from conductor.metastore.watch import WatchHandle
from conductor.metastore.zk_auth import ZkAuthError, ZkPrincipal, read_principal
from conductor.placement import balance_leaders, fully_in_sync, place
from conductor.reassigning import PlanExecutor
from conductor.security.config import TLS_SETTINGS, check_bind, tls_source
from conductor.settings import REQUIRED, Setting, SettingsError, add_arguments, parse_seconds, resolve
from conductor.status import status_document
from conductor.ui import UI_SETTINGS, start_ui
from conductor.ui.metrics import ConductorMetrics
from conductor.wire.channels import use_process_credentials
from replog.election import leaderless_reason, next_leadership, switch_leader, unconfirmed_members

log = logging.getLogger("millrace.conductor")

# A group whose CAS keeps losing races is left for the next reconcile rather than spun on.
_MAX_CAS_ATTEMPTS = 10


#: how soon a leaderless group is looked at again while a live in-sync replica confirms its storage
_CONFIRM_RECHECK_S = 0.5

#: a resign request the leader has not served after its append timeout plus this margin was given up
_RESIGN_GRACE_S = 5.0


def _fmt(nodes: Iterable[str]) -> str:
    return "[" + ",".join(nodes) + "]"


class UnknownNode(MetastoreError):
    """A node id that is neither live nor a replica of any task group (a typo, most likely)."""

    def __init__(self, node_id: str, known: Iterable[str]) -> None:
        self.node_id = node_id
        super().__init__(f"unknown node {node_id!r}: it is not live and holds no replica; known nodes: "
                         f"{', '.join(sorted(known)) or 'none'}")


@dataclass(frozen=True)
class Switch:
    """One leader switch of a balancing round: ``group`` of ``module`` moves from ``source`` to ``to``.

    ``epoch`` is the group's epoch when it was requested: the switch has landed
    once the group is at a later epoch led by ``to``.
    """

    module: str
    group: int
    source: str | None
    to: str
    epoch: int

    def outcome(self, now: GroupState | None) -> str:
        """``switched``, ``pending`` (still at the requested epoch) or ``changed`` (led otherwise meanwhile)."""
        if now is None:
            return "changed"
        if now.epoch == self.epoch:
            return "pending"
        return "switched" if now.leader == self.to else "changed"


class Conductor:
    """One conductor process: campaigns for leadership and, while active, keeps every group led.

    ``deploy``/``destroy``/``balance`` work whether or not this instance is
    active (they are plain metastore operations guarded by CAS or
    transactions); automatic failover only runs on the active one.
    """

    def __init__(self, hosts: str, name: str, *, session_timeout: float = 10.0,
                 reconcile_interval: float = 5.0, balance_interval: float = 60.0,
                 zk_auth: ZkPrincipal | None = None) -> None:
        self.hosts = hosts
        self.name = name
        self.reconcile_interval = reconcile_interval
        #: seconds between periodic leadership-balancing rounds while active (0 disables them)
        self.balance_interval = balance_interval
        self._next_balance = 0.0
        self.ms = Metastore(hosts, session_timeout=session_timeout, step_down=self._on_session_lost,
                            resume=self._on_resume, zk_auth=zk_auth)
        self._stopping = threading.Event()
        self._active = threading.Event()
        self._term_over = threading.Event()
        self._kick = threading.Event()
        self._election: Election | None = None
        self._election_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._known_live: set[str] | None = None
        #: a leaderless group waits for a live in-sync replica to confirm its storage (look again soon)
        self._awaiting_storage = False
        #: (module, group) -> watch that wakes the active term when a worker's CAS leaves the group leaderless
        self._group_watches: dict[tuple[str, int], WatchHandle] = {}
        self._started = False
        #: what this conductor did (elections, CAS conflicts, balancing moves), for /metrics and the UI
        self.metrics = ConductorMetrics()
        #: runs the reassignment plans stored in ZooKeeper while active (conductor.reassigning)
        self.plans = PlanExecutor(self.ms, lambda module: self.request_switches([module]), self.metrics)
        self._planning = False

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
        self.ms.nodes.watch(lambda _nodes: self._kick.set())
        self.ms.plans.watch(lambda _modules: self._kick.set())  # a plan created or finished
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
                election = self._election = self.ms.conductors.election(self.name)
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
        # The first round waits one interval: nodes that just (re)started get to rejoin ISRs first.
        self._next_balance = time.monotonic() + self.balance_interval
        log.info("conductor %s is now active", self.name)
        try:
            while not (self._stopping.is_set() or self._term_over.is_set()):
                self._kick.clear()
                try:
                    self.reconcile()
                    self._planning = self.plans.run()
                    self._maybe_balance()
                except (MetastoreError, KazooException) as e:
                    log.warning("conductor %s: reconcile failed (%s); retrying", self.name, e)
                wait = self.reconcile_interval
                if self._awaiting_storage or self._planning:  # confirming storage; a plan in progress
                    wait = min(wait, _CONFIRM_RECHECK_S)
                if self.balance_interval > 0:
                    wait = max(0.0, min(wait, self._next_balance - time.monotonic()))
                self._kick.wait(wait)
        finally:
            self._active.clear()
            self.metrics.forget_groups(set())  # a standby's leaderless clocks would go stale
            if not self._stopping.is_set():
                log.warning("conductor %s is no longer active", self.name)

    # ---- failover -------------------------------------------------------------------------------

    def reconcile(self) -> None:
        """Bring every group in line with the live nodes (elect, fence, recover leaderless groups)."""
        sessions = self.ms.nodes.sessions()
        live = set(sessions)
        previous = self._known_live
        if previous is not None:
            for node in sorted(previous - live):
                log.warning("node %s lost", node)
            for node in sorted(live - previous):
                log.info("node %s joined", node)
        self._known_live = live
        self._awaiting_storage = False
        disallowed = self.ms.drains.nodes()
        seen: set[tuple[str, int]] = set()
        for module in self.ms.modules.names():
            try:
                groups = self.ms.groups.all(module)
            except ModuleNotFound:
                continue  # destroyed meanwhile
            seen.update((module, g) for g in groups)
            for g, (state, version) in groups.items():
                if self._stopping.is_set() or self._term_over.is_set():
                    return
                settled = self._settle_group(module, g, state, version, sessions, disallowed)
                self.metrics.group_seen(module, g, settled)
                if settled.leader is None and unconfirmed_members(settled, sessions):
                    self._awaiting_storage = True
        self._watch_groups(seen)
        self.metrics.forget_groups(seen)

    def _watch_groups(self, groups: set[tuple[str, int]]) -> None:
        """Watch exactly ``groups``: a worker's CAS that leaves one leaderless wakes the active term at once, and
        so does any change of a group while a plan is in progress (:meth:`_on_group_changed`)."""
        for key in set(self._group_watches) - groups:
            self._group_watches.pop(key).cancel()
        for module, g in sorted(groups - set(self._group_watches)):
            self._group_watches[(module, g)] = self.ms.groups.watch(module, g, self._on_group_changed)

    def _on_group_changed(self, state: GroupState | None, _version: int) -> None:
        # While a plan is in progress its next step waits for a group write: a leader admitting an added replica
        # to the ISR, a hand-off, this conductor's own step (after the last group's, the plan's end). Polling
        # alone took up to half a second per step, the writer at RF 3 all along and the plan's leader move
        # after it waiting (issue 27, session 18); a pass now follows each write.
        if state is not None and (state.leader is None or self._planning) and self._active.is_set():
            self._kick.set()

    def _settle_group(self, module: str, g: int, state: GroupState, version: int,
                      live: dict[str, int], disallowed: Iterable[str] = ()) -> GroupState:
        """Apply ``next_leadership`` with a CAS, re-deciding from fresh state on every conflict; the state now."""
        for _ in range(_MAX_CAS_ATTEMPTS):
            new = next_leadership(state, live, disallowed)
            if new is None:
                return state
            try:
                self.ms.groups.cas(module, g, new, version)
            except VersionConflict as c:
                self.metrics.cas_conflict(module)
                if c.current is None:
                    return state
                state, version = c.current, c.current_version
                continue
            except GroupNotFound:
                return state
            self._log_transition(module, g, state, new, live)
            self.metrics.transition(module, g, state, new, leaderless_reason(new, live))
            return new
        log.warning("group %s/%d: gave up after %d conflicting updates; will retry on the next reconcile",
                    module, g, _MAX_CAS_ATTEMPTS)
        return state

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

    def place_module(self, spec: ModuleSpec) -> dict[int, GroupState]:
        """Where the module's task groups would go now: the ``spec.workers`` least-loaded live nodes (by
        replicas of already deployed modules), so successive deployments spread out."""
        sessions = self.ms.nodes.sessions()
        live = sorted(sessions)
        spec.check_placeable(live)
        load: Counter[str] = Counter()
        for module in self.ms.modules.names():
            try:
                for state, _ in self.ms.groups.all(module).values():
                    load.update(state.replicas)
            except ModuleNotFound:
                continue
        nodes = sorted(live, key=lambda n: (load[n], n))[: spec.workers]
        placement = place(spec.threads, nodes, spec.replication_factor)
        return {g: GroupState.initial(replicas, leader_session=sessions[replicas[0]])
                for g, replicas in placement.items()}

    def deploy(self, spec: ModuleSpec, groups: dict[int, GroupState] | None = None,
               version: CodeVersion | None = None) -> dict[int, GroupState]:
        """Create the module atomically in the metastore, with its code version, on `groups` (default: placed
        now by :meth:`place_module`). Shipping the code first is :func:`conductor.shipping.deploy_code`'s."""
        groups = groups if groups is not None else self.place_module(spec)
        self.ms.modules.create(spec, groups, version)
        nodes = sorted({n for st in groups.values() for n in st.replicas})
        log.info("deployed module %s (%s%s): %d tasks in %d task groups, RF %d, on %s", spec.name, spec.module_ref,
                 f", code {spec.code[:12]}" if spec.code else "", spec.tasks, spec.threads, spec.replication_factor,
                 _fmt(nodes))
        return groups

    def destroy(self, module: str) -> None:
        """Remove a module and all its coordination state (workers drop their replicas on the watch)."""
        self.ms.modules.delete(module)
        log.info("destroyed module %s", module)

    def status(self, module: str) -> list[dict[str, Any]]:
        """Per-group leadership for ``conductor status``, with the reason when a group has no leader."""
        live = self.ms.nodes.sessions()
        rows = []
        for g, (state, version) in self.ms.groups.all(module).items():
            rows.append({"group": g, **state.to_dict(), "version": version,
                         "leaderless_reason": leaderless_reason(state, live)})
        return rows

    # ---- leadership balancing ----------------------------------------------------------------------

    def _maybe_balance(self) -> None:
        """The periodic round of the active conductor (``balance_interval`` seconds apart; 0 = never)."""
        if self.balance_interval <= 0 or time.monotonic() < self._next_balance:
            return
        self._next_balance = time.monotonic() + self.balance_interval
        planned = set(self.ms.plans.modules())  # (balanced when their plan ends, not onto a replica going away)
        for module in self.ms.modules.names():
            if self._stopping.is_set() or self._term_over.is_set():
                return
            if module in planned:
                continue
            try:
                self.request_switches([module], settled_only=True)
            except ModuleNotFound:
                continue

    def withdraw_stale_resigns(self, module: str, states: dict[int, tuple[GroupState, int]]) -> dict[int, str]:
        """Delete resign requests nobody will serve; return the outstanding ones as ``{group: successor}``.

        A request is stale once its group moved to another epoch (leadership
        changed anyway) or its leader gave up (the append timeout passed): left
        in place it would show the module as balancing forever.
        """
        try:
            spec, _ = self.ms.modules.get(module)
            grace = spec.option(DEPOT_APPEND_TIMEOUT_MS) / 1000.0 + _RESIGN_GRACE_S
        except ModuleNotFound:
            return {}
        outstanding: dict[int, str] = {}
        for g, req in self.ms.resigns.all(module).items():
            st = states.get(g)
            age = time.time() - float(req.get("requested", 0))
            if st is None or st[0].epoch != req.get("epoch") or age > grace:
                self.ms.resigns.delete(module, g)
                log.info("balance: withdrew a stale resign request of %s/%d (%s)", module, g, req)
            else:
                outstanding[g] = str(req.get("to"))
        return outstanding

    def request_switches(self, modules: Sequence[str] | None = None, disallowed: Iterable[str] | None = None,
                         direct: bool = False, settled_only: bool = False) -> list[Switch]:
        """Even out leadership with the minimal set of switches (``placement.balance_leaders``).

        By default each switch is a resign request: the leader stops taking
        appends, waits until its successor holds everything, and hands off
        (no append fails except with a retryable NotLeader). ``direct=True``
        switches at once with a CAS (safe, the target is in the ISR, but appends
        in flight on the old leader fail and are retried). ``disallowed``
        defaults to the nodes drained in ZooKeeper. With ``settled_only`` (the
        periodic round) a module is left alone unless every group is fully in
        sync and no hand-off is outstanding, so balancing never fights failover.
        """
        live = self.ms.nodes.sessions()
        banned = self.ms.drains.nodes() if disallowed is None else set(disallowed)
        states: dict[tuple[str, int], tuple[GroupState, int]] = {}
        for module in modules if modules is not None else self.ms.modules.names():
            try:
                groups = self.ms.groups.all(module)
            except ModuleNotFound:
                continue
            outstanding = self.withdraw_stale_resigns(module, groups)
            if settled_only and (outstanding or not all(fully_in_sync(st, live) for st, _ in groups.values())):
                continue
            for g, sv in groups.items():
                states[(module, g)] = sv
        moves = balance_leaders({k: s for k, (s, _) in states.items()}, live, banned)
        switches: list[Switch] = []
        for (module, g), to in sorted(moves.items()):
            state, version = states[(module, g)]
            if direct:
                try:
                    # resigns.complete also clears a pending request for this group (or is a plain CAS).
                    self.ms.resigns.complete(module, g, switch_leader(state, to, live[to]), version)
                except (VersionConflict, GroupNotFound) as e:
                    log.info("balance: skipped %s/%d (%s)", module, g, e)
                    continue
                log.info("balance: group %s/%d leader %s -> %s, epoch %d -> %d", module, g, state.leader, to,
                         state.epoch, state.epoch + 1)
            else:
                self.ms.resigns.request(module, g, to, state.epoch, live[to])
                log.info("balance: asked %s to hand group %s/%d to %s (epoch %d)", state.leader, module, g, to,
                         state.epoch)
            switches.append(Switch(module, g, state.leader, to, state.epoch))
            self.metrics.balancing_move(module, g, state.leader, to, state.epoch)
        return switches

    def balance(self, modules: Sequence[str] | None = None, disallowed: Iterable[str] | None = None,
                direct: bool = False) -> dict[tuple[str, int], str]:
        """``request_switches`` as ``{(module, group): new leader}``."""
        return {(sw.module, sw.group): sw.to for sw in self.request_switches(modules, disallowed, direct)}

    def await_switches(self, switches: Sequence[Switch], timeout_s: float,
                       on_update: Callable[[dict[Switch, str]], None] | None = None,
                       poll_s: float = 0.1) -> dict[Switch, str]:
        """Wait until every requested switch landed or was overtaken (see ``Switch.outcome``), or the timeout.

        Requests still pending at the timeout are withdrawn, so a leader that
        could not hand off (a stalled ISR) is not asked again on every watch.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            outcomes: dict[Switch, str] = {}
            for sw in switches:
                try:
                    now: GroupState | None = self.ms.groups.get(sw.module, sw.group)[0]
                except GroupNotFound:
                    now = None
                outcomes[sw] = sw.outcome(now)
            if on_update is not None:
                on_update(outcomes)
            pending = [sw for sw, o in outcomes.items() if o == "pending"]
            if not pending:
                return outcomes
            if time.monotonic() >= deadline:
                for sw in pending:
                    self.ms.resigns.delete(sw.module, sw.group)
                return outcomes
            time.sleep(poll_s)

    def known_nodes(self) -> set[str]:
        """Live nodes plus every node holding a replica of some task group."""
        known = set(self.ms.nodes.live())
        for module in self.ms.modules.names():
            try:
                for st, _ in self.ms.groups.all(module).values():
                    known.update(st.replicas)
            except ModuleNotFound:
                continue
        return known

    def disallow_leaders(self, node_id: str) -> None:
        """Drain ``node_id`` of leadership (stored in ZooKeeper; balancing then moves its leaders away)."""
        known = self.known_nodes()
        if node_id not in known:
            raise UnknownNode(node_id, known)
        self.ms.drains.disallow(node_id)
        log.info("node %s may no longer lead task groups", node_id)

    def allow_leaders(self, node_id: str) -> bool:
        """Undo ``disallow_leaders``; False if the node was not drained."""
        if node_id not in self.ms.drains.nodes():
            known = self.known_nodes()
            if node_id not in known:
                raise UnknownNode(node_id, known)
            return False
        self.ms.drains.allow(node_id)
        log.info("node %s may lead task groups again", node_id)
        return True


# ---- entry point ------------------------------------------------------------------------------------


SETTINGS = [
    Setting("zk", REQUIRED, help="ZooKeeper connect string, HOST:PORT[,HOST:PORT...]"),
    Setting("name", f"c-{socket.gethostname()}-{os.getpid()}", help="conductor name shown in logs and in the election"),
    Setting("session_timeout", 10.0, parse_seconds,
            help="ZooKeeper session timeout in seconds (failover takes about this long)"),
    Setting("reconcile_interval", 5.0, parse_seconds, help="seconds between safety-net reconciles while active"),
    Setting("balance_interval", 60.0, parse_seconds,
            help="seconds between leadership-balancing rounds while active (0 disables them)"),
    Setting("zk_auth", None, Path, help="file holding the ZooKeeper digest credentials USER:PASSWORD (mode 0600); "
            "the znodes this conductor creates are then writable by that user only (docs/security.md)"),
    Setting("log_level", "INFO"),
    *UI_SETTINGS,
    *TLS_SETTINGS,
]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m conductor.controller --zk HOST:PORT [--name c1]``: run one conductor until SIGTERM/SIGINT.

    A conductor's only port is its read-only web UI, JSON API and /metrics (``--ui-port``, on ``--host``).
    Settings come from flags, ``MILLRACE_*`` variables or the ``[conductor]`` section of a TOML config file.
    """
    parser = argparse.ArgumentParser(prog="python -m conductor.controller",
                                     description="Run a Millrace conductor (one of them is active at a time).")
    add_arguments(parser, SETTINGS)
    args = parser.parse_args(argv)
    try:
        s = resolve(vars(args), SETTINGS, "conductor", args.config)
        zk_auth = read_principal(s["zk_auth"]) if s["zk_auth"] is not None else None
        tls = tls_source(s, "conductor", s["name"])
        security = check_bind(f"conductor {s['name']}", s["host"], tls, s["insecure"])
    except (SettingsError, ZkAuthError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    logging.basicConfig(level=s["log_level"].upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    # every channel to a worker (status, code shipping, deploys) presents the conductor's certificate
    use_process_credentials(tls.grpc_channel_credentials if tls is not None else None)
    log.warning("conductor %s: links to workers %s", s["name"], security)
    conductor = Conductor(s["zk"], s["name"], session_timeout=s["session_timeout"],
                          reconcile_interval=s["reconcile_interval"], balance_interval=s["balance_interval"],
                          zk_auth=zk_auth)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: conductor.request_stop())
    ui = None
    try:
        conductor.start()
        ui = start_ui(conductor, s, functools.partial(status_document, conductor.ms), tls)
        conductor.run_forever()
    except MetastoreError as e:
        log.error("conductor %s cannot run: %s", s["name"], e)
        return 1
    finally:
        if ui is not None:
            ui.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
