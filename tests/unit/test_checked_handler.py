"""checked_handler: undecodable bodies get INVALID_ARGUMENT, methods a servicer leaves alone get UNIMPLEMENTED.

A real grpc.aio server on loopback (the wire layer itself is under test, so no TLS here).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from conductor.wire import admin_pb2, admin_pb2_grpc
from conductor.wire.checked import checked_handler

_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"]
_PING = "/millrace.admin.Admin/Ping"


class _Pinging(admin_pb2_grpc.AdminServicer):
    async def Ping(self, request: admin_pb2.PingRequest, context: Any) -> admin_pb2.PingReply:
        return admin_pb2.PingReply(payload=request.payload, node_id="n1")


class _Silent(admin_pb2_grpc.AdminServicer):
    """Overrides nothing: the generated stub is all it has."""


async def _call(servicer: Any, body: bytes) -> tuple[grpc.StatusCode, bytes]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((checked_handler(_SERVICE, servicer),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(_PING)
            try:
                return grpc.StatusCode.OK, await call(body, timeout=10)
            except grpc.aio.AioRpcError as e:
                return e.code(), (e.details() or "").encode()
    finally:
        await server.stop(None)


def test_an_overridden_method_answers() -> None:
    code, reply = asyncio.run(_call(_Pinging(), admin_pb2.PingRequest(payload=b"x").SerializeToString()))
    assert code == grpc.StatusCode.OK
    assert admin_pb2.PingReply.FromString(reply).payload == b"x"


def test_an_undecodable_body_is_refused_with_invalid_argument() -> None:
    code, details = asyncio.run(_call(_Pinging(), b"\xff\xff\xff"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert b"millrace.admin.PingRequest" in details


@pytest.mark.parametrize("body", [b"", b"\xff\xff\xff"])
def test_a_method_the_servicer_does_not_override_is_unimplemented(body: bytes) -> None:
    code, _ = asyncio.run(_call(_Silent(), body))
    assert code == grpc.StatusCode.UNIMPLEMENTED
