"""The worker's ``Code`` service: it stores module code artifacts, serves them to others, and proves it can run one.

A deploy puts the artifact on one chosen worker (``PutArtifact``), then asks
every chosen worker to ``Prepare`` it: fetch it from a holder if missing,
check its hash, import it in isolation and build the module's definition. A
worker that cannot (a missing dependency, a syntax error, a ``define()`` that
raises, a module of another name) answers with the error instead of failing
the call, so the deploy can report every worker's reason at once; it
``Discard``s the version everywhere if any worker refused. A version some
deployed module keeps is never discarded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from conductor.client.code import CodeCache
from conductor.wire import code_pb2
from conductor.wire import code_pb2_grpc as codeg
from topology.artifact import CHUNK_BYTES
from topology.module import ModuleDefinition, ModuleDefinitionError

log = logging.getLogger("millrace.node")


def describe(exc: BaseException) -> str:
    """An error of module code as an operator reads it: our own errors by their message, others with their type."""
    return str(exc) if isinstance(exc, ModuleDefinitionError) else f"{type(exc).__name__}: {exc}"


class CodeService(codeg.CodeServicer):
    """Over this worker's ``code`` cache: ``prepare`` readies a loaded version for the module's replicas here
    (``CodeLifecycle.prepare``), ``referenced`` lists the versions deployed modules keep (the metastore's)."""

    def __init__(self, node_id: str, code: CodeCache, prepare: Callable[[str, str, ModuleDefinition], None],
                 referenced: Callable[[], set[str]]) -> None:
        self.node_id = node_id
        self.code = code
        self.prepare = prepare
        self.referenced = referenced

    async def PutArtifact(self, request_iterator: AsyncIterator[code_pb2.ArtifactChunk],
                          context: grpc.aio.ServicerContext) -> code_pb2.PutArtifactReply:
        sha256 = ""
        chunks: list[bytes] = []
        async for chunk in request_iterator:
            sha256 = sha256 or chunk.sha256
            chunks.append(chunk.data)
        if not sha256:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first chunk must name the artifact's sha256")
        try:
            stored = await asyncio.to_thread(self.code.put, sha256, chunks)
        except ModuleDefinitionError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        log.info("node %s %s code version %s", self.node_id, "stored" if stored else "already had", sha256[:12])
        return code_pb2.PutArtifactReply(sha256=sha256, node_id=self.node_id)

    async def FetchArtifact(self, request: code_pb2.FetchArtifactRequest,
                            context: grpc.aio.ServicerContext) -> AsyncIterator[code_pb2.ArtifactChunk]:
        code = self.code
        if not code.has(request.sha256):
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"node {self.node_id} does not hold code version {request.sha256}")
        data = await asyncio.to_thread(code.artifact_path(request.sha256).read_bytes)
        for i in range(0, len(data), CHUNK_BYTES):
            yield code_pb2.ArtifactChunk(data=data[i:i + CHUNK_BYTES])

    async def Prepare(self, request: code_pb2.PrepareRequest, context: Any) -> code_pb2.PrepareReply:
        try:
            await asyncio.to_thread(self._prepare, request)
        except Exception as e:  # the user's code may raise anything: that is the refusal we report
            log.warning("node %s refuses code version %s of module %s: %s", self.node_id, request.sha256[:12],
                        request.module, describe(e))
            return code_pb2.PrepareReply(node_id=self.node_id, ok=False, error=describe(e))
        log.info("node %s can run code version %s of module %s", self.node_id, request.sha256[:12], request.module)
        return code_pb2.PrepareReply(node_id=self.node_id, ok=True)

    def _prepare(self, request: code_pb2.PrepareRequest) -> None:
        code = self.code
        if not code.has(request.sha256):
            code.fetch(request.sha256, list(request.sources))
        definition = code.load(request.sha256, request.module_ref).build()
        expected = request.declared_module or request.module  # (a restored module runs under another name)
        if definition.name != expected:
            raise ModuleDefinitionError(f"{request.module_ref} declares module {definition.name!r}, not "
                                        f"{expected!r}")
        self.prepare(request.module, request.sha256, definition)  # an update: ready each replica

    async def Discard(self, request: code_pb2.DiscardRequest, context: Any) -> code_pb2.DiscardReply:
        referenced = await asyncio.to_thread(self.referenced)
        if request.sha256 in referenced:
            return code_pb2.DiscardReply(removed=False)
        removed = await asyncio.to_thread(self.code.discard, request.sha256)
        if removed:
            log.info("node %s discarded code version %s", self.node_id, request.sha256[:12])
        return code_pb2.DiscardReply(removed=removed)
