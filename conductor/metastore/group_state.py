"""A task group's leadership and membership as the metastore stores it at ``.../groups/<g>``.

The conductor decides these states (:mod:`conductor.placement`), the
metastore writes them with a versioned compare-and-set, and every client and
worker reads them; validating on construction means no process can store or
act on a state that breaks an invariant (a leader outside the ISR, say).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class InvalidGroupState(ValueError):
    """A group state breaks an invariant (e.g. a leader outside the ISR); refuse it rather than store it."""


@dataclass(frozen=True)
class GroupState:
    """Leadership and membership of one task group, as stored at ``.../groups/<g>``.

    ``replicas`` is the placement in preference order (the first is the
    preferred leader); ``isr`` and ``osr`` partition it. ``leader`` is None
    while no in-sync replica is live. ``leader_session`` is the ZooKeeper
    session id the leader was elected under (0: unknown or no leader); a
    replica only leads while it owns that session.
    """

    leader: str | None
    epoch: int
    isr: tuple[str, ...]
    osr: tuple[str, ...]
    replicas: tuple[str, ...]
    leader_session: int = 0

    def __post_init__(self) -> None:
        # Accept lists from callers but store tuples so states are hashable and immutable.
        for name in ("isr", "osr", "replicas"):
            value = getattr(self, name)
            if not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        self.validate()

    def validate(self) -> None:
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int) or self.epoch < 0:
            raise InvalidGroupState(f"epoch must be a whole number >= 0, got {self.epoch!r}")
        if not self.replicas:
            raise InvalidGroupState("a task group needs at least one replica")
        if len(set(self.replicas)) != len(self.replicas):
            raise InvalidGroupState(f"replicas of a group must be on distinct nodes, got {list(self.replicas)}")
        if not self.isr:
            raise InvalidGroupState("the ISR can never be empty (it keeps its last members while leaderless)")
        if set(self.isr) & set(self.osr):
            raise InvalidGroupState(f"ISR {list(self.isr)} and OSR {list(self.osr)} overlap")
        if set(self.isr) | set(self.osr) != set(self.replicas) or len(self.isr) + len(self.osr) != len(
                self.replicas):
            raise InvalidGroupState(
                f"ISR {list(self.isr)} and OSR {list(self.osr)} must partition the replicas {list(self.replicas)}")
        if self.leader is not None and self.leader not in self.isr:
            raise InvalidGroupState(f"leader {self.leader} is not in the ISR {list(self.isr)}")
        if isinstance(self.leader_session, bool) or not isinstance(self.leader_session, int) \
                or self.leader_session < 0:
            raise InvalidGroupState(f"leader_session must be a session id >= 0, got {self.leader_session!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"leader": self.leader, "epoch": self.epoch, "isr": list(self.isr), "osr": list(self.osr),
                "replicas": list(self.replicas), "leader_session": self.leader_session}

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> GroupState:
        try:
            doc = json.loads(raw)
            return cls(leader=doc["leader"], epoch=doc["epoch"], isr=tuple(doc["isr"]), osr=tuple(doc["osr"]),
                       replicas=tuple(doc["replicas"]), leader_session=int(doc.get("leader_session", 0)))
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidGroupState(f"malformed group state {raw!r}: {e}") from None

    @classmethod
    def initial(cls, replicas: Sequence[str], leader_session: int = 0) -> GroupState:
        """A freshly placed group: every replica in sync (they are all empty), first one leads, epoch 1.

        Replicas start at epoch 0 with an empty epoch cache; leadership is always a move to a
        *higher* epoch, so the first leader's epoch is 1 (a replica ignores a znode at its own epoch).
        """
        return cls(leader=replicas[0], epoch=1, isr=tuple(replicas), osr=(), replicas=tuple(replicas),
                   leader_session=leader_session)
