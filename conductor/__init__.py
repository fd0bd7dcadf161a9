"""Millrace's cluster runtime: metastore, conductor, worker nodes, gRPC services, the client and the CLI.

`from conductor import Cluster` is the app-facing entry point (`conductor.__version__`
is the installed version); it is imported lazily so that the CLI and worker processes do not pay for what they do not use.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conductor.client import Cluster

__all__ = ["Cluster", "__version__"]

# gRPC reads these when it is first imported, and every Millrace process imports this package before gRPC.
# Nothing here forks without exec (subprocesses and Spark's JVM exec at once), so gRPC's fork handlers only
# print "Other threads are currently calling into gRPC, skipping fork() handlers" at each Popen (and once in
# a while broke the child before its exec); an app that sets either variable itself keeps its value.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def _installed_version() -> str:
    """The installed distribution's version (pyproject.toml's, through the wheel or the editable install)."""
    try:
        return version("millrace")
    except PackageNotFoundError:  # a bare checkout on PYTHONPATH, never installed
        return "0+unknown"


#: Millrace's version: the CLI's `--version`, the worker's Ping reply
__version__ = _installed_version()


def __getattr__(name: str) -> Any:
    if name == "Cluster":
        from conductor.client import Cluster

        return Cluster
    raise AttributeError(f"module 'conductor' has no attribute {name!r}")
