"""The ZooKeeper metastore: the cluster's coordination state, and only that.

Layout (DESIGN.md section 5)::

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
* kazoo calls listeners and watch functions on its own event thread, where
  blocking is forbidden (a blocking ZooKeeper call there can deadlock the
  client). Every user callback therefore runs on one dispatcher thread owned
  by the Metastore, in the order the events happened.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.election import Election
from kazoo.retry import KazooRetry, RetryFailedError

from conductor.metastore.module_spec import NAME_RE, ModuleSpec
from replog.messages import GroupState

__all__ = [
    "DISALLOWED_PATH",
    "ELECTION_PATH",
    "MODULES_PATH",
    "NODES_PATH",
    "ROOT",
    "GroupNotFound",
    "GroupState",
    "Metastore",
    "MetastoreError",
    "MetastoreUnavailable",
    "ModuleExists",
    "ModuleNotFound",
    "NodeAlreadyRegistered",
    "NodeInfo",
    "VersionConflict",
    "WatchHandle",
]

log = logging.getLogger("millrace.metastore")

ROOT = "/millrace"
ELECTION_PATH = f"{ROOT}/conductor/election"
NODES_PATH = f"{ROOT}/nodes"
MODULES_PATH = f"{ROOT}/modules"
DISALLOWED_PATH = f"{ROOT}/disallowed"

T = TypeVar("T")


# ---- errors ---------------------------------------------------------------------------------------


class MetastoreError(Exception):
    """Base of every metastore error."""


class MetastoreUnavailable(MetastoreError):
    """ZooKeeper could not be reached within the deadline; nothing was changed (or see the message)."""

    def __init__(self, hosts: str, what: str) -> None:
        self.hosts = hosts
        super().__init__(f"ZooKeeper at {hosts} is unreachable ({what}); check it is running "
                         "(`conductor doctor`) and retry")


class VersionConflict(MetastoreError):
    """A compare-and-set lost a race: someone changed the group first. Re-decide from ``current``."""

    def __init__(self, path: str, expected_version: int, current: GroupState | None,
                 current_version: int) -> None:
        self.path = path
        self.expected_version = expected_version
        self.current = current
        self.current_version = current_version
        super().__init__(f"{path} changed concurrently: expected version {expected_version}, it is now "
                         f"version {current_version} ({current.to_dict() if current else 'deleted'}); "
                         "re-read and retry")


class ModuleNotFound(MetastoreError):
    def __init__(self, module: str) -> None:
        self.module = module
        super().__init__(f"module {module!r} is not deployed; `conductor status` lists deployed modules")


class ModuleExists(MetastoreError):
    def __init__(self, module: str) -> None:
        self.module = module
        super().__init__(f"module {module!r} is already deployed; use `conductor update` or destroy it first")


class GroupNotFound(MetastoreError):
    def __init__(self, module: str, group: int) -> None:
        self.module = module
        self.group = group
        super().__init__(f"task group {module}/{group} does not exist")


class NodeAlreadyRegistered(MetastoreError):
    """Another live session owns this node id: a duplicate worker, or our previous session not yet expired."""

    def __init__(self, node_id: str, owner: int) -> None:
        self.node_id = node_id
        self.owner = owner
        super().__init__(f"node id {node_id!r} is already registered by ZooKeeper session {owner:#x}; another "
                         "worker uses this id, or a crashed one's session has not expired yet (wait for the "
                         "session timeout, or pick another node id)")


# ---- values ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeInfo:
    """A live worker node as registered in ``/millrace/nodes/<node-id>``."""

    node_id: str
    address: str
    pid: int
    started: float

    def to_json(self) -> bytes:
        return json.dumps({"address": self.address, "pid": self.pid, "started": self.started},
                          sort_keys=True).encode()

    @classmethod
    def from_json(cls, node_id: str, raw: bytes) -> NodeInfo:
        doc = json.loads(raw)
        return cls(node_id=node_id, address=doc["address"], pid=int(doc["pid"]), started=float(doc["started"]))


class WatchHandle:
    """Returned by ``watch_*``; ``cancel()`` stops further callbacks (kazoo drops the watch on its next event)."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def module_path(module: str) -> str:
    return f"{MODULES_PATH}/{module}"


def group_path(module: str, group: int) -> str:
    return f"{MODULES_PATH}/{module}/groups/{group}"


def resign_path(module: str, group: int) -> str:
    return f"{MODULES_PATH}/{module}/resign/{group}"


# ---- the dispatcher -------------------------------------------------------------------------------


class _Dispatcher:
    """One thread running callbacks in event order, so none of them ever runs on kazoo's threads."""

    def __init__(self, name: str) -> None:
        self._q: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None]) -> None:
        self._q.put(fn)

    def _run(self) -> None:
        while True:
            fn = self._q.get()
            if fn is None:
                return
            try:
                fn()
            except Exception:
                log.exception("metastore callback failed")

    def stop(self) -> None:
        self._q.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)


# ---- the metastore --------------------------------------------------------------------------------


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
                 resume: Callable[[], None] | None = None) -> None:
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
        self.zk = KazooClient(hosts=hosts, timeout=session_timeout, connection_retry=conn_retry,
                              command_retry=cmd_retry)
        # ignore_expire: right after a session expires, calls fail with SessionExpiredError until kazoo
        # has a new session; for the idempotent operations run through _call that is just another retry.
        self._retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0, deadline=self.op_timeout,
                                 ignore_expire=True)
        self._dispatcher = _Dispatcher(f"metastore-callbacks-{hosts}")
        self._registered: dict[str, str] = {}
        self._was_lost = False
        self._closed = False
        self.zk.add_listener(self._on_state)

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Metastore:
        """Connect and make sure the top-level paths exist."""
        try:
            self.zk.start(timeout=self.connect_timeout)
        except KazooTimeoutError:
            self.zk.stop()
            self.zk.close()
            self._dispatcher.stop()
            raise MetastoreUnavailable(self.hosts, f"no connection within {self.connect_timeout}s") from None
        for path in (f"{ROOT}/conductor", NODES_PATH, MODULES_PATH, DISALLOWED_PATH):
            self._call(self.zk.ensure_path, path)
        return self

    def close(self) -> None:
        """End the session: our ephemeral nodes (node registration, election entry) vanish at once."""
        if self._closed:
            return
        self._closed = True
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

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the callback thread, after every callback already queued (keeps event order)."""
        self._dispatcher.submit(fn)

    def add_state_listener(self, fn: Callable[[str], None]) -> None:
        """Call ``fn("SUSPENDED"|"LOST"|"CONNECTED")`` on the dispatcher thread on every state change."""
        self._state_listeners.append(fn)

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's event thread: never block here, hand everything to the dispatcher.
        if self._closed:
            return  # our own close() ends the session; that is not a failure to react to
        if state == KazooState.SUSPENDED:
            log.warning("ZooKeeper connection to %s suspended; pausing writes until it is back", self.hosts)
            if self._pause_writes:
                self._dispatcher.submit(self._pause_writes)
        elif state == KazooState.LOST:
            log.warning("ZooKeeper session to %s lost; stepping down (ephemeral nodes are gone)", self.hosts)
            self._was_lost = True
            if self._step_down:
                self._dispatcher.submit(self._step_down)
        elif state == KazooState.CONNECTED:
            log.info("ZooKeeper connection to %s established", self.hosts)
            was_lost, self._was_lost = self._was_lost, False
            if was_lost and self._registered:
                self._dispatcher.submit(self._reregister)
            if self._resume:
                self._dispatcher.submit(self._resume)
        for fn in list(self._state_listeners):
            self._dispatcher.submit(lambda fn=fn: fn(str(state)))  # type: ignore[misc]

    def _reregister(self) -> None:
        """A new session after LOST: our node znodes expired with the old one, so create them again."""
        for node_id, address in list(self._registered.items()):
            try:
                self.register_node(node_id, address)
                log.info("re-registered node %s after session loss", node_id)
            except MetastoreError as e:
                log.error("could not re-register node %s: %s", node_id, e)

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run an idempotent operation with retries on ConnectionLoss, bounded by ``op_timeout``."""
        try:
            result: T = self._retry.copy()(fn, *args, **kwargs)
        except RetryFailedError:
            raise MetastoreUnavailable(self.hosts, f"gave up after {self.op_timeout}s of retries") from None
        return result

    # ---- nodes ----------------------------------------------------------------------------------

    def register_node(self, node_id: str, address: str) -> NodeInfo:
        """Announce a live worker node (ephemeral: it disappears when this session ends)."""
        if not NAME_RE.match(node_id):
            raise ValueError(f"bad node id {node_id!r}: use letters, digits, '_', '-' or '.', starting with a letter")
        info = NodeInfo(node_id=node_id, address=address, pid=os.getpid(), started=time.time())
        path = f"{NODES_PATH}/{node_id}"

        def attempt() -> None:
            try:
                self.zk.create(path, info.to_json(), ephemeral=True)
            except NodeExistsError:
                # Ours if an earlier attempt's reply was lost; otherwise someone else's.
                _, stat = self.zk.get(path)
                if stat.ephemeralOwner != self.session_id:
                    raise NodeAlreadyRegistered(node_id, stat.ephemeralOwner) from None
                self.zk.set(path, info.to_json())

        self._call(attempt)
        self._registered[node_id] = address
        return info

    def unregister_node(self, node_id: str) -> None:
        self._registered.pop(node_id, None)
        try:
            self._call(self.zk.delete, f"{NODES_PATH}/{node_id}")
        except NoNodeError:
            pass

    def live_nodes(self) -> list[str]:
        """Node ids with a live session, sorted."""
        return sorted(self._call(self.zk.get_children, NODES_PATH))

    def live_sessions(self) -> dict[str, int]:
        """Live node id -> the ZooKeeper session id that owns its znode.

        Leadership is bound to a session (``GroupState.leader_session``): a node
        that restarted under the same id has a new session and must not keep
        leading as if nothing happened.
        """
        out: dict[str, int] = {}
        for node_id in self.live_nodes():
            stat = self._call(self.zk.exists, f"{NODES_PATH}/{node_id}")
            if stat is not None:
                out[node_id] = int(stat.ephemeralOwner)
        return out

    def get_node(self, node_id: str) -> NodeInfo | None:
        try:
            data, _ = self._call(self.zk.get, f"{NODES_PATH}/{node_id}")
        except NoNodeError:
            return None
        return NodeInfo.from_json(node_id, data)

    def watch_nodes(self, callback: Callable[[list[str]], None]) -> WatchHandle:
        """Call ``callback(sorted live node ids)`` now and on every change (on the dispatcher thread)."""
        handle = WatchHandle()

        def on_children(children: list[str]) -> bool:
            if handle.cancelled or self._closed:
                return False
            nodes = sorted(children)
            self._dispatcher.submit(lambda: None if handle.cancelled else callback(nodes))
            return True

        self.zk.ChildrenWatch(NODES_PATH, on_children)
        return handle

    # ---- modules --------------------------------------------------------------------------------

    def create_module(self, spec: ModuleSpec, groups: dict[int, GroupState]) -> None:
        """Create the module znode and all its group znodes in ONE transaction: all or nothing."""
        if sorted(groups) != list(range(spec.threads)):
            raise ValueError(f"module {spec.name} has {spec.threads} task groups; got states for {sorted(groups)}")
        for g, state in groups.items():
            if len(state.replicas) != spec.replication_factor:
                raise ValueError(f"group {g} has {len(state.replicas)} replicas but the replication factor "
                                 f"is {spec.replication_factor}")
        mpath = module_path(spec.name)
        tx = self.zk.transaction()
        tx.create(mpath, spec.to_json())
        tx.create(f"{mpath}/groups", b"")
        tx.create(f"{mpath}/resign", b"")
        for g in sorted(groups):
            tx.create(group_path(spec.name, g), groups[g].to_json())
        try:
            results = tx.commit()
        except (ConnectionLoss, OperationTimeoutError, SessionExpiredError):
            # The reply was lost: it may have committed. Decide from what is there now.
            if self._module_matches(spec, groups):
                return
            if self._call(self.zk.exists, mpath) is not None:
                raise ModuleExists(spec.name) from None
            return self.create_module(spec, groups)
        self._raise_tx_failure(results, on_exists=lambda: ModuleExists(spec.name))

    def _module_matches(self, spec: ModuleSpec, groups: dict[int, GroupState]) -> bool:
        try:
            found, _ = self.get_module(spec.name)
            return found == spec and all(self.get_group(spec.name, g)[0] == s for g, s in groups.items())
        except (ModuleNotFound, GroupNotFound):
            return False

    @staticmethod
    def _raise_tx_failure(results: list[Any], on_exists: Callable[[], Exception] | None = None,
                          on_conflict: Callable[[], Exception] | None = None) -> None:
        """Inspect every transaction result; the first real failure (not a rollback) becomes a typed error."""
        failures = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
        if not failures and not any(isinstance(r, Exception) for r in results):
            return
        cause = failures[0] if failures else RolledBackError()
        if isinstance(cause, NodeExistsError) and on_exists:
            raise on_exists() from cause
        if isinstance(cause, BadVersionError) and on_conflict:
            raise on_conflict() from cause
        raise MetastoreError(f"transaction failed: {cause!r} (results {results!r})") from cause

    def get_module(self, module: str) -> tuple[ModuleSpec, int]:
        """The spec and its znode version (pass it back to change the spec with a CAS)."""
        try:
            data, stat = self._call(self.zk.get, module_path(module))
        except NoNodeError:
            raise ModuleNotFound(module) from None
        return ModuleSpec.from_json(data), stat.version

    def list_modules(self) -> list[str]:
        return sorted(self._call(self.zk.get_children, MODULES_PATH))

    def delete_module(self, module: str) -> None:
        """Remove the module and everything under it."""
        if self._call(self.zk.exists, module_path(module)) is None:
            raise ModuleNotFound(module)
        try:
            self._call(self.zk.delete, module_path(module), recursive=True)
        except NoNodeError:
            raise ModuleNotFound(module) from None  # deleted concurrently
        except NotEmptyError:  # a resign request appeared while we deleted: go again
            self._call(self.zk.delete, module_path(module), recursive=True)

    def set_option(self, module: str, key: str, value: str) -> ModuleSpec:
        """Validate and store one dynamic option; a read-modify-write that re-reads on a lost race."""
        while True:
            spec, version = self.get_module(module)
            updated = spec.with_option(key, value)
            try:
                self._cas(module_path(module), updated.to_json(), version)
                return updated
            except BadVersionError:
                continue  # recompute from the fresh spec: the option is validated again against it
            except NoNodeError:
                raise ModuleNotFound(module) from None

    # ---- groups ---------------------------------------------------------------------------------

    def get_group(self, module: str, group: int) -> tuple[GroupState, int]:
        try:
            data, stat = self._call(self.zk.get, group_path(module, group))
        except NoNodeError:
            raise GroupNotFound(module, group) from None
        return GroupState.from_json(data, stat.version), stat.version

    def list_groups(self, module: str) -> dict[int, tuple[GroupState, int]]:
        try:
            children = self._call(self.zk.get_children, f"{module_path(module)}/groups")
        except NoNodeError:
            raise ModuleNotFound(module) from None
        out: dict[int, tuple[GroupState, int]] = {}
        for child in sorted(children, key=int):
            try:
                out[int(child)] = self.get_group(module, int(child))
            except GroupNotFound:
                continue
        return out

    def cas_group(self, module: str, group: int, new_state: GroupState, expected_version: int) -> int:
        """Write ``new_state`` only if the znode is still at ``expected_version``; return the new version.

        Raises ``VersionConflict`` (with the current state) if someone else wrote first.
        """
        new_state.validate()
        path = group_path(module, group)
        try:
            return self._cas(path, new_state.to_json(), expected_version)
        except BadVersionError:
            raise self._conflict(module, group, expected_version) from None
        except NoNodeError:
            raise GroupNotFound(module, group) from None

    def _conflict(self, module: str, group: int, expected_version: int) -> VersionConflict:
        try:
            current, version = self.get_group(module, group)
        except GroupNotFound:
            return VersionConflict(group_path(module, group), expected_version, None, -1)
        return VersionConflict(group_path(module, group), expected_version, current, version)

    def _cas(self, path: str, data: bytes, expected_version: int) -> int:
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
                current, stat = self._call(self.zk.get, path)
                if stat.version == expected_version + 1 and current == data:
                    return int(stat.version)
                if stat.version != expected_version:
                    raise BadVersionError() from None
                log.info("CAS on %s lost its reply and did not apply; trying once more", path)

    def _watch_data(self, path: str, decode: Callable[[bytes | None, Any], tuple[Any, ...]],
                    callback: Callable[..., None]) -> WatchHandle:
        """A kazoo DataWatch calling ``callback(*decode(data, stat))`` on the dispatcher thread, now and on changes.

        Malformed data (``decode`` raises ValueError) is logged and skipped;
        the watch ends when the handle is cancelled or the metastore closes.
        """
        handle = WatchHandle()

        def on_data(data: bytes | None, stat: Any) -> bool:
            if handle.cancelled or self._closed:
                return False
            try:
                args = decode(data, stat)
            except ValueError:
                log.error("ignoring malformed data at %s: %r", path, data)
                return True
            self._dispatcher.submit(lambda: None if handle.cancelled else callback(*args))
            return True

        self.zk.DataWatch(path, on_data)
        return handle

    def watch_group(self, module: str, group: int,
                    callback: Callable[[GroupState | None, int], None]) -> WatchHandle:
        """Call ``callback(state, version)`` now and on every change; ``(None, -1)`` once it is deleted."""
        def decode(data: bytes | None, stat: Any) -> tuple[GroupState | None, int]:
            if data is None or stat is None:
                return None, -1
            return GroupState.from_json(data, int(stat.version)), int(stat.version)
        return self._watch_data(group_path(module, group), decode, callback)

    # ---- leader hand-off (balancing) ----------------------------------------------------------------

    def request_resign(self, module: str, group: int, to: str, epoch: int, to_session: int = 0) -> None:
        """Ask the leader of ``group`` at ``epoch`` to hand leadership to ``to`` when it is caught up.

        ``to`` will lead under ``to_session`` (its live ZooKeeper session now):
        if it restarts before the hand-off lands, the conductor treats it as a
        lost leader. The leader performs the hand-off with ``complete_resign``;
        the epoch makes a request stale (and ignorable) once leadership changed anyway.
        """
        doc = json.dumps({"to": to, "to_session": to_session, "epoch": epoch, "requested": time.time()},
                         sort_keys=True).encode()
        path = resign_path(module, group)

        def attempt() -> None:
            try:
                self.zk.create(path, doc)
            except NodeExistsError:
                self.zk.set(path, doc)
            except NoNodeError:
                raise ModuleNotFound(module) from None

        self._call(attempt)

    def get_resign(self, module: str, group: int) -> dict[str, Any] | None:
        try:
            data, _ = self._call(self.zk.get, resign_path(module, group))
        except NoNodeError:
            return None
        result: dict[str, Any] = json.loads(data)
        return result

    def list_resigns(self, module: str) -> dict[int, dict[str, Any]]:
        """Outstanding resign requests of ``module`` by group (including stale ones; compare their epoch)."""
        base = f"{module_path(module)}/resign"
        try:
            children = self._call(self.zk.get_children, base)
        except NoNodeError:
            return {}
        out: dict[int, dict[str, Any]] = {}
        for child in sorted(children, key=int):
            doc = self.get_resign(module, int(child))
            if doc is not None:
                out[int(child)] = doc
        return out

    def delete_resign(self, module: str, group: int) -> None:
        """Withdraw a resign request (stale, or given up by its leader); a missing one is fine."""
        try:
            self._call(self.zk.delete, resign_path(module, group))
        except NoNodeError:
            pass

    def watch_module(self, module: str, callback: Callable[[ModuleSpec | None], None]) -> WatchHandle:
        """Call ``callback(spec)`` now and on every change of the module's spec (options); ``None`` once deleted."""
        def decode(data: bytes | None, stat: Any) -> tuple[ModuleSpec | None]:
            return (ModuleSpec.from_json(data) if data else None),
        return self._watch_data(module_path(module), decode, callback)

    def watch_resign(self, module: str, group: int,
                     callback: Callable[[dict[str, Any] | None], None]) -> WatchHandle:
        """Call ``callback(request)`` now and whenever the group's resign request is set, ``None`` once gone."""
        def decode(data: bytes | None, stat: Any) -> tuple[dict[str, Any] | None]:
            return (json.loads(data) if data else None),
        return self._watch_data(resign_path(module, group), decode, callback)

    def complete_resign(self, module: str, group: int, new_state: GroupState, expected_version: int) -> int:
        """Atomically CAS the group to ``new_state`` and delete the resign request; return the new version."""
        new_state.validate()
        tx = self.zk.transaction()
        tx.set_data(group_path(module, group), new_state.to_json(), version=expected_version)
        tx.delete(resign_path(module, group))
        try:
            results = tx.commit()
        except (ConnectionLoss, OperationTimeoutError, SessionExpiredError):
            current, version = self.get_group(module, group)
            if version == expected_version + 1 and current == new_state:
                return version
            if version != expected_version:
                raise self._conflict(module, group, expected_version) from None
            return self.complete_resign(module, group, new_state, expected_version)
        if isinstance(results[0], BadVersionError):
            raise self._conflict(module, group, expected_version)
        if isinstance(results[0], NoNodeError):
            raise GroupNotFound(module, group)
        if isinstance(results[1], NoNodeError):
            # The request was withdrawn (or already served); the hand-off itself is still a plain CAS.
            return self.cas_group(module, group, new_state, expected_version)
        self._raise_tx_failure(results)
        return int(results[0].version)

    # ---- leadership drains -----------------------------------------------------------------------

    def disallow_leaders(self, node_id: str) -> None:
        """Drain ``node_id`` of leadership: balancing moves its leaders away, elections prefer others."""
        try:
            self._call(self.zk.create, f"{DISALLOWED_PATH}/{node_id}", b"", makepath=True)
        except NodeExistsError:
            pass

    def allow_leaders(self, node_id: str) -> bool:
        """Undo ``disallow_leaders``; False if the node was not disallowed."""
        try:
            self._call(self.zk.delete, f"{DISALLOWED_PATH}/{node_id}")
        except NoNodeError:
            return False
        return True

    def disallowed_nodes(self) -> set[str]:
        """Nodes drained of leadership (they may still hold follower replicas)."""
        try:
            return set(self._call(self.zk.get_children, DISALLOWED_PATH))
        except NoNodeError:
            return set()

    # ---- conductor election ---------------------------------------------------------------------

    def election(self, identifier: str) -> Election:
        """A kazoo Election on ``/millrace/conductor/election`` for this session."""
        return self.zk.Election(ELECTION_PATH, identifier)

    def conductor_contenders(self) -> list[str]:
        """Conductor names in election order; the first one is active."""
        return list(self._call(self.election("").contenders))
