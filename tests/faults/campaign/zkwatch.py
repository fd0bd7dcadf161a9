"""The history of every group znode, recorded by watching ZooKeeper from the host namespace.

A watch fires once per change it sees; changes made faster than a watch is re-armed are seen as one (the
znode version says how many were skipped). What is recorded is therefore a subsequence of the real history,
which is what the epoch checks need: a subsequence of a sequence that only grows also only grows, and two
leaders recorded for one epoch are two leaders whatever was skipped between them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from conductor.metastore.layout import ELECTION_PATH, group_path
from tests.faults.campaign.cluster import MODULE
from tests.faults.campaign.history import History


@dataclass(frozen=True)
class GroupEvent:
    """One state of a group znode as the recorder saw it."""

    t: float
    group: int
    version: int
    leader: str | None
    epoch: int
    isr: tuple[str, ...]
    replicas: tuple[str, ...]


def bounded(fn: Callable[[], Any], timeout_s: float) -> Any:
    """`fn()` in a helper thread, or None if it raised or did not return within `timeout_s` (kazoo's blocking
    calls wait for a quorum forever, and the nemesis must never wait on the faults it is to heal)."""
    out: list[Any] = []

    def call() -> None:
        with contextlib.suppress(Exception):
            out.append(fn())
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(timeout_s)
    return out[0] if out else None


class GroupRecorder:
    """Watches every group of the campaign's module; `events` in the order seen, `latest` per group."""

    def __init__(self, zk_hosts: str, groups: int, history: History) -> None:
        self.history = history
        self.groups = groups
        quiet = logging.getLogger("millrace.campaign.zk")
        quiet.setLevel(logging.ERROR)
        self.zk = KazooClient(hosts=zk_hosts, timeout=10.0, logger=quiet,
                              connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0))
        self.events: list[GroupEvent] = []
        self.latest: dict[int, GroupEvent] = {}
        self.lock = threading.Lock()

    def start(self) -> GroupRecorder:
        self.zk.start(timeout=30)
        for g in range(self.groups):
            self.zk.DataWatch(group_path(MODULE, g), self._watcher(g))
        return self

    def _watcher(self, group: int) -> Callable[[bytes | None, Any], None]:
        def seen(data: bytes | None, stat: Any) -> None:  # exactly two parameters: kazoo counts them
            self._seen(group, data, stat)
        return seen

    def _seen(self, group: int, data: bytes | None, stat: Any) -> None:
        if data is None or stat is None:
            return
        doc = json.loads(data)
        ev = GroupEvent(self.history.now(), group, stat.version, doc.get("leader"), int(doc["epoch"]),
                        tuple(doc["isr"]), tuple(doc.get("replicas") or ()))
        with self.lock:
            self.events.append(ev)
            self.latest[group] = ev

    def leader(self, group: int) -> str | None:
        with self.lock:
            ev = self.latest.get(group)
        return ev.leader if ev else None

    def followers(self, group: int) -> list[str]:
        with self.lock:
            ev = self.latest.get(group)
        return [r for r in ev.replicas if r != ev.leader] if ev else []

    def leaders(self) -> set[str]:
        with self.lock:
            return {ev.leader for ev in self.latest.values() if ev.leader}

    def active_conductor(self, timeout_s: float = 10.0) -> str | None:
        """The first contender of the conductors' election (None if ZooKeeper does not answer in time)."""
        got = bounded(lambda: self.zk.Election(ELECTION_PATH).contenders(), timeout_s)
        return str(got[0]) if got else None

    def registration_owner(self, path: str, timeout_s: float = 10.0) -> int | None:
        """The session owning the ephemeral znode `path` (None: there is none); raises if ZooKeeper does not
        answer within `timeout_s`."""
        stat = self.zk.exists_async(path).get(timeout=timeout_s)
        return None if stat is None else int(stat.ephemeralOwner)

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()
