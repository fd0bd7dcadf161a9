"""The app client: append to depots and query PStates of a running Millrace cluster.

    from conductor.client import Cluster
    cluster = Cluster.connect("127.0.0.1:2181")

Importing it loads neither the worker nor RocksDB: an app (or a Spark
executor) pays only for ZooKeeper, gRPC and the module API.
"""

from conductor.client.cluster import (
    Backpressure,
    ClientError,
    Cluster,
    Depot,
    NotLeader,
    PState,
    StalledGroup,
)

__all__ = ["Backpressure", "ClientError", "Cluster", "Depot", "NotLeader", "PState", "StalledGroup"]
