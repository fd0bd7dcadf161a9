"""Typed errors of the PState/depot storage layer.

Every error says what went wrong and what to do next, because these messages
reach users through the client (mapped to gRPC status codes via ``grpc_code``,
kept as a string so that ``pstate`` never imports grpc) and operators through
logs.  rocksdict raises plain ``Exception``/``KeyError`` values; they are
translated into this hierarchy in exactly one place, :func:`rocks_errors`, so
callers never need to know about rocksdict's exception types.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class PStateError(Exception):
    """Base of every storage-layer error."""

    #: name of the ``grpc.StatusCode`` member this error maps to.
    grpc_code: str = "INTERNAL"


class SchemaError(PStateError):
    """A schema definition itself is invalid (raised when a module is defined, not at write time)."""

    grpc_code = "INVALID_ARGUMENT"


class SchemaMismatch(PStateError):
    """A value written does not match the PState schema; nothing was written."""

    grpc_code = "INVALID_ARGUMENT"

    def __init__(self, path: str, expected: str, received: str) -> None:
        self.path = path
        self.expected = expected
        self.received = received
        super().__init__(
            f"schema mismatch at {path}: expected {expected}, received {received}; "
            "nothing was written — fix the value or the schema"
        )


class InvalidPath(PStateError):
    """A path cannot be applied to the schema (e.g. ``key`` on a Set, ``view`` in a transform)."""

    grpc_code = "INVALID_ARGUMENT"

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"invalid path at {path}: {reason}")


class PStateNotFound(PStateError):
    """The named PState is not defined in this task group."""

    grpc_code = "NOT_FOUND"

    def __init__(self, name: str, known: list[str] | tuple[str, ...] = ()) -> None:
        self.name = name
        super().__init__(f"PState {name!r} does not exist here; known PStates: {sorted(known)}")


class DepotNotFound(PStateError):
    """The named depot is not defined in this task group."""

    grpc_code = "NOT_FOUND"

    def __init__(self, name: str, known: list[str] | tuple[str, ...] = ()) -> None:
        self.name = name
        super().__init__(f"depot {name!r} does not exist here; known depots: {sorted(known)}")


class CorruptStore(PStateError):
    """State files or a replog payload are damaged; the replica must be rebuilt from the leader."""

    grpc_code = "DATA_LOSS"

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(
            f"corrupt state {what}: {reason}; rebuild this replica from the leader (far-horizon catchup)"
        )


class StoreClosed(PStateError):
    """The store was closed (or swapped by an install); reopen it."""

    grpc_code = "FAILED_PRECONDITION"

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"state store {path} is closed; reopen it with TaskGroupStore(...)")


class StorageError(PStateError):
    """RocksDB failed (I/O error, lock held by another process, disk full ...)."""

    grpc_code = "UNAVAILABLE"

    def __init__(self, operation: str, reason: str) -> None:
        self.operation = operation
        self.reason = reason
        super().__init__(
            f"RocksDB {operation} failed: {reason}; check disk space and permissions, "
            "and that no other process has this store open"
        )


@contextmanager
def rocks_errors(operation: str, path: str = "") -> Iterator[None]:
    """Translate rocksdict's plain exceptions into :class:`PStateError` (the ONE place that does).

    rocksdict reports everything as ``Exception`` with RocksDB's message (or
    ``DbClosedError``); we keep the message but give it a type callers can
    catch and a gRPC code.  Our own errors pass through untouched.
    """
    try:
        yield
    except PStateError:
        raise
    except Exception as exc:  # rocksdict raises bare Exception subclasses
        raise translate(exc, operation, path) from exc


def translate(exc: Exception, operation: str, path: str = "") -> PStateError:
    """Map one rocksdict exception to our hierarchy (used by :func:`rocks_errors` and hot-path readers)."""
    name = type(exc).__name__
    text = str(exc)
    if name == "DbClosedError" or ("closed" in text.lower() and "db" in text.lower()):
        return StoreClosed(path or "?")
    if "Corruption" in text or "checksum" in text.lower():
        return CorruptStore(path or operation, text)
    return StorageError(operation, f"{name}: {text}")
