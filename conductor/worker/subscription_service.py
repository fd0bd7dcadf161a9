"""The server side of one ``Subscribe`` stream: a subscriber of the task group leader's feed, drained to the wire.

The stream starts with the events :meth:`~conductor.worker.subscriptions.AppliedFeed.subscribe` gives (the
value, or the diffs a resuming subscriber missed), then sends what its bounded queue receives, many events
per message; after an overflow it sends a resync (the value now and its applied offset). It ends with
NotLeader once this replica no longer leads the group: the client resubscribes to the new leader from the
last offset it saw (docs/subscriptions.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgpack

from conductor.wire import millrace_pb2 as pb
from conductor.wire.errors import InvalidRequest
from conductor.worker.runtime import LocalModules
from conductor.worker.subscriptions import Subscriber
from pstate.diffs import RESYNC, WHOLE, Watch, pack_event
from pstate.errors import PStateNotFound
from pstate.store import pstate_cf
from replog.errors import NotLeader

#: events one stream message carries at most (a message per event would cost ~160 us each in Python)
EVENTS_PER_MESSAGE = 512
#: how often an idle stream checks that its replica still leads the group
LEADERSHIP_CHECK_S = 0.5


async def subscription_stream(modules: LocalModules, request: pb.SubscribeRequest,
                              post: Callable[..., None]) -> AsyncIterator[pb.SubscribeEvents]:
    """The events of one subscription, until the client goes or this replica stops leading."""
    rt = modules.get(request.module)
    if rt is None:
        raise NotLeader(f"{request.module}/?", None, None)
    if not 0 <= request.task < rt.spec.tasks:
        raise ValueError(f"task {request.task} is outside [0, {rt.spec.tasks}) for module {request.module}")
    group = rt.spec.group_of(request.task)
    leader = modules.leader(request.module, group)
    host, store = leader.host, leader.store
    try:
        key: Any = WHOLE if request.whole else msgpack.unpackb(request.key, raw=False, use_list=False)
    except Exception as e:  # (msgpack's errors are ValueErrors but for a few; all mean the same here)
        raise InvalidRequest("key", f"the key does not decode as msgpack: {type(e).__name__} {e}") from e
    root = store.store.schemas.get(request.pstate)
    if root is None:
        raise PStateNotFound(request.pstate, tuple(store.store.schemas))
    watch = Watch.of(pstate_cf(request.pstate), root, key)
    epoch = host.replica.epoch
    feed = store.feed
    sub, first = feed.subscribe(request.pstate, key, watch, request.from_offset,
                                lambda: store.read_applied(request.pstate, key), post)
    try:
        if first:
            yield pb.SubscribeEvents(events=first, epoch=epoch)
        while True:
            if sub.resync:
                resync = _resync(sub, store.read_applied(request.pstate, key))
                if resync is not None:
                    yield pb.SubscribeEvents(events=[resync], epoch=epoch)
                    continue
            events = sub.take(EVENTS_PER_MESSAGE)
            if events:
                yield pb.SubscribeEvents(events=events, epoch=epoch)
                continue
            r = host.replica
            if not r.is_leader or r.epoch != epoch or host.fault is not None or modules.host(request.module, group) is not host:
                raise NotLeader(host.name, r.leader, r.epoch)
            sub.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sub.wake.wait(), LEADERSHIP_CHECK_S)
    finally:
        feed.unsubscribe(sub)


def _resync(sub: Subscriber, read: tuple[Any, int]) -> bytes | None:
    """The value now replaces everything the subscriber's queue lost; it goes on after the value's offset.

    None while this replica has not applied what the subscriber already covers (a resumed subscription on a
    leader still applying its inherited entries): a value older than the consumer's would take it back.
    """
    value, applied = read
    if applied < sub.last:
        return None
    sub.resync = False
    sub.drop()
    sub.last = applied
    return pack_event(RESYNC, applied, value)
