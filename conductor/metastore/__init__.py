"""The ZooKeeper metastore: the cluster's coordination state (never data), shared by every process.

The conductor, the workers, the client and Spark's planner read and write
ZooKeeper only through this package, so the znode layout and its race rules
(versioned compare-and-set, re-read after a lost reply) live in one place:
one :class:`Metastore` session with a recipe per znode family
(``ms.nodes``, ``ms.modules``, ``ms.groups``, ``ms.resigns``, ``ms.drains``,
``ms.conductors``), in the style of kazoo's own recipes.
"""

from conductor.metastore.errors import (
    GroupNotFound,
    MetastoreError,
    MetastoreUnavailable,
    ModuleExists,
    ModuleNotFound,
    NodeAlreadyRegistered,
    VersionConflict,
)
from conductor.metastore.layout import DISALLOWED_PATH, ELECTION_PATH, MODULES_PATH, NODES_PATH, ROOT
from conductor.metastore.module_spec import ModuleSpec, SpecError
from conductor.metastore.nodes import NodeInfo
from conductor.metastore.session import Metastore
from conductor.metastore.watch import WatchHandle
from replog.messages import GroupState, InvalidGroupState

__all__ = [
    "DISALLOWED_PATH",
    "ELECTION_PATH",
    "MODULES_PATH",
    "NODES_PATH",
    "ROOT",
    "GroupNotFound",
    "GroupState",
    "InvalidGroupState",
    "Metastore",
    "MetastoreError",
    "MetastoreUnavailable",
    "ModuleExists",
    "ModuleNotFound",
    "ModuleSpec",
    "NodeAlreadyRegistered",
    "NodeInfo",
    "SpecError",
    "VersionConflict",
    "WatchHandle",
]
