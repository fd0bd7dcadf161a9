"""``/millrace/modules/<module>/resign/<g>``: coordinated leader hand-offs (leadership balancing).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)

from conductor.metastore.errors import GroupNotFound, ModuleNotFound, raise_tx_failure
from conductor.metastore.layout import group_path, module_path, resign_path
from conductor.metastore.watch import WatchHandle
from replog.messages import GroupState

if TYPE_CHECKING:
    from conductor.metastore.session import Metastore



class Resigns:
    """Leader hand-off requests: the conductor asks, the leader completes them atomically with its CAS."""

    def __init__(self, ms: Metastore) -> None:
        self.ms = ms

    def request(self, module: str, group: int, to: str, epoch: int, to_session: int = 0) -> None:
        """Ask the leader of ``group`` at ``epoch`` to hand leadership to ``to`` when it is caught up.

        ``to`` will lead under ``to_session`` (its live ZooKeeper session now):
        if it restarts before the hand-off lands, the conductor treats it as a
        lost leader. The leader performs the hand-off with ``complete``;
        the epoch makes a request stale (and ignorable) once leadership changed anyway.
        """
        doc = json.dumps({"to": to, "to_session": to_session, "epoch": epoch, "requested": time.time()},
                         sort_keys=True).encode()
        path = resign_path(module, group)

        def attempt() -> None:
            try:
                self.ms.zk.create(path, doc)
            except NodeExistsError:
                self.ms.zk.set(path, doc)
            except NoNodeError:
                raise ModuleNotFound(module) from None

        self.ms.call(attempt)

    def get(self, module: str, group: int) -> dict[str, Any] | None:
        try:
            data, _ = self.ms.call(self.ms.zk.get, resign_path(module, group))
        except NoNodeError:
            return None
        result: dict[str, Any] = json.loads(data)
        return result

    def all(self, module: str) -> dict[int, dict[str, Any]]:
        """Outstanding resign requests of ``module`` by group (including stale ones; compare their epoch)."""
        base = f"{module_path(module)}/resign"
        try:
            children = self.ms.call(self.ms.zk.get_children, base)
        except NoNodeError:
            return {}
        out: dict[int, dict[str, Any]] = {}
        for child in sorted(children, key=int):
            doc = self.get(module, int(child))
            if doc is not None:
                out[int(child)] = doc
        return out

    def delete(self, module: str, group: int) -> None:
        """Withdraw a resign request (stale, or given up by its leader); a missing one is fine."""
        try:
            self.ms.call(self.ms.zk.delete, resign_path(module, group))
        except NoNodeError:
            pass

    def watch(self, module: str, group: int,
                     callback: Callable[[dict[str, Any] | None], None]) -> WatchHandle:
        """Call ``callback(request)`` now and whenever the group's resign request is set, ``None`` once gone."""
        def decode(data: bytes | None, stat: Any) -> tuple[dict[str, Any] | None]:
            return (json.loads(data) if data else None),
        return self.ms.watch_data(resign_path(module, group), decode, callback)

    def complete(self, module: str, group: int, new_state: GroupState, expected_version: int) -> int:
        """Atomically CAS the group to ``new_state`` and delete the resign request; return the new version."""
        new_state.validate()
        tx = self.ms.zk.transaction()
        tx.set_data(group_path(module, group), new_state.to_json(), version=expected_version)
        tx.delete(resign_path(module, group))
        try:
            results = tx.commit()
        except (ConnectionLoss, OperationTimeoutError, SessionExpiredError):
            current, version = self.ms.groups.get(module, group)
            if version == expected_version + 1 and current == new_state:
                return version
            if version != expected_version:
                raise self.ms.groups.conflict(module, group, expected_version) from None
            return self.complete(module, group, new_state, expected_version)
        if isinstance(results[0], BadVersionError):
            raise self.ms.groups.conflict(module, group, expected_version)
        if isinstance(results[0], NoNodeError):
            raise GroupNotFound(module, group)
        if isinstance(results[1], NoNodeError):
            # The request was withdrawn (or already served); the hand-off itself is still a plain CAS.
            return self.ms.groups.cas(module, group, new_state, expected_version)
        raise_tx_failure(results)
        return int(results[0].version)
