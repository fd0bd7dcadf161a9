"""gRPC channel and server options every Millrace process uses, defined once.

Replication frames, far-horizon chunks and packed depot reads are large, so
the message limits are raised far above gRPC's 4 MiB default; keepalives let
a process notice a dead peer on an idle channel.
"""

from __future__ import annotations

#: the most one gRPC message may carry, both ways
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

GRPC_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
]
