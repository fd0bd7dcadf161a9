"""A live PState value in the app (:class:`Subscription`): a value, then the diffs of every applied entry.

One ``Subscribe`` server stream from the group's leader feeds it (conductor/worker/subscriptions.py). The
subscription keeps the last applied offset it saw; when the stream breaks (the leader died or moved, the
network failed) it asks the current leader again *from that offset*, and drops every event at or below it,
so each applied entry's diffs reach the app exactly once, or are folded into a resync value when the new
leader no longer holds the entries it would need (docs/subscriptions.md says what a consumer sees).

Callbacks run on the client's event loop thread, one at a time, in offset order: keep them short (hand long
work to a thread). :meth:`Subscription.changes` is the async iterator over the same changes for another
event loop, with a bounded queue: a consumer too slow for it gets one resync change with the value instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import msgpack

from conductor.client.errors import ClientError
from conductor.client.retry import retryable
from conductor.wire import millrace_pb2 as pb
from conductor.wire.errors import error_from_rpc
from pstate.diffs import DIFFS, RESYNC, VALUE, Diff, fold, unpack_event

if TYPE_CHECKING:
    from conductor.client.cluster import Cluster

log = logging.getLogger("millrace.client")

#: changes an async iterator holds for its consumer before it replaces them with one resync change
ITERATOR_QUEUE = 1024
_KINDS = {VALUE: "value", DIFFS: "diffs", RESYNC: "resync"}


@dataclass(frozen=True)
class Change:
    """One event of a subscription: ``kind`` is "value" (the first), "diffs" or "resync".

    ``offset`` is the applied replog offset it reflects, ``epoch`` the leader epoch that served it,
    ``diffs`` the entry's diffs (:mod:`pstate.diffs`; empty for a value or a resync) and ``value`` the
    watched node after it.
    """

    kind: str
    offset: int
    epoch: int
    diffs: list[Diff]
    value: Any


class Subscription:
    """A subscription to one PState node; ``value`` and ``offset`` are its latest; :meth:`close` ends it."""

    def __init__(self, cluster: Cluster, module: str, group: int, request: pb.SubscribeRequest,
                 callback: Callable[[Change], None] | None) -> None:
        self.c = cluster
        self.module = module
        self.group = group
        self._request = request
        self._callbacks: list[Callable[[Change], None]] = [callback] if callback is not None else []
        #: the watched node as of ``offset`` (None before the first value)
        self.value: Any = None
        #: the last applied offset seen (-1: none yet)
        self.offset = -1
        self.epoch = 0
        #: streams opened (1 + resubscriptions after failures)
        self.streams = 0
        #: the error that ended the subscription, if one did (not worth retrying)
        self.error: Exception | None = None
        self.ready = threading.Event()
        self._closed = False
        self._task: asyncio.Future[None] = cluster._run(self._run())

    # ------------------------------------------------------------------ app side

    def close(self) -> None:
        """Stop the stream; no callback runs after this returns (but one running now finishes)."""
        self._closed = True
        loop = self.c._loop
        if not loop.is_closed():
            loop.call_soon_threadsafe(self._task.cancel)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout: float = 30.0) -> Subscription:
        """Block until the first value arrived (raise the subscription's error, or TimeoutError)."""
        if not self.ready.wait(timeout):
            raise TimeoutError(f"no value from {self.module}/{self.group} in {timeout} s")
        if self.error is not None:
            raise self.error
        return self

    async def changes(self) -> AsyncIterator[Change]:
        """Every change from now on, on the caller's event loop (a bounded queue: see the module docstring)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Change] = asyncio.Queue(ITERATOR_QUEUE)

        def put(ch: Change) -> None:
            if queue.full():  # too slow: what it missed is folded into one resync with the value
                while not queue.empty():
                    queue.get_nowait()
                ch = Change("resync", ch.offset, ch.epoch, [], ch.value)
            queue.put_nowait(ch)

        def forward(ch: Change) -> None:
            with contextlib.suppress(RuntimeError):  # the consumer's loop closed
                loop.call_soon_threadsafe(put, ch)

        self._callbacks.append(forward)
        try:
            if self.offset >= 0 or self.ready.is_set():
                put(Change("value", self.offset, self.epoch, [], self.value))
            while not self._closed:
                yield await queue.get()
        finally:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(forward)

    # ------------------------------------------------------------------ event loop

    async def _run(self) -> None:
        delay = 0.02
        refresh = False
        try:
            while not self._closed:
                try:
                    address = await asyncio.to_thread(self.c._leader_address, self.module, self.group, refresh)
                    self._request.from_offset = self.offset if self.ready.is_set() else -1
                    call = self.c._stub(address).Subscribe(self._request)
                    self.streams += 1
                    async for msg in call:
                        for raw in msg.events:
                            self._event(raw, msg.epoch)
                        delay = 0.02
                    err: Exception = ClientError("the subscription stream ended")  # the server went away
                except grpc.RpcError as e:
                    err = error_from_rpc(e)
                except Exception as e:
                    err = e
                if self._closed:
                    return
                if not (retryable(err) or isinstance(err, ClientError)):
                    self.error = err
                    self.ready.set()
                    log.warning("%s/%d: subscription ended: %s", self.module, self.group, err)
                    return
                log.debug("%s/%d: resubscribing after offset %d: %s", self.module, self.group, self.offset, err)
                refresh = True
                await asyncio.sleep(delay)
                delay = min(0.5, delay * 2)
        except asyncio.CancelledError:
            return

    def _event(self, raw: bytes, epoch: int) -> None:
        kind, offset, payload = unpack_event(raw)
        if self.ready.is_set() and offset <= self.offset and kind != VALUE:
            return  # seen already (a resumed stream's replay overlaps what the old leader sent)
        diffs: list[Diff] = []
        if kind == DIFFS:
            diffs = payload
            self.value = fold(self.value, diffs)
        else:
            self.value = payload
        self.offset, self.epoch = max(offset, self.offset), epoch
        ch = Change(_KINDS.get(kind, "resync"), offset, epoch, diffs, self.value)
        self.ready.set()
        for cb in list(self._callbacks):
            try:
                cb(ch)
            except Exception:
                log.exception("%s/%d: a subscription callback failed", self.module, self.group)


def subscribe_request(module: str, pstate: str, task: int, key: Any, whole: bool) -> pb.SubscribeRequest:
    return pb.SubscribeRequest(module=module, pstate=pstate, task=task, whole=whole, from_offset=-1,
                               key=b"" if whole else msgpack.packb(key, use_bin_type=True))


__all__ = ["Change", "Subscription", "subscribe_request"]
