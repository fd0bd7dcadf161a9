"""Millrace's cluster runtime: metastore, conductor, worker nodes, gRPC services, the client and the CLI.

`from conductor import Cluster` is the app-facing entry point; it is imported
lazily so that the CLI and worker processes do not pay for what they do not use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conductor.client import Cluster

__all__ = ["Cluster"]


def __getattr__(name: str) -> Any:
    if name == "Cluster":
        from conductor.client import Cluster

        return Cluster
    raise AttributeError(f"module 'conductor' has no attribute {name!r}")
