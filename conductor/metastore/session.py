"""The ZooKeeper metastore: one kazoo session, and a recipe per znode family on top of it.

Layout (docs/metastore.md)::

    /millrace/conductor/election            conductor HA (kazoo Election)
    /millrace/nodes/<node-id>               ephemeral {"address", "pid", "started"}
    /millrace/modules/<module>              ModuleSpec JSON
    /millrace/modules/<module>/groups/<g>   GroupState JSON {leader, epoch, isr, osr, replicas}
    /millrace/modules/<module>/resign/<g>   {"to", "to_session", "epoch", "requested"}: a requested leader hand-off
    /millrace/disallowed/<node-id>          a node drained of leadership (`conductor disallow-leaders`)

Why it looks the way it does:

* Every change of leader, ISR or epoch is a versioned compare-and-set (one
  znode ``set`` with ``version=``, or a transaction whose every result is
  inspected). A lost race surfaces as ``VersionConflict`` carrying the
  current state, so the caller re-decides from fresh facts instead of
  overwriting someone else's decision.
* Transient ``ConnectionLoss`` is retried with ``KazooRetry`` for reads and
  idempotent writes, but a CAS is never retried blindly: a write whose reply
  was lost may have been applied, so we re-read and decide (applied, not
  applied and safe to retry, or a real conflict).
* kazoo calls listeners and watch functions on its own threads, where
  blocking is forbidden (a blocking ZooKeeper call there can deadlock the
  client). Every user callback therefore runs on one dispatcher thread owned
  by the Metastore, in the order the events happened; its line is bounded,
  a watch's newer report replacing the one still waiting
  (:mod:`conductor.metastore.dispatcher`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from types import TracebackType
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry, RetryFailedError
from kazoo.security import ACL

from conductor.metastore.acls import AclStore
from conductor.metastore.conductors import ConductorElection
from conductor.metastore.dispatcher import CONNECTED, LOST, SUSPENDED, Dispatcher, collapse_states
from conductor.metastore.drains import LeaderDrains
from conductor.metastore.errors import MetastoreUnavailable
from conductor.metastore.groups import Groups
from conductor.metastore.layout import DISALLOWED_PATH, MODULES_PATH, NODES_PATH, ROOT
from conductor.metastore.modules import Modules
from conductor.metastore.nodes import Nodes
from conductor.metastore.plans import Plans
from conductor.metastore.resigns import Resigns
from conductor.metastore.tokens import TokenStore
from conductor.metastore.versions import Versions
from conductor.metastore.watch import WatchHandle
from conductor.metastore.zk_auth import (
    ZkPrincipal,
    ZkRoles,
    cluster_acl,
    digest_id,
    process_principal,
    read_roles,
    session_options,
)

log = logging.getLogger("millrace.metastore")

T = TypeVar("T")


class Metastore:
    """A kazoo session plus typed, race-safe operations on the Millrace znode layout.

    ``pause_writes`` runs when the connection is SUSPENDED (we may no longer be
    the leader we think we are, so stop acknowledging writes), ``step_down``
    when the session is LOST (our ephemerals are gone: we certainly are not),
    ``resume`` when CONNECTED again. They run on the dispatcher thread.
    """

    def __init__(self, hosts: str, *, session_timeout: float = 10.0, connect_timeout: float = 15.0,
                 op_timeout: float | None = None,
                 pause_writes: Callable[[], None] | None = None,
                 step_down: Callable[[], None] | None = None,
                 resume: Callable[[], None] | None = None, zk_auth: ZkPrincipal | None = None) -> None:
        self.hosts = hosts
        self.session_timeout = session_timeout
        self.connect_timeout = connect_timeout
        # Retries of one operation give up after this long; by then the session is likely lost anyway.
        self.op_timeout = op_timeout if op_timeout is not None else max(session_timeout, 5.0)
        self._pause_writes = pause_writes
        self._step_down = step_down
        self._resume = resume
        self._state_listeners: list[Callable[[str], None]] = []
        # Reconnect quickly and forever: a brief ZooKeeper outage must not need an operator.
        conn_retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0)
        cmd_retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0, deadline=self.op_timeout)
        # zk_auth: authenticate with its digest, and create every znode writable by it alone (zk_auth.py); none
        # given: the process's operator principal, if it has one (a secure DevCluster's test process)
        zk_auth = zk_auth if zk_auth is not None else process_principal()
        auth = session_options(zk_auth, cluster_acl(zk_auth)) if zk_auth is not None else {}
        self.zk_auth = zk_auth
        #: whose znode is whose (zk_auth.ZkRoles, read at start): one user for the whole control plane, or the
        #: workers' own user beside it; None without digest auth (znodes world-writable, as ZooKeeper makes them)
        self.zk_roles: ZkRoles | None = None
        self.zk = KazooClient(hosts=hosts, timeout=session_timeout, connection_retry=conn_retry,
                              command_retry=cmd_retry, **auth)
        # ignore_expire: right after a session expires, calls fail with SessionExpiredError until kazoo
        # has a new session; for the idempotent operations run through _call that is just another retry.
        self._retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0, deadline=self.op_timeout,
                                 ignore_expire=True)
        self._dispatcher = Dispatcher(f"metastore-callbacks-{hosts}")
        #: connection states kazoo reported that the dispatcher has not reacted to yet (collapse_states)
        self._states: list[str] = []
        self._states_lock = threading.Lock()
        #: (dispatcher thread) the session was lost since the last CONNECTED: our node znodes must be made again
        self._was_lost = False
        self.closed = False
        self.zk.add_listener(self._on_state)
        #: one recipe per znode family (kazoo style): ``ms.groups.cas(...)``, ``ms.nodes.register(...)``
        self.nodes = Nodes(self)
        self.modules = Modules(self)
        self.versions = Versions(self)
        self.groups = Groups(self)
        self.resigns = Resigns(self)
        self.drains = LeaderDrains(self)
        self.conductors = ConductorElection(self)
        self.plans = Plans(self)
        self.acls = AclStore(self)
        self.tokens = TokenStore(self)

    def start(self) -> Metastore:
        """Connect and make sure the top-level paths exist."""
        try:
            self.zk.start(timeout=self.connect_timeout)
        except KazooTimeoutError:
            self.zk.stop()
            self.zk.close()
            self._dispatcher.stop()
            raise MetastoreUnavailable(self.hosts, f"no connection within {self.connect_timeout}s") from None
        if self.zk_auth is not None:
            self.zk_roles = self.call(read_roles, self.zk) or ZkRoles(digest_id(self.zk_auth))
            self.zk.default_acl = self.zk_roles.acl_for(ROOT)  # the paths not named in ZkRoles: control only
        self.call(self.zk.ensure_path, ROOT, self.acl_for(ROOT))
        for path in (f"{ROOT}/conductor", NODES_PATH, MODULES_PATH, DISALLOWED_PATH):
            self.call(self.zk.ensure_path, path, self.acl_for(path))
        return self

    def acl_for(self, path: str) -> list[ACL] | None:
        """The ACL a znode created at ``path`` gets (None: ZooKeeper's default, without digest auth)."""
        return self.zk_roles.acl_for(path) if self.zk_roles is not None else None

    def close(self) -> None:
        """End the session: our ephemeral nodes (node registration, election entry) vanish at once."""
        if self.closed:
            return
        self.closed = True
        try:
            self.zk.stop()
            self.zk.close()
        finally:
            self._dispatcher.stop()

    def __enter__(self) -> Metastore:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        return bool(self.zk.connected)

    @property
    def session_id(self) -> int | None:
        cid = self.zk.client_id
        return int(cid[0]) if cid else None

    def submit(self, fn: Callable[[], None], key: Hashable | None = None) -> None:
        """Run ``fn`` on the callback thread, after every callback already queued (keeps event order).

        With a ``key`` (a watch's handle) it replaces the call of that key still
        waiting, in its place: a watch's newest report is the only one that matters.
        """
        self._dispatcher.submit(fn, key)

    def add_state_listener(self, fn: Callable[[str], None]) -> None:
        """Call ``fn("SUSPENDED"|"LOST"|"CONNECTED")`` on the dispatcher thread on every state change."""
        self._state_listeners.append(fn)

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: never block here, hand everything to the dispatcher.
        if self.closed:
            return  # our own close() ends the session; that is not a failure to react to
        if state == KazooState.SUSPENDED:
            log.warning("ZooKeeper connection to %s suspended; pausing writes until it is back", self.hosts)
        elif state == KazooState.LOST:
            log.warning("ZooKeeper session to %s lost; stepping down (ephemeral nodes are gone)", self.hosts)
        elif state == KazooState.CONNECTED:
            log.info("ZooKeeper connection to %s established", self.hosts)
        with self._states_lock:
            self._states = collapse_states([*self._states, str(state)])
        self._dispatcher.submit(self._react_to_states, key=self._react_to_states)

    def _react_to_states(self) -> None:
        """(dispatcher thread) React to every connection state reported since the last time, in order."""
        with self._states_lock:
            states, self._states = self._states, []
        for state in states:
            reactions: list[Callable[[], None] | None] = []
            if state == SUSPENDED:
                reactions.append(self._pause_writes)
            elif state == LOST:
                self._was_lost = True
                reactions.append(self._step_down)
            elif state == CONNECTED:
                if self._was_lost:
                    self._was_lost = False
                    reactions.append(self.nodes.reregister)
                reactions.append(self._resume)
            reactions += [lambda fn=fn, state=state: fn(state) for fn in self._state_listeners]  # type: ignore[misc]
            for react in reactions:
                if react is None:
                    continue
                try:
                    react()
                except Exception:
                    log.exception("metastore reaction to %s failed", state)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run an idempotent operation with retries on ConnectionLoss, bounded by ``op_timeout``."""
        try:
            result: T = self._retry.copy()(fn, *args, **kwargs)
        except RetryFailedError:
            raise MetastoreUnavailable(self.hosts, f"gave up after {self.op_timeout}s of retries") from None
        return result

    def cas(self, path: str, data: bytes, expected_version: int) -> int:
        """One versioned set, resolving a lost reply by reading instead of blindly retrying.

        After ConnectionLoss the set may or may not have happened. If the znode
        now holds our bytes at ``expected_version + 1`` it did; if it is still at
        ``expected_version`` it did not and retrying cannot double-apply;
        anything else is a genuine conflict.
        """
        while True:
            try:
                stat = self.zk.set(path, data, version=expected_version)
                return int(stat.version)
            except (ConnectionLoss, OperationTimeoutError, SessionExpiredError):
                current, stat = self.call(self.zk.get, path)
                if stat.version == expected_version + 1 and current == data:
                    return int(stat.version)
                if stat.version != expected_version:
                    raise BadVersionError() from None
                log.info("CAS on %s lost its reply and did not apply; trying once more", path)

    def watch_data(self, path: str, decode: Callable[[bytes | None, Any], tuple[Any, ...]],
                    callback: Callable[..., None]) -> WatchHandle:
        """A kazoo DataWatch calling ``callback(*decode(data, stat))`` on the dispatcher thread, now and on changes.

        Malformed data (``decode`` raises ValueError) is logged and skipped;
        the watch ends when the handle is cancelled or the metastore closes.
        """
        handle = WatchHandle()

        def on_data(data: bytes | None, stat: Any) -> bool:
            if handle.cancelled or self.closed:
                return False
            try:
                args = decode(data, stat)
            except ValueError:
                log.error("ignoring malformed data at %s: %r", path, data)
                return True
            self._dispatcher.submit(lambda: None if handle.cancelled else callback(*args), key=handle)
            return True

        self.zk.DataWatch(path, on_data)
        return handle
