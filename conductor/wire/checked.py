"""A service's gRPC handlers that refuse undecodable request bodies with INVALID_ARGUMENT, quietly.

The generated ``add_*Servicer_to_server`` parse each request with
``FromString`` inside gRPC, so a body that is not the method's message ends the
call with UNKNOWN and a traceback in the node's log. Here parsing never raises:
a body that does not decode becomes an :class:`Undecodable` that the method's
wrapper answers with INVALID_ARGUMENT naming the message type and the parse
error, before the servicer sees anything (on a stream: at the first bad message).
A method the servicer does not override (it still has the generated base's stub)
is left out, so gRPC itself answers it with UNIMPLEMENTED.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

log = logging.getLogger("millrace.node")


class Undecodable:
    """A request body that did not decode as its method's message."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def _parser(cls: Any) -> Callable[[bytes], Any]:
    name = cls.DESCRIPTOR.full_name

    def parse(raw: bytes) -> Any:
        try:
            return cls.FromString(raw)
        except (DecodeError, ValueError, RuntimeError) as e:  # RuntimeError: recursion too deep
            return Undecodable(f"the request body is not a valid {name} ({len(raw)} bytes): {e}")

    return parse


async def _refuse(context: Any, bad: Undecodable) -> None:
    log.debug("refused an undecodable request: %s", bad.message)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad.message)


async def _checked_stream(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, Undecodable):
            await _refuse(context, request)
        yield request


def _wrap(method: MethodDescriptor, behavior: Callable[..., Any]) -> Callable[..., Any]:
    """`behavior` behind the check; of the same kind (gRPC asyncio tells coroutines from async generators)."""
    if method.server_streaming:
        assert inspect.isasyncgenfunction(behavior), f"{method.full_name}: serve streams from async generators"
    if method.client_streaming and method.server_streaming:
        async def both(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            async for reply in behavior(_checked_stream(requests, context), context):
                yield reply
        return both
    if method.client_streaming:
        async def streaming(requests: AsyncIterator[Any], context: Any) -> Any:
            return await behavior(_checked_stream(requests, context), context)
        return streaming
    if method.server_streaming:
        async def replies(request: Any, context: Any) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await _refuse(context, request)
            async for reply in behavior(request, context):
                yield reply
        return replies

    async def unary(request: Any, context: Any) -> Any:
        if isinstance(request, Undecodable):
            await _refuse(context, request)
        return await behavior(request, context)
    return unary


def checked_handler(service: ServiceDescriptor, servicer: Any,
                    serializers: Mapping[str, Callable[[Any], bytes]] | None = None) -> grpc.GenericRpcHandler:
    """`service`'s methods on `servicer` (async methods), with request bodies checked as described above.

    ``serializers`` overrides a method's response serializer (a method that
    yields pre-encoded bytes).
    """
    handlers = {}
    for method in service.methods:
        if not _overrides(servicer, method.name):
            continue
        parse = _parser(GetMessageClass(method.input_type))
        serialize = (serializers or {}).get(method.name, _serialize)
        behavior = _wrap(method, getattr(servicer, method.name))
        if method.client_streaming and method.server_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif method.client_streaming:
            make = grpc.stream_unary_rpc_method_handler
        elif method.server_streaming:
            make = grpc.unary_stream_rpc_method_handler
        else:
            make = grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(behavior, request_deserializer=parse, response_serializer=serialize)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def _overrides(servicer: Any, name: str) -> bool:
    """Whether `servicer`'s class defines `name` itself rather than inheriting the generated ``*_pb2_grpc`` stub."""
    owner = next(cls for cls in type(servicer).__mro__ if name in vars(cls))
    return not owner.__module__.endswith("_pb2_grpc")


def _serialize(message: Any) -> bytes:
    raw: bytes = message.SerializeToString()
    return raw
