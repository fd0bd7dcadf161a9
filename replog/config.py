"""Replication options, with their operator-facing names and defaults.

The dotted names (``replication.max.time.lag.millis`` ...) are what operators
type in ``conductor set-option`` and what module specs carry in ZooKeeper; the
state machines only ever see a frozen :class:`ReplicationConfig`, so a change of
options is a new object handed to a new state machine, never a field mutated
under a running leader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

#: ``replog.segment.bytes``: retention deletes whole segments, so this is also the granularity of disk use
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
#: smallest segment: far above one frame's header (the log refuses a segment that cannot hold one), and a
#: busy group does not make a file per frame (Kafka's floor is 1 MiB; 64 KiB lets tests exercise retention)
MIN_SEGMENT_BYTES = 64 * 1024
MAX_SEGMENT_BYTES = 1024 * 1024 * 1024
#: longest timeout an option may take (a day): beyond it a stalled group looks like a hung one
MAX_MILLIS = 24 * 60 * 60 * 1000

#: the highest ``replication.max.entry.bytes`` may go: half the transport's message limit (64 MiB,
#: ``conductor.wire.options``), so a replication message (one entry plus the frames batched with it)
#: always fits
MAX_ENTRY_BYTES_CEILING = 32 * 1024 * 1024

#: dotted option name -> field of :class:`ReplicationConfig`
OPTION_NAMES: dict[str, str] = {
    "replication.factor": "replication_factor",
    "replication.min.isr": "min_isr",
    "replication.max.time.lag.millis": "max_time_lag_ms",
    "replication.depot.append.timeout.millis": "append_timeout_ms",
    "replication.max.near.sync.message.lag": "max_near_sync_message_lag",
    "replication.max.inflight.entries": "max_inflight_entries",
    "replication.max.inflight.bytes": "max_inflight_bytes",
    "replication.max.unapplied.entries": "max_unapplied_entries",
    "replication.max.unapplied.bytes": "max_unapplied_bytes",
    "replication.max.batch.entries": "max_batch_entries",
    "replication.request.timeout.millis": "request_timeout_ms",
    "replication.heartbeat.interval.millis": "heartbeat_interval_ms",
    "replication.far.horizon.retry.millis": "far_horizon_retry_ms",
    "replication.max.record.bytes": "max_record_bytes",
    "replication.max.entry.bytes": "max_entry_bytes",
    "replication.fsync": "fsync",
    "replication.flush.ms": "flush_ms",
}

#: ``replication.fsync``: every ISR member fsyncs an entry before acknowledging it (the default contract)
FSYNC_ALWAYS = 1
#: ``replication.fsync``: entries are acknowledged from the page cache and flushed every ``replication.flush.ms``
FSYNC_INTERVAL = 2
#: the words an operator types for ``replication.fsync``, and the codes the options carry (options are integers)
FSYNC_MODES: dict[str, int] = {"always": FSYNC_ALWAYS, "interval": FSYNC_INTERVAL}


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    """Limits and timeouts of one task group's replication.

    Every limit exists so that a slow or dead peer costs bounded memory and a
    bounded wait, never an unbounded queue: in-flight data per follower, the
    leader's lead over the apply offset, and how long an append may wait.
    """

    replication_factor: int = 3
    #: replicas that must hold an entry before it is applied; ``None`` means
    #: the default ``replication_factor - 1`` (at least 1), see :attr:`effective_min_isr`.
    min_isr: int | None = None
    #: an ISR member that has not confirmed an entry this long is moved to the OSR.
    max_time_lag_ms: int = 10_000
    #: a client append not answered at its ack level by then fails (StalledGroup / Backpressure).
    append_timeout_ms: int = 30_000
    #: followers further behind than this many entries use far-horizon catchup.
    max_near_sync_message_lag: int = 20_000
    #: per-follower bound on entries sent but not yet acknowledged.
    max_inflight_entries: int = 50_000
    #: per-follower bound on bytes sent but not yet acknowledged.
    max_inflight_bytes: int = 64 * 1024 * 1024
    #: bound on the leader's log end over its apply offset, in entries; appends beyond fail with Backpressure.
    max_unapplied_entries: int = 100_000
    #: same bound in bytes (counting entries appended under this leadership).
    max_unapplied_bytes: int = 256 * 1024 * 1024
    #: most entries in one replication frame (the driver may split further by bytes).
    max_batch_entries: int = 5_000
    #: resend unacknowledged frames / epoch requests after this long.
    request_timeout_ms: int = 1_000
    #: the leader sends an empty frame (apply offset, epoch) at least this often. Only an idle group beats
    #: (entries carry the same news), and nothing waits on a beat: ISR lag is measured from entries and
    #: failures are detected by sessions, so a beat only repairs a lost message. At 200 ms the beats and
    #: their acks were most of an idle cluster's CPU; a new apply offset or epoch goes out at once anyway.
    heartbeat_interval_ms: int = 1_000
    #: re-issue StartFarHorizon if the follower has not caught up after this long.
    far_horizon_retry_ms: int = 60_000
    #: largest record a client may append (its encoded bytes); larger ones fail with EntryTooLarge.
    max_record_bytes: int = 4 * 1024 * 1024
    #: largest replog entry one append may become (records, topology effects, hop messages); at most
    #: MAX_ENTRY_BYTES_CEILING so every entry can be replicated.
    max_entry_bytes: int = 16 * 1024 * 1024
    #: durability mode (FSYNC_ALWAYS or FSYNC_INTERVAL; docs/replication.md, "Durability modes"): whether an
    #: entry is acknowledged once fsynced or once written to the page cache, relying on the other ISR members
    fsync: int = FSYNC_ALWAYS
    #: in FSYNC_INTERVAL mode, the longest an acknowledged entry stays in the page cache only
    flush_ms: int = 100

    def __post_init__(self) -> None:
        if self.replication_factor < 1:
            raise ValueError(f"replication.factor must be >= 1, got {self.replication_factor}")
        if self.min_isr is not None and not 1 <= self.min_isr <= self.replication_factor:
            raise ValueError(
                f"replication.min.isr must be between 1 and replication.factor "
                f"({self.replication_factor}), got {self.min_isr}"
            )
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ("replication_factor", "min_isr") and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{_dotted(f.name)} must be a positive integer, got {value!r}")
        if self.fsync not in FSYNC_MODES.values():
            raise ValueError(f"replication.fsync must be one of {sorted(FSYNC_MODES)}, got code {self.fsync!r}")
        if self.max_entry_bytes > MAX_ENTRY_BYTES_CEILING:
            raise ValueError(f"replication.max.entry.bytes must be at most {MAX_ENTRY_BYTES_CEILING:,} (half the "
                             f"transport's message limit), got {self.max_entry_bytes:,}")
        if self.max_record_bytes > self.max_entry_bytes:
            raise ValueError(f"replication.max.record.bytes ({self.max_record_bytes:,}) must not exceed "
                             f"replication.max.entry.bytes ({self.max_entry_bytes:,})")

    @property
    def acks_from_page_cache(self) -> bool:
        """FSYNC_INTERVAL: a replica acknowledges what it wrote before fsyncing it (the storage marks say so, and
        an unclean restart of the machine then counts as lost storage: replog.eligibility)."""
        return self.fsync == FSYNC_INTERVAL

    @property
    def effective_min_isr(self) -> int:
        """min-ISR as the design defines it: ``replicationFactor - 1`` unless set, and at least 1."""
        if self.min_isr is not None:
            return self.min_isr
        return max(1, self.replication_factor - 1)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> ReplicationConfig:
        """Build from dotted option names (as stored in the module spec); unknown names are an error."""
        kwargs: dict[str, int | None] = {}
        for name, value in options.items():
            field = OPTION_NAMES.get(name)
            if field is None:
                known = ", ".join(sorted(OPTION_NAMES))
                raise ValueError(f"unknown replication option {name!r}; known options: {known}")
            if field == "fsync" and isinstance(value, str) and value in FSYNC_MODES:
                value = FSYNC_MODES[value]
            kwargs[field] = None if value is None else int(value)
        return cls(**kwargs)  # type: ignore[arg-type]

    def to_options(self) -> dict[str, int | None]:
        """The inverse of :meth:`from_options`."""
        return {name: getattr(self, field) for name, field in OPTION_NAMES.items()}


def _dotted(field: str) -> str:
    for name, f in OPTION_NAMES.items():
        if f == field:
            return name
    return field


# ---------------------------------------------------------------------------------- option rules

SEGMENT_BYTES_OPTION = "replog.segment.bytes"


class OptionRuleError(ValueError):
    """An option value outside its meaning, or inconsistent with another option; says which and why."""

    def __init__(self, name: str, value: int, why: str) -> None:
        self.name = name
        self.value = value
        self.why = why
        super().__init__(f"invalid value {value!r} for option {name}: {why}")


#: a follower answers every frame of entries; a lost answer is repaired by its answer to the next heartbeat,
#: so the lag allowed must span at least one heartbeat interval
_HEARTBEAT_MS = ReplicationConfig().heartbeat_interval_ms


#: option -> (smallest, largest) value and what the bound protects
OPTION_RANGES: dict[str, tuple[int, int, str]] = {
    "replication.max.time.lag.millis": (
        _HEARTBEAT_MS, MAX_MILLIS,
        f"a lost acknowledgement is repaired by the next heartbeat, every {_HEARTBEAT_MS} ms, so a shorter "
        "lag drops healthy followers from the ISR"),
    "replication.depot.append.timeout.millis": (1, MAX_MILLIS, "a timeout is positive and at most a day"),
    "replication.max.near.sync.message.lag": (1, 1 << 31, "a count of replog entries"),
    SEGMENT_BYTES_OPTION: (
        MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES,
        "a replog segment holds whole frames, and smaller ones would make a file per frame"),
}


def check_options(values: Mapping[str, int], replication_factor: int) -> None:
    """Raise :class:`OptionRuleError` unless every value fits its meaning and the values fit each other.

    ``values`` holds the effective value of every option concerned (stored or
    default), so a change is checked against the options it did not touch.
    """
    for name, value in values.items():
        bounds = OPTION_RANGES.get(name)
        if bounds is not None:
            lo, hi, why = bounds
            if not lo <= value <= hi:
                raise OptionRuleError(name, value, f"must be between {lo:,} and {hi:,}: {why}")
    min_isr = values.get("replication.min.isr")
    if min_isr is not None and not 1 <= min_isr <= replication_factor:
        raise OptionRuleError("replication.min.isr", min_isr,
                              f"must be at least 1 and cannot exceed the replication factor {replication_factor}")
    lag = values.get("replication.max.time.lag.millis")
    timeout = values.get("replication.depot.append.timeout.millis")
    if lag is not None and timeout is not None and timeout <= lag:
        raise OptionRuleError("replication.depot.append.timeout.millis", timeout,
                              f"must exceed replication.max.time.lag.millis ({lag:,}): an append waits out "
                              "a silent follower's removal from the ISR, or losing one follower fails appends "
                              "instead of delaying them (lower the lag first, or raise this)")
