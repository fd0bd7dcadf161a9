"""A worker's cross-group stream-topology reads: a leader runs its topologies over other groups' records.

While a replica leads its group, it reads the applied records of depot
partitions other groups own (from their leaders, found with the one leader
router) and runs the module's stream topologies for the keys it owns, saving
its read position in the same replog entry as the effects.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import msgpack

from conductor.client.router import LeaderRouter
from conductor.metastore import MetastoreError
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.errors import Unavailable
from conductor.wire.options import GRPC_OPTIONS
from conductor.worker.replica_host import PendingEntry, ReplicaHost
from conductor.worker.replica_store import ReplicaStore
from conductor.worker.services import settle_future
from pstate.errors import PStateError
from replog.errors import ReplogError
from replog.messages import Ack
from topology.stream import StreamRunner

if TYPE_CHECKING:
    from conductor.worker.worker import ModuleRuntime

log = logging.getLogger("millrace.node")

#: bytes of another group's depot records one foreign topology batch reads
FOREIGN_BATCH_BYTES = 1 << 20


class ForeignConsumer:
    """Reads other groups' applied records for the stream topologies of the groups this worker leads."""

    def __init__(self, router: LeaderRouter) -> None:
        self.router = router
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def run(self, rt: ModuleRuntime, g: int, host: ReplicaHost, is_open: Callable[[], bool]) -> None:
        """While this replica leads group `g`, run its stream topologies over other groups' partitions.

        One batch is in flight at a time per group: the next read starts from the
        position the previous batch's entry saved, so nothing is skipped or run twice.
        """
        runner = rt.runners[g]
        store = rt.stores[g]
        topologies = [t for t in rt.definition.topologies.values() if t.kind == "stream"]
        while is_open() and host.thread.is_alive():
            progressed = False
            if host.replica.is_leader:
                for topo in topologies:
                    for depot in topo.depots:
                        for task in runner.foreign_tasks():
                            try:
                                progressed |= await self._consume_one(rt, host, store, runner, topo.name, depot, task)
                            except (grpc.RpcError, ReplogError, PStateError, ValueError) as e:
                                log.debug("%s: foreign read %s %s/%d failed: %s", host.name, topo.name, depot, task, e)
            if not progressed:
                await asyncio.sleep(0.05)

    async def _consume_one(self, rt: ModuleRuntime, host: ReplicaHost, store: ReplicaStore, runner: StreamRunner,
                           topology: str, depot: str, task: int) -> bool:
        start = store.foreign_position(topology, depot, task)
        try:
            address, _epoch = self.router.leader(rt.spec.name, rt.spec.group_of(task))
        except (Unavailable, MetastoreError):
            return False
        stub = pbg.ClientStub(self._channel(address))
        reply = await stub.DepotRead(pb.DepotReadRequest(module=rt.spec.name, depot=depot, task=task, start=start,
                                                         max_bytes=FOREIGN_BATCH_BYTES), timeout=5)
        if not reply.records:
            return False
        records = [msgpack.unpackb(r, raw=False, strict_map_key=False) for r in reply.records]
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def done(first: int, result: Any, error: Exception | None) -> None:
            loop.call_soon_threadsafe(settle_future, fut, result, error)

        build = functools.partial(_foreign_entry, store, runner, topology, depot, task, reply.start, records,
                                  reply.next)
        host.post(PendingEntry(build, sum(len(r) for r in reply.records), Ack.APPLIED, done))
        await fut
        return True

    def _channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
        return ch

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close(grace=None)


def _foreign_entry(store: ReplicaStore, runner: StreamRunner, topology: str, depot: str, task: int, start: int,
                   records: list[Any], next_offset: int) -> tuple[Any, Any]:
    return store.build_foreign(runner, topology, depot, task, start, records, next_offset), None
