"""The replog entries of the dataflow, as a group leader builds them; and what an applied entry tells the tracker.

Three kinds of entry carry dataflow state (:mod:`pstate.outbox` stores it):

* a **client append** (:func:`build_client_append`): the records, the effects of
  the depot's topologies on this group, and the envelopes they send, whose
  parent is the entry itself (a root);
* an **inbound** entry (:func:`build_inbound`): envelopes other groups (or this
  one) sent here, consumed in per-source order, their effects, the envelopes
  they send in turn (parent: the envelope that caused them), and the new inbox
  positions, all in one entry: exactly once across crashes and failovers of
  either side, because an envelope is consumed iff this entry is applied;
* **trims** (:func:`trim_outbox`), added to any entry: envelopes their
  destination reported complete leave the outbox.

Everything here runs on the leader's task thread, reading through staged
entries (sequence numbers and positions build on entries not applied yet, like
depot offsets do).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from pstate import outbox
from pstate.changes import ChangeSet
from pstate.errors import SchemaMismatch
from pstate.store import ChangeSetBuilder, TaskGroupStore
from replog.errors import Backpressure
from topology.dataflow.completion import CompletionTracker
from topology.dataflow.poison import RetryBook, dead_letter
from topology.envelope import (
    APPEND,
    ROOT,
    decode_envelope,
    encode_envelopes,
    envelope_parents,
    pack_message,
)
from topology.errors import HopFailed
from topology.module import DEAD_LETTERS
from topology.stream import Outbound, StreamRunner

#: a client append is refused (Backpressure: the app retries later) while an outbox it would add to holds
#: this many envelopes or bytes its destination has not completed; hop traffic itself is never refused,
#: so groups that send to each other cannot block one another
OUTBOX_MAX_ENVELOPES = 4096
OUTBOX_MAX_BYTES = 64 << 20


class Sends:
    """Messages one entry sends, per destination group, with the work each was sent on behalf of."""

    def __init__(self) -> None:
        self._messages: dict[int, list[bytes]] = {}
        self._parents: dict[int, list[int]] = {}

    def add(self, out: Outbound, parent: tuple[int, int]) -> None:
        for dst, msgs in out.items():
            mine = self._messages.get(dst)
            if mine is None:
                self._messages[dst] = list(msgs)
                self._parents[dst] = list(parent)
                continue
            mine.extend(msgs)
            ps = self._parents[dst]
            if ps[-2] != parent[0] or ps[-1] != parent[1]:
                ps.extend(parent)

    def destinations(self) -> list[int]:
        return sorted(self._messages)

    def write(self, builder: ChangeSetBuilder) -> int:
        """Put the envelopes in the entry's outbox; returns how many."""
        n = 0
        for dst in sorted(self._messages):
            for raw in encode_envelopes(self._parents[dst], self._messages[dst]):
                outbox.put_envelope(builder, dst, raw)
                n += 1
        return n

    def __bool__(self) -> bool:
        return bool(self._messages)


def check_room(builder: ChangeSetBuilder, runner: StreamRunner, sends: Sends) -> None:
    """Backpressure unless every outbox this entry adds to has room."""
    for dst in sends.destinations():
        b = outbox.bounds(builder.reader, dst)
        if b.pending >= OUTBOX_MAX_ENVELOPES or b.nbytes >= OUTBOX_MAX_BYTES:
            raise Backpressure(f"{runner.definition.name}/{runner.group}",
                               f"task group {dst} has not completed {b.pending} envelope(s) ({b.nbytes / 1e6:.1f} MB) "
                               "of hop messages from here; retry the append later")


# ------------------------------------------------------------------------------------ client appends

ROOT_PARENT = (ROOT, 0)


def build_client_append(store: TaskGroupStore, runner: StreamRunner | None,
                        appends: Iterable[tuple[str, int, Sequence[bytes]]], timestamp_ms: int | None = None,
                        ) -> tuple[ChangeSetBuilder, list[int], dict[str, list[Any]]]:
    """One entry appending every record, with its topologies' effects here and the hops they send.

    Returns the builder, each partition's first depot offset, and the
    topologies' ack values (per topology, in record order). A record whose
    topology raises refuses the whole append (:class:`HopFailed`), and a full
    outbox refuses it with :class:`Backpressure`: nothing of it is stored.
    ``timestamp_ms`` is the records' event time (None: the leader's, the entry's).
    """
    b = store.changes()
    firsts = []
    acks: dict[str, list[Any]] = {}
    sends = Sends()
    for depot, task, records in appends:
        # Decoding validates each record (one msgpack object, nothing after it); the bytes are stored as sent.
        read = runner is not None and depot in runner.by_depot
        values = decode_client_records(depot, task, records) if read else None
        if values is None:
            check_client_records(depot, task, records)
        offsets = b.depot_append_encoded(depot, task, records, timestamp_ms)
        firsts.append(offsets[0] if offsets else 0)
        if values is not None:
            assert runner is not None
            for v in values:
                out = runner.run_record(b, depot, task, v, acks)
                if out:
                    sends.add(out, ROOT_PARENT)
    if sends:
        assert runner is not None
        check_room(b, runner, sends)
        sends.write(b)
    return b, firsts, acks


def decode_client_records(depot: str, task: int, records: Sequence[bytes]) -> list[Any]:
    """Every record as :func:`decode_record` decodes it, in one comprehension (no call frame per record: the
    batched path's records cost one C call each); the first bad one raises as decode_record says."""
    unpackb = msgpack.unpackb
    try:
        return [unpackb(r, raw=False, strict_map_key=False) for r in records]
    except Exception:  # untrusted bytes: find the bad record and say why
        for r in records:
            decode_record(depot, task, r)
        raise


def check_client_records(depot: str, task: int, records: Sequence[bytes]) -> None:
    """:func:`decode_client_records`' checks, for a depot no topology here reads: each value is dropped as soon
    as it is decoded, which costs a quarter less than keeping them (0.23 against 0.30 µs a record, session 13:
    the next record's objects reuse the memory the last one freed, still in the cache)."""
    unpackb = msgpack.unpackb
    try:
        for r in records:
            unpackb(r, raw=False, strict_map_key=False)
    except Exception:  # untrusted bytes: find the bad record and say why
        for r in records:
            decode_record(depot, task, r)
        raise


def decode_record(depot: str, task: int, raw: bytes) -> Any:
    """One record as a client sent it; SchemaMismatch (INVALID_ARGUMENT) with the reason if it does not decode."""
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as e:  # untrusted bytes: truncated, extra data, reserved codes, unhashable map keys...
        raise SchemaMismatch(f"{depot}[{task}] record", "one msgpack value (str, int, float, bytes, bool, None, "
                             "lists and maps of those)",
                             f"{len(raw)} undecodable bytes ({type(e).__name__}: {str(e) or 'invalid format'})") from None


def append_through_topologies(runner: StreamRunner, sends: Sends, depot: str, task: int, record: Any) -> None:
    """A record some code appends (a microbatch) that the depot's topologies must see: a hop to itself.

    The record reaches the depot in the later entry that runs it, like a record
    a topology appends; so a failure there is retried and dead-lettered, never
    refusing the commit that produced it.
    """
    sends.add({runner.group: [pack_message([APPEND, task, None, [depot, record]])]}, ROOT_PARENT)


# ------------------------------------------------------------------------------------ inbound envelopes


@dataclass(frozen=True)
class Inbound:
    """An envelope as it arrived: from group ``src``, its sequence number there, its bytes."""

    src: int
    seq: int
    raw: bytes


@dataclass
class InboundResult:
    """What an inbound build did (``builder`` None: nothing to append)."""

    builder: ChangeSetBuilder | None
    consumed: dict[int, int] = field(default_factory=dict)  # source -> new inbox position
    retry_at: dict[int, int] = field(default_factory=dict)  # source -> when its held envelope may run again
    dead_letters: int = 0
    stale: int = 0  # duplicates (already consumed) and envelopes after a gap: the source sends them again


def build_inbound(store: TaskGroupStore, runner: StreamRunner, batch: Sequence[Inbound], retries: RetryBook,
                  now_ms: int) -> InboundResult:
    """One entry consuming ``batch`` (in order per source) exactly once, with the effects and hops it causes.

    An envelope is consumed only at its source's position as this entry sees
    it (staged entries included): older ones were consumed already, newer ones
    wait for the gap to fill. An envelope whose code fails is held with every
    later one from its source until ``retry_at``; on its last attempt the
    failing messages go to the dead-letter depot instead and the rest apply.
    """
    b = store.changes()
    res = InboundResult(b)
    positions: dict[int, int] = {}
    held: set[int] = set()
    sends = Sends()
    for env in batch:
        src, seq = env.src, env.seq
        if src in held:
            continue
        pos = positions.get(src)
        if pos is None:
            pos = positions[src] = outbox.inbox_position(b.reader, src)
        if seq != pos:
            res.stale += 1
            if seq > pos:
                held.add(src)  # a gap: keep the order, wait for the missing one
            continue
        key = (src, seq)
        at = retries.retry_at(key)
        if at > now_ms:
            held.add(src)
            res.retry_at[src] = at
            continue
        mark = b.writes.savepoint()
        outs, failures = _run_envelope(b, runner, env.raw)
        if failures and not retries.last_attempt(key):
            b.writes.rollback(mark)
            held.add(src)
            res.retry_at[src] = retries.failed(key, now_ms)
            continue
        attempts = retries.attempts_made(key) + 1
        retries.forget(key)
        for m, failure in failures:
            task = m[1] if isinstance(m, list) and len(m) == 4 and isinstance(m[1], int) else -1
            task = task if task >= 0 and runner.owns_task(task) else runner.group
            b.depot_append(DEAD_LETTERS, task, [dead_letter(failure.hop, failure.error, task, m, src, attempts)])
            res.dead_letters += 1
        for out in outs:
            if out:
                sends.add(out, key)
        positions[src] = seq + 1
        res.consumed[src] = seq + 1
    for src, pos in res.consumed.items():
        outbox.set_inbox_position(b, src, pos)
    if res.dead_letters:
        outbox.count_dead_letters(b, res.dead_letters)
    sends.write(b)
    if not res.consumed:
        res.builder = None
    return res


def _run_envelope(b: ChangeSetBuilder, runner: StreamRunner, raw: bytes
                  ) -> tuple[list[Outbound], list[tuple[Any, HopFailed]]]:
    """Run one envelope's messages: what they send, and the messages that failed with why.

    All of them as one unit first (the common case: nothing fails); if one
    fails, that unit left nothing behind and each message runs on its own, so
    the failing ones are known and the others' effects are kept.
    """
    try:
        _parents, messages = decode_envelope(raw)
    except ValueError as e:
        return [], [(raw[:200], HopFailed("?", -1, str(e), "envelope"))]
    try:
        return [runner.run_messages(b, messages)], []
    except HopFailed:
        pass
    outs: list[Outbound] = []
    failures: list[tuple[Any, HopFailed]] = []
    for m in messages:
        try:
            outs.append(runner.run_message(b, m))
        except HopFailed as failed:
            failures.append((m, failed))
    return outs, failures


# ------------------------------------------------------------------------------------ trims and tracking


def trim_outbox(builder: ChangeSetBuilder, complete: dict[int, int]) -> int:
    """Drop envelopes each destination reported complete (``complete``: destination -> complete prefix)."""
    return sum(outbox.trim(builder, dst, below) for dst, below in complete.items())


def track_applied(tracker: CompletionTracker, offset: int, cs: ChangeSet) -> bool:
    """Tell the tracker what applied entry ``offset`` did; True when it is complete as a root."""
    consumed, sent = outbox.flow_of(cs)
    if not consumed and not sent:
        return True
    return tracker.applied(offset, consumed, [(dst, seq, envelope_parents(raw)) for dst, seq, raw in sent])


def rebuild_tracker(store: TaskGroupStore) -> CompletionTracker:
    """A new leader's tracker, from the applied state (see :meth:`CompletionTracker.rebuild`)."""
    reader = store.applied_reader()
    live = {dst: (b.start, [(seq, envelope_parents(raw)) for seq, raw in outbox.iter_envelopes(reader, dst, b.start)])
            for dst, b in outbox.destinations(reader).items()}
    return CompletionTracker.rebuild(outbox.inbox_positions(reader), live)
