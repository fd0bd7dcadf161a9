"""``/millrace/modules/<module>/groups/<g>``: each task group's leader, epoch, ISR and OSR.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import BadVersionError, NoNodeError

from conductor.metastore.errors import GroupNotFound, ModuleNotFound, VersionConflict
from conductor.metastore.layout import group_path, module_path
from conductor.metastore.watch import WatchHandle
from replog.messages import GroupState

if TYPE_CHECKING:
    from conductor.metastore.session import Metastore



class Groups:
    """Group states: read, watched, and changed only by versioned compare-and-set."""

    def __init__(self, ms: Metastore) -> None:
        self.ms = ms

    def get(self, module: str, group: int) -> tuple[GroupState, int]:
        try:
            data, stat = self.ms.call(self.ms.zk.get, group_path(module, group))
        except NoNodeError:
            raise GroupNotFound(module, group) from None
        return GroupState.from_json(data, stat.version), stat.version

    def all(self, module: str) -> dict[int, tuple[GroupState, int]]:
        try:
            children = self.ms.call(self.ms.zk.get_children, f"{module_path(module)}/groups")
        except NoNodeError:
            raise ModuleNotFound(module) from None
        out: dict[int, tuple[GroupState, int]] = {}
        for child in sorted(children, key=int):
            try:
                out[int(child)] = self.get(module, int(child))
            except GroupNotFound:
                continue
        return out

    def cas(self, module: str, group: int, new_state: GroupState, expected_version: int) -> int:
        """Write ``new_state`` only if the znode is still at ``expected_version``; return the new version.

        Raises ``VersionConflict`` (with the current state) if someone else wrote first.
        """
        new_state.validate()
        path = group_path(module, group)
        try:
            return self.ms.cas(path, new_state.to_json(), expected_version)
        except BadVersionError:
            raise self.conflict(module, group, expected_version) from None
        except NoNodeError:
            raise GroupNotFound(module, group) from None

    def conflict(self, module: str, group: int, expected_version: int) -> VersionConflict:
        try:
            current, version = self.get(module, group)
        except GroupNotFound:
            return VersionConflict(group_path(module, group), expected_version, None, -1)
        return VersionConflict(group_path(module, group), expected_version, current, version)

    def watch(self, module: str, group: int,
                    callback: Callable[[GroupState | None, int], None]) -> WatchHandle:
        """Call ``callback(state, version)`` now and on every change; ``(None, -1)`` once it is deleted."""
        def decode(data: bytes | None, stat: Any) -> tuple[GroupState | None, int]:
            if data is None or stat is None:
                return None, -1
            return GroupState.from_json(data, int(stat.version)), int(stat.version)
        return self.ms.watch_data(group_path(module, group), decode, callback)
