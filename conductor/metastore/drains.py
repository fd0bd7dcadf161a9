"""``/millrace/disallowed/<node-id>``: nodes drained of leadership (`conductor disallow-leaders`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kazoo.exceptions import NodeExistsError, NoNodeError

from conductor.metastore.layout import DISALLOWED_PATH

if TYPE_CHECKING:
    from conductor.metastore.session import Metastore



class LeaderDrains:
    """Nodes drained of leadership: balancing moves their leaders away, elections prefer others."""

    def __init__(self, ms: Metastore) -> None:
        self.ms = ms

    def disallow(self, node_id: str) -> None:
        """Drain ``node_id`` of leadership: balancing moves its leaders away, elections prefer others."""
        try:
            self.ms.call(self.ms.zk.create, f"{DISALLOWED_PATH}/{node_id}", b"", makepath=True)
        except NodeExistsError:
            pass

    def allow(self, node_id: str) -> bool:
        """Undo ``disallow_leaders``; False if the node was not disallowed."""
        try:
            self.ms.call(self.ms.zk.delete, f"{DISALLOWED_PATH}/{node_id}")
        except NoNodeError:
            return False
        return True

    def nodes(self) -> set[str]:
        """Nodes drained of leadership (they may still hold follower replicas)."""
        try:
            return set(self.ms.call(self.ms.zk.get_children, DISALLOWED_PATH))
        except NoNodeError:
            return set()
