"""Typed errors across gRPC: one status code per error class, the typed exception rebuilt on the client.

The server puts the error's class name and constructor arguments in the
trailing metadata key ``millrace-error`` (JSON); the status code comes from the
class's ``grpc_code``. The client turns that back into the same exception type,
so `except StalledGroup as e: e.isr` works on the app side exactly as inside
the worker, and unknown errors still surface with their code and message.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import grpc

from pstate import errors as pstate_errors
from replog import errors as replog_errors
from topology import errors as topology_errors

METADATA_KEY = "millrace-error"

#: the status gRPC's asyncio layer makes up, on this side, when an operation on a call fails in its core: a write
#: to a connection that a node's death reset. The node never said it, so it is a lost connection, not a node's error.
_LOCAL_CORE_FAILURE = (grpc.StatusCode.INTERNAL, "Internal error from Core")


class MillraceError(Exception):
    """An error from a Millrace node that this client has no typed class for."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"{code}: {message}")


class Unavailable(MillraceError):
    """No node answered (down, partitioned, or not started); retrying later may succeed."""


class Unauthenticated(MillraceError):
    """The worker does not know who is calling: no certificate or token, or an unknown, wrong or revoked token."""


class PermissionDenied(MillraceError):
    """The caller is known but lacks the permission (the message names it, and the `conductor acl grant` that fixes
    it); nothing was changed."""


class InvalidRequest(ValueError):
    """A request a node cannot take as sent (undecodable body, unknown ack level); nothing was changed."""

    grpc_code = "INVALID_ARGUMENT"

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"invalid {what}: {reason}")


class RefusedPeer(ValueError):
    """A replication message from a node that is not a replica of its group (unknown, or no longer one)."""

    grpc_code = "PERMISSION_DENIED"

    def __init__(self, src: str, group: str, replicas: list[str]) -> None:
        self.src = src
        self.group = group
        self.replicas = list(replicas)
        super().__init__(f"refused replication messages for {group} from {src!r}: its replicas are "
                         f"{self.replicas}; the frame was dropped")


def _registry() -> dict[str, type[Exception]]:
    reg: dict[str, type[Exception]] = {"InvalidRequest": InvalidRequest, "RefusedPeer": RefusedPeer}
    for mod in (replog_errors, pstate_errors, topology_errors):
        for name, obj in vars(mod).items():
            if isinstance(obj, type) and issubclass(obj, Exception) and hasattr(obj, "grpc_code"):
                reg[name] = obj
    return reg


_REGISTRY: dict[str, type[Exception]] | None = None


def registry() -> dict[str, type[Exception]]:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _registry()
    return _REGISTRY


def _ctor_args(exc: Exception) -> dict[str, Any]:
    """The constructor arguments of `exc`, read back from the attributes our errors keep."""
    params = inspect.signature(type(exc).__init__).parameters
    args: dict[str, Any] = {}
    for name in list(params)[1:]:
        if hasattr(exc, name):
            value = getattr(exc, name)
            if isinstance(value, tuple):
                value = list(value)
            args[name] = value
    return args


def status_of(exc: Exception) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """(code, details, trailing metadata) for a typed error raised inside a node."""
    # a ValueError without a code of its own is bad input that a check caught (services only map those)
    code_name = getattr(exc, "grpc_code", "INVALID_ARGUMENT" if isinstance(exc, ValueError) else "INTERNAL")
    code = getattr(grpc.StatusCode, code_name, grpc.StatusCode.INTERNAL)
    meta: tuple[tuple[str, str], ...] = ()
    if type(exc).__name__ in registry():
        try:
            payload = json.dumps({"type": type(exc).__name__, "args": _ctor_args(exc)})
            meta = ((METADATA_KEY, payload),)
        except (TypeError, ValueError):
            meta = ()
    return code, str(exc) or type(exc).__name__, meta


def error_json(exc: Exception) -> str:
    """The error as one JSON string, for replies that carry errors in-band (streamed appends)."""
    code, details, meta = status_of(exc)
    typed = json.loads(meta[0][1]) if meta else {}
    return json.dumps({"code": code.name, "message": details, **typed})


def error_from_json(raw: str) -> Exception:
    """Inverse of :func:`error_json`."""
    data = json.loads(raw)
    cls = registry().get(data.get("type", ""))
    if cls is not None:
        try:
            return cls(**data["args"])
        except (KeyError, TypeError):
            pass
    return MillraceError(data.get("code", "UNKNOWN"), data.get("message", raw))


def error_from_rpc(err: grpc.RpcError) -> Exception:
    """Rebuild the typed exception a node raised; fall back to MillraceError with the status."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = (err.details() if hasattr(err, "details") else None) or str(err)
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == METADATA_KEY:
            try:
                data = json.loads(value)
                cls = registry()[data["type"]]
                return cls(**data["args"])
            except (KeyError, TypeError, ValueError):
                break
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or (code, details) == _LOCAL_CORE_FAILURE:
        return Unavailable(code.name, details)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(code.name, details)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(code.name, details)
    return MillraceError(code.name if code else "UNKNOWN", details)
