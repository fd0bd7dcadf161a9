"""How a replica's replog entries become log frames and replication messages (the task thread's log I/O).

A leader writes one drain's entries as frames of about :data:`LOG_FRAME_BYTES` and a follower writes the
leader's frames as they came; a leader reads frames back into :class:`replog.messages.RawReplicate`
messages of at most :data:`MAX_FRAME_BYTES`. Sizes are here so that a frame, and the message that carries
it, stay bounded whatever a drain appends.
"""

from __future__ import annotations

from typing import Any

from replog.batch import scan_frames, trim_frames
from replog.log import Log
from replog.messages import AppendLocal, RawReplicate, SendEntries

#: entry type of a client depot append (the payload is a pstate change set)
ENTRY_CLIENT_APPEND = 1
#: largest replication message the driver builds; gRPC's default limit is 4 MiB
MAX_FRAME_BYTES = 2 * 1024 * 1024
#: a leader writes one drain's entries as log frames of about this size (an entry over it gets a frame of
#: its own), so a frame, and the replication message that carries it, stays near its entry limit
LOG_FRAME_BYTES = 4 * 1024 * 1024


def append_local(log: Log, a: AppendLocal, name: str) -> None:
    """Write an ``AppendLocal``'s entries (not yet fsynced: the drain flushes once)."""
    assert a.first == log.end_offset, (name, a.first, log.end_offset)
    if isinstance(a.data, list):  # leader: encoded (and already staged) change sets, one epoch
        epoch = a.epochs[0]
        assert all(e == epoch for e in a.epochs)
        skip = a.first - a.data_first
        payloads = a.data[skip: skip + len(a.epochs)]
        assert all(isinstance(x, bytes) for x in payloads), "a leader appends only built change sets"
        i = 0
        while i < len(payloads):  # frames of about LOG_FRAME_BYTES, so replication messages stay bounded
            j, size = i + 1, len(payloads[i])
            while j < len(payloads) and size + len(payloads[j]) <= LOG_FRAME_BYTES:
                size += len(payloads[j])
                j += 1
            log.append(epoch, ENTRY_CLIENT_APPEND, payloads[i:j])
            i = j
    else:  # follower: raw frames from the leader
        raw = a.data
        assert isinstance(raw, bytes)
        if a.first != a.data_first:
            raw = trim_frames(raw, a.first)
        want_end = a.first + len(a.epochs)
        log.append_frames(raw)
        if log.end_offset > want_end:
            log.truncate(want_end)


def replicate_messages(log: Log, src: str, a: SendEntries) -> list[RawReplicate]:
    """A ``SendEntries``'s range read back as replication messages (one empty one: a beat)."""
    start = a.start
    if start >= a.end:
        return [RawReplicate(src, a.epoch, start, b"", a.apply_offset)]
    out = []
    while start < a.end:
        raw = log.read(start, MAX_FRAME_BYTES, end=a.end)
        frames = scan_frames(raw).frames
        out.append(RawReplicate(src, a.epoch, frames[0].base_offset, raw, a.apply_offset))
        start = frames[-1].next_offset
    return out


class ReplicateReads:
    """A leader's reads of replog ranges for its followers until they are handed to the transport.

    Followers in step are sent the same range in the same drain: they share one read here, and so one
    encoding (``PeerTransport.send_many`` encodes a message object once, whatever number of followers it goes
    to), instead of copying the range's frames out of the log and into a message once per follower. A
    leader's log never changes below its end within its epoch, which the key holds (a replica truncates only
    as a follower, and leads again only in a later epoch); the host ends the memo when it hands the drain's
    messages over (:meth:`handed`), so it holds no frames longer than the outbox does.
    """

    def __init__(self) -> None:
        self._last: tuple[tuple[int, int, int, int], list[RawReplicate]] | None = None

    def messages(self, log: Log, src: str, a: SendEntries) -> list[RawReplicate]:
        key = (a.epoch, a.start, a.end, a.apply_offset)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        out = replicate_messages(log, src, a)
        self._last = (key, out)
        return out

    def handed(self, out: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """``out`` (the drain's messages, now handed to the transport or held as beats): the memo is done."""
        self._last = None
        return out
