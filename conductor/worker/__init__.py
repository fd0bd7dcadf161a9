"""The worker process: hosts task-group replicas and drives their replication state machines.

Run as ``python -m conductor.worker --zk HOST:PORT --node-id n1 --data-dir DIR``.
The replication rules live in :mod:`replog`; this package performs their
actions over gRPC, disk and ZooKeeper.
"""
