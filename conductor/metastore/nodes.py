"""``/millrace/nodes/<node-id>``: which workers are live, where they serve, under which session.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kazoo.exceptions import NodeExistsError, NoNodeError

from conductor.metastore.errors import MetastoreError, NodeAlreadyRegistered
from conductor.metastore.layout import NODES_PATH
from conductor.metastore.module_spec import NAME_RE
from conductor.metastore.watch import WatchHandle

if TYPE_CHECKING:
    from conductor.metastore.session import Metastore

log = logging.getLogger("millrace.metastore")


@dataclass(frozen=True)
class NodeInfo:
    """A live worker node as registered in ``/millrace/nodes/<node-id>``."""

    node_id: str
    #: the gRPC address (clients, code, far-horizon checkpoints)
    address: str
    pid: int
    started: float
    #: where peers send replication frames (conductor.worker.peer_server); "" for a worker without one
    replication: str = ""
    #: where its Prometheus endpoint serves /metrics (the conductor's UI scrapes it); "" until it is up
    metrics: str = ""
    #: it serves mutual TLS (False: plaintext, loopback or --insecure; `conductor status` shows it)
    secure: bool = False
    #: where apps holding a bearer token and no certificate call it (server-only TLS); "" when it serves none
    token: str = ""
    #: the Millrace version the worker runs (`conductor.__version__`; the UI and `conductor status` show it)
    version: str = ""

    def to_json(self) -> bytes:
        return json.dumps({"address": self.address, "replication": self.replication, "pid": self.pid,
                           "started": self.started, "metrics": self.metrics, "secure": self.secure,
                           "token": self.token, "version": self.version}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, node_id: str, raw: bytes) -> NodeInfo:
        doc = json.loads(raw)
        return cls(node_id=node_id, address=doc["address"], pid=int(doc["pid"]), started=float(doc["started"]),
                   replication=str(doc.get("replication", "")), metrics=str(doc.get("metrics", "")),
                   secure=bool(doc.get("secure", False)), token=str(doc.get("token", "")),
                   version=str(doc.get("version", "")))


class Nodes:
    """Live workers (ephemeral znodes); re-created after the session that owned them was lost."""

    def __init__(self, ms: Metastore) -> None:
        self.ms = ms
        #: node id -> the NodeInfo this session registered (re-registered as it was after a lost session)
        self._registered: dict[str, NodeInfo] = {}
        #: node id -> metrics address advertised by this session (kept across a re-registration)
        self._metrics: dict[str, str] = {}

    def register(self, node_id: str, address: str, *, replication: str = "", stale_wait_s: float = 0.0,
                 secure: bool = False, token: str = "", version: str = "") -> NodeInfo:
        """Announce a live worker node (ephemeral: it disappears when this session ends).

        A worker restarted right after a crash finds its id still held by the crashed process's session
        until ZooKeeper expires it; ``stale_wait_s`` is how long to wait for that before raising
        NodeAlreadyRegistered (a live worker using the same id holds it for good, so it still fails).
        """
        if not NAME_RE.match(node_id):
            raise ValueError(f"bad node id {node_id!r}: use letters, digits, '_', '-' or '.', starting with a letter")
        info = NodeInfo(node_id=node_id, address=address, pid=os.getpid(), started=time.time(),
                        replication=replication, metrics=self._metrics.get(node_id, ""), secure=secure,
                        token=token, version=version)
        path = f"{NODES_PATH}/{node_id}"

        def attempt() -> None:
            while True:
                try:
                    self.ms.zk.create(path, info.to_json(), ephemeral=True, acl=self.ms.acl_for(path))
                    return
                except NodeExistsError:
                    pass
                # Ours if an earlier attempt's reply was lost; otherwise someone else's.
                try:
                    _, stat = self.ms.zk.get(path)
                except NoNodeError:
                    continue  # its holder's session ended between our create and this read: create again
                if stat.ephemeralOwner != self.ms.session_id:
                    raise NodeAlreadyRegistered(node_id, stat.ephemeralOwner)
                self.ms.zk.set(path, info.to_json())
                return

        deadline = time.monotonic() + stale_wait_s
        while True:
            try:
                self.ms.call(attempt)
                break
            except NodeAlreadyRegistered as e:
                if time.monotonic() >= deadline:
                    raise
                log.warning("%s; waiting up to %.0f s for that session to expire", e, deadline - time.monotonic())
                time.sleep(0.25)
        self._registered[node_id] = info
        return info

    def advertise_metrics(self, node_id: str, metrics: str) -> None:
        """Add the address of a registered node's Prometheus endpoint to its znode (the endpoint starts after
        the node registered). Only this session's own znode is rewritten, so a stale worker cannot overwrite a
        newer one's; a re-registration after a lost session keeps the address."""
        assert node_id in self._registered, f"node {node_id} is not registered by this session"
        self._metrics[node_id] = metrics
        path = f"{NODES_PATH}/{node_id}"

        def rewrite() -> None:
            data, stat = self.ms.zk.get(path)
            if stat.ephemeralOwner != self.ms.session_id:
                return  # the session that owned it ended: reregister() writes the address with the new znode
            info = NodeInfo.from_json(node_id, data)
            self.ms.zk.set(path, replace(info, metrics=metrics).to_json(), version=stat.version)

        try:
            self.ms.call(rewrite)
        except NoNodeError:
            pass  # gone with its session; reregister() puts the address back

    def unregister(self, node_id: str) -> None:
        self._registered.pop(node_id, None)
        self._metrics.pop(node_id, None)
        try:
            self.ms.call(self.ms.zk.delete, f"{NODES_PATH}/{node_id}")
        except NoNodeError:
            pass

    def live(self) -> list[str]:
        """Node ids with a live session, sorted."""
        return sorted(self.ms.call(self.ms.zk.get_children, NODES_PATH))

    def sessions(self) -> dict[str, int]:
        """Live node id -> the ZooKeeper session id that owns its znode.

        Leadership is bound to a session (``GroupState.leader_session``): a node
        that restarted under the same id has a new session and must not keep
        leading as if nothing happened.
        """
        out: dict[str, int] = {}
        for node_id in self.live():
            stat = self.ms.call(self.ms.zk.exists, f"{NODES_PATH}/{node_id}")
            if stat is not None:
                out[node_id] = int(stat.ephemeralOwner)
        return out

    def get(self, node_id: str) -> NodeInfo | None:
        try:
            data, _ = self.ms.call(self.ms.zk.get, f"{NODES_PATH}/{node_id}")
        except NoNodeError:
            return None
        return NodeInfo.from_json(node_id, data)

    def watch(self, callback: Callable[[list[str]], None]) -> WatchHandle:
        """Call ``callback(sorted live node ids)`` now and on every change (on the dispatcher thread)."""
        handle = WatchHandle()

        def on_children(children: list[str]) -> bool:
            if handle.cancelled or self.ms.closed:
                return False
            nodes = sorted(children)
            self.ms.submit(lambda: None if handle.cancelled else callback(nodes), key=handle)
            return True

        self.ms.zk.ChildrenWatch(NODES_PATH, on_children)
        return handle

    def reregister(self) -> None:
        """A new session after LOST: our node znodes expired with the old one, so create them again."""
        for node_id, was in list(self._registered.items()):
            try:
                self.register(node_id, was.address, replication=was.replication, secure=was.secure, token=was.token,
                              version=was.version)
                log.info("re-registered node %s after session loss", node_id)
            except MetastoreError as e:
                log.error("could not re-register node %s: %s", node_id, e)
