"""The metastore's typed errors: each says what happened in ZooKeeper and what to do about it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, RolledBackError

from replog.messages import GroupState


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


def raise_tx_failure(results: list[Any], on_exists: Callable[[], Exception] | None = None,
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
