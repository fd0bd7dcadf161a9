"""``/millrace/modules/<module>``: deployed modules and their specs (options included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from conductor.metastore.errors import (
    GroupNotFound,
    ModuleExists,
    ModuleNotFound,
    VersionConflict,
    raise_tx_failure,
)
from conductor.metastore.layout import MODULES_PATH, group_path, module_path, version_path
from conductor.metastore.module_spec import ModuleSpec
from conductor.metastore.versions import CodeVersion
from conductor.metastore.watch import WatchHandle
from replog.messages import GroupState

if TYPE_CHECKING:
    from conductor.metastore.session import Metastore



class Modules:
    """Module specs: created with all their groups in one transaction, options changed by CAS."""

    def __init__(self, ms: Metastore) -> None:
        self.ms = ms

    def create(self, spec: ModuleSpec, groups: dict[int, GroupState], version: CodeVersion | None = None) -> None:
        """Create the module znode, all its group znodes and its code version in ONE transaction: all or nothing."""
        if sorted(groups) != list(range(spec.threads)):
            raise ValueError(f"module {spec.name} has {spec.threads} task groups; got states for {sorted(groups)}")
        for g, state in groups.items():
            if len(state.replicas) != spec.replication_factor:
                raise ValueError(f"group {g} has {len(state.replicas)} replicas but the replication factor "
                                 f"is {spec.replication_factor}")
        if (version.sha256 if version else None) != spec.code:
            raise ValueError(f"module {spec.name} runs code version {spec.code} but the version given is "
                             f"{version.sha256 if version else None}")
        mpath = module_path(spec.name)
        tx = self.ms.zk.transaction()
        tx.create(mpath, spec.to_json())
        tx.create(f"{mpath}/groups", b"")
        tx.create(f"{mpath}/resign", b"", acl=self.ms.acl_for(f"{mpath}/resign"))  # workers remove requests
        if version is not None:
            tx.create(f"{mpath}/versions", b"")
            tx.create(version_path(spec.name, version.sha256), version.to_json())
        for g in sorted(groups):
            tx.create(group_path(spec.name, g), groups[g].to_json(), acl=self.ms.acl_for(group_path(spec.name, g)))
        try:
            results = tx.commit()
        except (ConnectionLoss, OperationTimeoutError, SessionExpiredError):
            # The reply was lost: it may have committed. Decide from what is there now.
            if self._matches(spec, groups):
                return
            if self.ms.call(self.ms.zk.exists, mpath) is not None:
                raise ModuleExists(spec.name) from None
            return self.create(spec, groups, version)
        raise_tx_failure(results, on_exists=lambda: ModuleExists(spec.name))

    def _matches(self, spec: ModuleSpec, groups: dict[int, GroupState]) -> bool:
        try:
            found, _ = self.get(spec.name)
            return found == spec and all(self.ms.groups.get(spec.name, g)[0] == s for g, s in groups.items())
        except (ModuleNotFound, GroupNotFound):
            return False

    def get(self, module: str) -> tuple[ModuleSpec, int]:
        """The spec and its znode version (pass it back to change the spec with a CAS)."""
        try:
            data, stat = self.ms.call(self.ms.zk.get, module_path(module))
        except NoNodeError:
            raise ModuleNotFound(module) from None
        return ModuleSpec.from_json(data), stat.version

    def get_with_groups(self, module: str, groups_hint: int | None) -> tuple[ModuleSpec, dict[int, GroupState]]:
        """The spec and each group's state (versions set), as ``get`` and ``ms.groups.all`` read them; in one round
        trip when ``groups_hint`` (the module's group count, as last seen) is right.

        ``get`` then ``groups.all`` cost a round trip per znode, one after
        another (the spec, the list of groups, each group: 4 for two groups,
        1.2-2.2 ms each on a loaded two-core box), and every leader lookup
        that must be fresh pays them: the Spark planner on every job, a client
        or worker after ``NotLeader``. Group znodes are ``0..threads-1`` and
        their number never changes (``create`` makes them with the module; a
        scale keeps it), so a caller that saw the module knows which znodes to
        ask for: the spec and the groups are asked for at once, and ZooKeeper
        answers a session's requests in order, so the replies are what the
        same reads one after another return, one round trip apart instead of
        four. Anything else (no hint, a hint the spec contradicts, a missing
        module or group, a connection error or a timeout) goes the plain way,
        with its retries and typed errors: this path decides no edge case of
        its own.
        """
        if groups_hint:
            found = self._pipelined(module, groups_hint)
            if found is not None:
                return found
        spec, _version = self.get(module)
        return spec, {g: st for g, (st, _v) in self.ms.groups.all(module).items()}

    def _pipelined(self, module: str, groups: int) -> tuple[ModuleSpec, dict[int, GroupState]] | None:
        """The spec and groups ``0..groups-1`` asked for at once; None when that is not the whole answer (no such
        module or group, the spec has another group count) or the session failed meanwhile."""
        try:
            asked = [self.ms.zk.get_async(module_path(module)),
                     *(self.ms.zk.get_async(group_path(module, g)) for g in range(groups))]
            replies: list[Any] = [a.get(timeout=self.ms.op_timeout) for a in asked]
        except (KazooException, KazooTimeoutError):  # NoNodeError included
            return None
        (data, _stat), *group_replies = replies
        spec = ModuleSpec.from_json(data)
        if spec.threads != groups:
            return None
        return spec, {g: GroupState.from_json(d, int(st.version)) for g, (d, st) in enumerate(group_replies)}

    def names(self) -> list[str]:
        return sorted(self.ms.call(self.ms.zk.get_children, MODULES_PATH))

    def delete(self, module: str) -> None:
        """Remove the module and everything under it."""
        if self.ms.call(self.ms.zk.exists, module_path(module)) is None:
            raise ModuleNotFound(module)
        try:
            self.ms.call(self.ms.zk.delete, module_path(module), recursive=True)
        except NoNodeError:
            raise ModuleNotFound(module) from None  # deleted concurrently
        except NotEmptyError:  # a resign request appeared while we deleted: go again
            self.ms.call(self.ms.zk.delete, module_path(module), recursive=True)

    def set_option(self, module: str, key: str, value: str) -> ModuleSpec:
        """Validate and store one dynamic option; a read-modify-write that re-reads on a lost race."""
        while True:
            spec, version = self.get(module)
            updated = spec.with_option(key, value)
            try:
                self.ms.cas(module_path(module), updated.to_json(), version)
                return updated
            except BadVersionError:
                continue  # recompute from the fresh spec: the option is validated again against it
            except NoNodeError:
                raise ModuleNotFound(module) from None

    def update_code(self, spec: ModuleSpec, expected_version: int, version: CodeVersion) -> None:
        """`conductor update`: the spec names a new code version, stored beside the others, in ONE transaction
        that fails (``VersionConflict``) if the spec changed since it was read at ``expected_version``."""
        if spec.code != version.sha256:
            raise ValueError(f"module {spec.name} would run code {spec.code} but the version given is {version.sha256}")
        mpath = module_path(spec.name)
        tx = self.ms.zk.transaction()
        tx.check(mpath, expected_version)
        if self.ms.call(self.ms.zk.exists, f"{mpath}/versions") is None:
            tx.create(f"{mpath}/versions", b"")
        if self.ms.call(self.ms.zk.exists, version_path(spec.name, version.sha256)) is None:
            tx.create(version_path(spec.name, version.sha256), version.to_json())
        tx.set_data(mpath, spec.to_json(), expected_version)
        results = self.ms.call(tx.commit)
        raise_tx_failure(results, on_conflict=lambda: VersionConflict(mpath, expected_version, None, -1))

    def watch(self, module: str, callback: Callable[[ModuleSpec | None], None]) -> WatchHandle:
        """Call ``callback(spec)`` now and on every change of the module's spec (options); ``None`` once deleted."""
        def decode(data: bytes | None, stat: Any) -> tuple[ModuleSpec | None]:
            return (ModuleSpec.from_json(data) if data else None),
        return self.ms.watch_data(module_path(module), decode, callback)
