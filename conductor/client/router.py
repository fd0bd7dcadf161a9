"""Where each task group of a module is led: the one leader router of every Millrace process.

The app client, Spark's planner and executors, and a worker reading another
group's records all need the same thing: the gRPC address of a group's leader,
cheaply, and a fresh answer only after a call found the cached one wrong. The
router reads module specs, group states and node addresses from ZooKeeper on
first use (never data), keeps them, and reads them again when asked to
(``refresh``) or when a watch owned by the caller reports a new group state
(:meth:`LeaderRouter.observe`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from conductor.metastore import GroupState, Metastore, ModuleSpec
from conductor.metastore.nodes import NodeInfo
from conductor.wire.errors import Unavailable


@dataclass
class ModuleRoutes:
    """One module's spec and the state of every task group, as last read or observed."""

    spec: ModuleSpec
    groups: dict[int, GroupState]
    fetched: float = field(default_factory=time.monotonic)


def dial_address(info: NodeInfo, token_port: bool) -> str:
    """The gRPC address a client dials on a worker (its ``NodeInfo``): the main one, or the token port's for an app
    with a bearer token and no certificate ("" if it serves none: no TLS, or --token-port off)."""
    return info.token if token_port else info.address


class LeaderRouter:
    """Cached leaders and node addresses over one metastore session; thread-safe.

    Lookups that hit the cache never block; a miss or a refresh reads
    ZooKeeper in the calling thread. Metastore errors (``ModuleNotFound``,
    ``MetastoreUnavailable``) reach the caller, which knows how to word them.
    """

    def __init__(self, metastore: Metastore, token_port: bool = False) -> None:
        self.metastore = metastore
        #: dial workers' token ports (an app with a bearer token and no certificate), not their main ports
        self.token_port = token_port
        self._lock = threading.Lock()
        self._modules: dict[str, ModuleRoutes] = {}
        self._addresses: dict[str, str] = {}

    def routes(self, module: str, refresh: bool = False) -> ModuleRoutes:
        """The module's spec and group states; read from ZooKeeper when not cached or ``refresh``."""
        cached = self._modules.get(module)  # a dict read is atomic; writers hold the lock
        if cached is not None and not refresh:
            return cached
        # one round trip when the module was seen before (its group count is known)
        spec, groups = self.metastore.modules.get_with_groups(module, cached.spec.threads if cached else None)
        fresh = ModuleRoutes(spec, groups)
        with self._lock:
            self._modules[module] = fresh
        return fresh

    def observe(self, module: str, group: int, state: GroupState) -> GroupState | None:
        """A watch saw ``state``: keep it (if the module is routed here); returns the state it replaces."""
        with self._lock:
            routes = self._modules.get(module)
            if routes is None:
                return None
            old = routes.groups.get(group)
            routes.groups[group] = state
            return old

    def forget_module(self, module: str) -> None:
        with self._lock:
            self._modules.pop(module, None)

    def cached_leader(self, module: str, group: int) -> str | None:
        """The node id of the group's leader if its state is cached (never blocks)."""
        routes = self._modules.get(module)
        st = routes.groups.get(group) if routes is not None else None
        return None if st is None else st.leader

    def cached_address(self, module: str, group: int) -> str | None:
        """The group leader's address if its state and the node's address are cached (never blocks)."""
        leader = self.cached_leader(module, group)
        return None if leader is None else self._addresses.get(leader)

    def leader(self, module: str, group: int, refresh: bool = False) -> tuple[str, int]:
        """(gRPC address, epoch) of the group's leader; Unavailable while it has none or is unregistered.

        A leaderless group is read once more before giving up: the cached
        state may predate the election that repaired it.
        """
        st = self.routes(module, refresh).groups[group]
        if st.leader is None and not refresh:
            st = self.routes(module, True).groups[group]
        if st.leader is None:
            raise Unavailable("UNAVAILABLE", f"task group {module}/{group} has no leader: no in-sync replica "
                              f"of {list(st.isr)} is live; it resumes when one returns (see `conductor status`)")
        address = self.address(st.leader, refresh)
        if address is None:
            raise Unavailable("UNAVAILABLE", f"leader {st.leader} of {module}/{group} is not registered")
        return address, st.epoch

    def address(self, node_id: str, refresh: bool = False) -> str | None:
        """The node's advertised gRPC address (None if it is not registered)."""
        address = None if refresh else self._addresses.get(node_id)
        if address is None:
            info = self.metastore.nodes.get(node_id)
            if info is None:
                return None
            address = dial_address(info, self.token_port)
            if not address:
                raise Unavailable("UNAVAILABLE", f"worker {node_id} serves no token port (it has no TLS, or runs "
                                  "with --token-port off): an app with a bearer token cannot reach it; connect with "
                                  "a certificate (Cluster.connect(..., tls=TlsFiles(...)))")
            self._addresses[node_id] = address
        return address

    def forget(self, node_id: str) -> None:
        """A call to ``node_id`` broke: look its address up again next time (it may have restarted elsewhere)."""
        self._addresses.pop(node_id, None)
