"""The app client: append to depots and query PStates of a running Millrace cluster.

    from conductor.client import Cluster
    cluster = Cluster.connect("zk1:2181,zk2:2181,zk3:2181")

Importing it loads neither the worker nor RocksDB: an app (or a Spark
executor) pays only for ZooKeeper, gRPC and the module API.
"""

from conductor.client.cluster import Cluster, ModuleInfo
from conductor.client.errors import ClientError, QueueFull
from conductor.client.handles import Depot, DepotBatch, PartitionStatus, PState
from conductor.client.metrics import ClientMetrics
from conductor.client.retry import Retry
from conductor.client.router import LeaderRouter
from conductor.wire.errors import MillraceError, Unavailable
from replog.errors import Backpressure, NotLeader, StalledGroup

__all__ = [
    "Backpressure",
    "ClientError",
    "ClientMetrics",
    "Cluster",
    "Depot",
    "DepotBatch",
    "LeaderRouter",
    "MillraceError",
    "ModuleInfo",
    "NotLeader",
    "PState",
    "PartitionStatus",
    "QueueFull",
    "Retry",
    "StalledGroup",
    "Unavailable",
]
