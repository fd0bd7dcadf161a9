"""The ZooKeeper metastore: the cluster's coordination state (never data), shared by every process.

The conductor, the workers, the client and Spark's planner all read and write
ZooKeeper only through this package, so the znode layout and its race rules
(versioned compare-and-set, re-read after a lost reply) live in one place.
"""

from conductor.metastore.module_spec import ModuleSpec, SpecError
from conductor.metastore.store import (
    DISALLOWED_PATH,
    ELECTION_PATH,
    MODULES_PATH,
    NODES_PATH,
    ROOT,
    GroupNotFound,
    Metastore,
    MetastoreError,
    MetastoreUnavailable,
    ModuleExists,
    ModuleNotFound,
    NodeAlreadyRegistered,
    NodeInfo,
    VersionConflict,
    WatchHandle,
)
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
