"""PStates and depots on RocksDB: schemas, paths, subindexing, atomic apply, checkpoints.

Quick tour::

    from pstate import Map, Set, Record, P, TaskGroupStore

    store = TaskGroupStore("state", {"$$counts": Map(str, int),
                                     "$$users": Map(str, Record(age=int, follows=Set(str).subindexed()))},
                           depots=["*sentences"])
    cs = store.changes()                                  # leader: build one replog entry
    cs.transform("$$counts", P.key("cat").null_to_val(0).update(lambda n: n + 1))
    cs.transform("$$users", P.key("al").key("follows").add("bo"))
    cs.depot_append("*sentences", 0, ["the cat sat"])
    payload = cs.encode()                                 # resolved writes, no code
    store.apply(offset, payload)                          # leader and followers: atomic, idempotent
    store.select_one("$$counts", "cat")                   # -> 1
    store.select("$$users", P.key("al").key("follows").sorted_range("a", "c").all())

See :mod:`pstate.path` for navigators, :mod:`pstate.store` for durability and
:mod:`pstate.checkpoint` for far-horizon catchup.

The RocksDB side (:mod:`pstate.store`) is imported on first use of one of its
names, so that code needing only schemas, paths or the query wire format (the
app client, Spark executors) never loads RocksDB.
"""

from typing import TYPE_CHECKING, Any

from pstate.changes import ChangeSet
from pstate.checkpoint import Manifest, ManifestFile, install, read_manifest
from pstate.errors import (
    CorruptStore,
    DepotNotFound,
    InvalidPath,
    PStateError,
    PStateNotFound,
    SchemaError,
    SchemaMismatch,
    StorageError,
    StoreClosed,
)
from pstate.keys import decode_key, encode_key
from pstate.path import REMOVED, P, Path, Transform
from pstate.schema import Fixed, List, Map, Optional, Record, Schema, Set, Tuple

if TYPE_CHECKING:
    from pstate.store import ChangeSetBuilder, DepotView, PartitionInfo, PStateView, TaskGroupStore

_STORE_NAMES = frozenset({"ChangeSetBuilder", "DepotView", "PartitionInfo", "PStateView", "TaskGroupStore"})


def __getattr__(name: str) -> Any:
    if name in _STORE_NAMES:
        from pstate import store

        return getattr(store, name)
    raise AttributeError(f"module 'pstate' has no attribute {name!r}")


__all__ = [
    "REMOVED",
    "ChangeSet",
    "ChangeSetBuilder",
    "CorruptStore",
    "DepotNotFound",
    "DepotView",
    "Fixed",
    "InvalidPath",
    "List",
    "Manifest",
    "ManifestFile",
    "Map",
    "Optional",
    "P",
    "PStateError",
    "PStateNotFound",
    "PStateView",
    "PartitionInfo",
    "Path",
    "Record",
    "Schema",
    "SchemaError",
    "SchemaMismatch",
    "Set",
    "StorageError",
    "StoreClosed",
    "TaskGroupStore",
    "Transform",
    "Tuple",
    "decode_key",
    "encode_key",
    "install",
    "read_manifest",
]
