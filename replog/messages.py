"""Events into and actions out of the replication state machine (:mod:`replog.replica`).

The state machine performs no I/O. A driver (the worker process over gRPC,
disk and ZooKeeper, or the simulator in ``tests/sim``) feeds it **events** with
``replica.handle(event, now_ms)`` and performs the **actions** it returns, in
order. This module is the whole vocabulary between the two.

Offsets: a log holds entries ``[0, end)``; names ending in ``end`` are
exclusive, while ``held`` / ``apply_offset`` / ``applied`` / ``up_to`` are the
*last* offset concerned (inclusive, ``-1`` = none), matching ``_meta.applied``.

Driver contract (what the state machine relies on):

* :class:`AppendLocal` writes the entries, then makes them durable (batch
  fsyncs freely) and reports :class:`LocalFlushed` with the end of the durable
  prefix. A LocalFlushed must never report entries written before a later
  :class:`Truncate` (e.g. tag flushes with a generation).
* :class:`Truncate` is durable before the next action runs; entries below the
  cut that were not yet durable are still flushed and reported as usual.
* :class:`PersistEpochs` replaces the epoch checkpoint durably (fsync) before
  the next action runs.
* :class:`Apply` applies entries ``(applied, up_to]`` atomically with
  ``_meta.applied``.
* :class:`SendEntries` reads ``[start, end)`` (bytes and per-entry epochs) from
  the local log and delivers a :class:`Replicate` event at ``dst``; :class:`Send`
  delivers its message as an event at ``msg.dst``. Either may be lost,
  duplicated or reordered; the protocol tolerates all three.
* :class:`ChangeIsr` is a compare-and-set on the group znode; its outcome comes
  back as :class:`IsrChanged` or :class:`IsrChangeFailed`. Every znode change
  is also delivered to every replica as :class:`MetastoreChanged`.
* Leader election and the epoch bump are one CAS by the controller (which picks
  only ISR members); the elected replica learns it via MetastoreChanged.
* :class:`RecordStorage` is a compare-and-set on the group znode too, by any replica: it records the replica's
  storage incarnation, leaving the ISR (and the leadership) first when its storage lost something it acknowledged
  (:mod:`replog.eligibility`); its outcome comes back like a ChangeIsr's. Until the znode records its
  incarnation a replica acknowledges, applies and leads nothing.
* :class:`HandOff` is the one exception: a resigning leader's own CAS that makes
  an in-sync follower leader of the next epoch and withdraws the resign request
  (``/millrace/modules/<m>/resign/<g>``) in the same transaction. Its outcome
  comes back like a ChangeIsr's, as :class:`IsrChanged` or :class:`IsrChangeFailed`.
* :class:`Removed`: the znode no longer lists this replica (a reassignment,
  :mod:`replog.reassignment`, removed it). The driver closes the replica and
  deletes its data, unless ``retired`` (kept until a znode no longer lists it
  among the retired copies); the replica ignores every later event. If the group
  takes the node back, the driver opens a replica from the data it kept, else
  a new, empty one.
* :class:`Reply` answers one client append.
* Retention: the driver asks :meth:`Replica.retention_point` with the applied
  offset its store holds *durably*, deletes whole log segments below the answer
  (never more) and reports the new first offset with :class:`LogStartAdvanced`.
* :class:`StartFarHorizon`: the driver ships the follower a checkpoint of the
  leader's applied state (store files plus the epoch pairs up to it). The
  follower installs it only while it follows that leader, is outside the ISR
  and holds nothing beyond the checkpoint (so no entry it acknowledged is
  dropped), then resets its log to start after the checkpoint and is rebuilt
  like a restarted replica.

Vocabulary at a glance (driver: what to do / where an event comes from):

==========================  =================================================================
event                        source
==========================  =================================================================
ClientAppend                 a client's append RPC (validate it; ``data`` is the batch)
LocalFlushed                 the log's fsync completion
Tick                         a timer, every ~10-50 ms (the machine has no clock of its own)
MetastoreChanged             the group znode watch, and once at start-up
IsrChanged / IsrChangeFailed the outcome of a ChangeIsr CAS
SessionExpired / Started     the ZooKeeper session listener
LogStartAdvanced             the driver deleted log segments (retention)
ConfigChanged                the module znode watch (``conductor set-option``)
ResignRequested              the group's resign znode watch (the conductor balancing leaders)
Replicate                    a frame from the leader, built from its SendEntries
ReplicateAck, Epoch*         a peer's Send
==========================  =================================================================

==========================  =================================================================
action                       driver does
==========================  =================================================================
AppendLocal                  write entries, fsync (batched), then LocalFlushed
Truncate / PersistEpochs     cut the log / rewrite the epoch checkpoint, durably
Apply                        apply entries to PStates atomically with ``_meta.applied``
SendEntries / Send           the TCP peer link to the follower / the peer
ChangeIsr                    CAS on ``/millrace/modules/<m>/groups/<g>``
RecordStorage                CAS on the group znode (this replica's incarnation, leaving the ISR if lost)
HandOff                      CAS on the group znode + delete of its resign request, atomically
StartFarHorizon              checkpoint + file copy in rounds to the follower
Reply                        answer the client (error -> gRPC status via ``grpc_code``)
RoleChanged                  start/stop stream topologies, refresh client routing
Removed                      close the replica, delete its data unless retired (a reassignment removed it)
==========================  =================================================================

A restarted replica is rebuilt with ``Replica(node, group, config, session=..., log_start=<first offset on
disk>, log_end=<recovered end>, epoch_pairs=<checkpoint>, applied=<_meta.applied>, incarnation=<storage
incarnation>, unsure=<the open-time check's doubt>)`` and then fed ``MetastoreChanged(<current znode>)``; the
storage marks the driver keeps, and checks at open, are :mod:`replog.eligibility`'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from replog.config import ReplicationConfig
from replog.errors import ReplogError


class Ack(StrEnum):
    """When a client append is answered."""

    NONE = "none"  #: as soon as the leader accepted it (may be lost)
    APPEND = "append"  #: once the leader holds it durably (lost only by a failover before it is applied)
    APPLIED = "applied"  #: once it is applied: held by every ISR member, |ISR| >= min-ISR


class Role(StrEnum):
    LEADER = "leader"
    FOLLOWER = "follower"
    #: knows the epoch but follows nobody (no leader elected, or this replica's
    #: session lost the leadership); accepts no writes and applies nothing new.
    UNATTACHED = "unattached"


#: the incarnation recorded for an ISR member whose storage lost acknowledged entries (never elected)
STORAGE_LOST = 0


class InvalidGroupState(ValueError):
    """A group state breaks an invariant (e.g. a leader outside the ISR); refuse it rather than store it."""


@dataclass(frozen=True, slots=True)
class GroupState:
    """A task group's leadership and membership: the znode ``.../groups/<g>`` and its version.

    The one description of a group's state, shared by the state machine, the
    metastore, the conductor and the client. ``isr`` and ``osr`` partition the
    replicas; ``leader`` is None while no in-sync replica is live.
    ``leader_session`` binds the leadership to the ZooKeeper session that was
    elected (0: unknown or no leader): a replica that restarted (new session)
    must not resume leading an epoch whose unflushed tail it may have lost.
    ``version`` is the znode's version when read (it is not stored in the
    znode). ``storage`` records, per replica that registered its storage, the
    storage's incarnation id and the ZooKeeper session that recorded it
    (KIP-903: a replica confirms its storage under every new session, so the
    conductor elects only replicas that did); :data:`STORAGE_LOST` marks an ISR
    member whose storage lost acknowledged entries and which could not leave
    the ISR (it was the last member): it is never elected. Kept sorted.
    ``placement`` is the replicas in preference order, the first one the
    preferred leader; a state the replication state machine proposes leaves it
    empty, and the metastore keeps the stored order when it writes one.
    ``elr`` (eligible leader replicas, KIP-966) are OSR members that still hold
    every applied entry: leaders the conductor removed from the ISR when they
    lost their session and at most one live in-sync copy was left, while nothing was
    applied since (a leader applies nothing until its own first CAS has emptied
    ``elr``). They are elected when no ISR member can be, so that lone replica
    losing its storage right after the failover does not stall a group whose
    old leader holds everything.
    ``adding`` and ``removing`` describe a reassignment in progress (Kafka's
    KIP-455; :mod:`replog.reassignment` computes its steps): during one the
    replicas are the target plus the original, ``adding`` the target replicas
    that are not original (they start in the OSR and join the ISR by the
    leader's usual rejoin rule once caught up), ``removing`` the original
    replicas that are not in the target (they stay full members, electable
    only when no other in-sync replica can lead, until the last step drops
    them). Both empty: no reassignment (the znode of a group never reassigned
    has neither field).
    ``retired`` are the storage records (name, incarnation, session) of *retired
    copies*: removed from the ISR by the write that ended a plan, kept on disk
    (no longer replicas) until every replica in ``reconfirming`` that is in the
    ISR or ELR recorded its storage again after that write (:mod:`replog.retirement`).
    ``unsure``: ISR/ELR members whose log may lack what they acknowledged, as (name, last epoch, log end, epoch
    registered in) (:func:`replog.eligibility.storage_unsure`); dropped when the member leaves the ISR and ELR.
    Construction validates, so no process can store or act on a broken state.
    """

    leader: str | None
    epoch: int
    isr: tuple[str, ...]
    osr: tuple[str, ...]
    version: int = 0
    leader_session: int = 0
    placement: tuple[str, ...] = ()
    storage: tuple[tuple[str, int, int], ...] = ()
    elr: tuple[str, ...] = ()
    adding: tuple[str, ...] = ()
    removing: tuple[str, ...] = ()
    retired: tuple[tuple[str, int, int], ...] = ()
    reconfirming: tuple[str, ...] = ()
    unsure: tuple[tuple[str, int, int, int], ...] = ()

    def __post_init__(self) -> None:
        # Accept lists from callers but store tuples, so states are hashable and immutable.
        for name in ("isr", "osr", "placement", "elr", "adding", "removing", "reconfirming"):
            value = getattr(self, name)
            if not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        for name in ("storage", "retired"):
            object.__setattr__(self, name, tuple(sorted(tuple(r) for r in getattr(self, name))))
        object.__setattr__(self, "unsure", tuple(sorted(tuple(r) for r in self.unsure if r[0] in self.isr + self.elr)))
        self.validate()

    def incarnation_of(self, node: str) -> int | None:
        """The storage incarnation recorded for ``node`` (STORAGE_LOST if lost), None if it never registered."""
        for name, inc, _session in self.storage:
            if name == node:
                return inc
        return None

    def storage_session(self, node: str) -> int | None:
        """The session under which ``node`` last recorded its storage, None if it never did."""
        for name, _inc, session in self.storage:
            if name == node:
                return session
        return None

    def with_storage(self, node: str, incarnation: int, session: int) -> tuple[tuple[str, int, int], ...]:
        """The storage records with ``node``'s set (for a ``replace``)."""
        return tuple(sorted([r for r in self.storage if r[0] != node] + [(node, incarnation, session)]))

    @property
    def replicas(self) -> tuple[str, ...]:
        """Every replica of the group, in preference order when the placement is known."""
        return self.placement or self.isr + self.osr

    @property
    def reassigning(self) -> bool:
        """A reassignment is in progress (its replicas are the target plus the original)."""
        return bool(self.adding or self.removing)

    @property
    def target(self) -> tuple[str, ...]:
        """The replicas once the reassignment in progress completes (all of them when there is none)."""
        return tuple(r for r in self.replicas if r not in self.removing)

    @property
    def original(self) -> tuple[str, ...]:
        """The replicas before the reassignment in progress, which a cancel goes back to (all when none)."""
        return tuple(r for r in self.replicas if r not in self.adding)

    def validate(self) -> None:
        """Raise InvalidGroupState naming the first broken invariant."""
        for name in ("epoch", "version", "leader_session"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidGroupState(f"{name} must be a whole number >= 0, got {value!r}")
        replicas = self.replicas
        if len(set(replicas)) != len(replicas):
            raise InvalidGroupState(f"replicas of a group must be on distinct nodes, got {list(replicas)}")
        if not self.isr:
            raise InvalidGroupState("the ISR can never be empty (it keeps its last members while leaderless)")
        if set(self.isr) & set(self.osr):
            raise InvalidGroupState(f"ISR {list(self.isr)} and OSR {list(self.osr)} overlap")
        if set(self.isr) | set(self.osr) != set(replicas) or len(self.isr) + len(self.osr) != len(replicas):
            raise InvalidGroupState(
                f"ISR {list(self.isr)} and OSR {list(self.osr)} must partition the replicas {list(replicas)}")
        if self.leader is not None and self.leader not in self.isr:
            raise InvalidGroupState(f"leader {self.leader} is not in the ISR {list(self.isr)}")
        names = [r[0] for r in self.storage]
        if len(set(names)) != len(names):
            raise InvalidGroupState(f"storage recorded twice for a replica: {names}")
        for record in self.storage:
            if len(record) != 3 or record[0] not in replicas:
                raise InvalidGroupState(f"storage record {record!r} is not (replica, incarnation, session) "
                                        f"of a replica of {list(replicas)}")
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in record[1:]):
                raise InvalidGroupState(f"storage record {record!r} needs whole numbers >= 0")
        if self.leader is not None and self.incarnation_of(self.leader) == STORAGE_LOST:
            raise InvalidGroupState(f"leader {self.leader} lost its storage")
        if len(set(self.elr)) != len(self.elr) or not set(self.elr) <= set(self.osr):
            raise InvalidGroupState(f"eligible leader replicas {list(self.elr)} must be distinct OSR members "
                                    f"(OSR {list(self.osr)})")
        if any(self.incarnation_of(x) == STORAGE_LOST for x in self.elr):
            raise InvalidGroupState(f"an eligible leader replica of {list(self.elr)} lost its storage")
        for name in ("adding", "removing"):
            members = getattr(self, name)
            if len(set(members)) != len(members) or not set(members) <= set(replicas):
                raise InvalidGroupState(f"replicas {name} {list(members)} must be distinct replicas of "
                                        f"{list(replicas)}")
        if set(self.adding) & set(self.removing):
            raise InvalidGroupState(f"a replica cannot be both added and removed: adding {list(self.adding)}, "
                                    f"removing {list(self.removing)}")
        if not self.target or not self.original:
            raise InvalidGroupState(f"a reassignment needs replicas before and after it: replicas "
                                    f"{list(replicas)}, adding {list(self.adding)}, removing {list(self.removing)}")
        gone = [r[0] for r in self.retired]
        if (len(set(gone)) != len(gone) or set(gone) & set(replicas) or (self.retired and self.reassigning)
                or any(len(r) != 3 or r[1] <= STORAGE_LOST or r[2] < 0 for r in self.retired)
                or len(set(self.reconfirming)) != len(self.reconfirming) or not set(self.reconfirming) <= set(replicas)
                or (self.reconfirming and not self.retired)):
            raise InvalidGroupState(f"retired copies {list(self.retired)} must be distinct non-replicas with their "
                                    f"storage, kept only after a plan, reconfirming {list(self.reconfirming)} replicas")
        if len({r[0] for r in self.unsure}) != len(self.unsure) or any(len(r) != 4 or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in r[1:]) for r in self.unsure):
            raise InvalidGroupState(f"unsure records {list(self.unsure)} must be (replica, epoch, end, epoch), one each")

    def to_dict(self) -> dict[str, Any]:
        """The znode's document (the version is the znode's own, not part of it)."""
        doc: dict[str, Any] = {"leader": self.leader, "epoch": self.epoch, "isr": list(self.isr),
                               "osr": list(self.osr), "replicas": list(self.replicas),
                               "leader_session": self.leader_session}
        if self.storage:
            doc["storage"] = {name: [inc, session] for name, inc, session in self.storage}
        if self.elr:
            doc["elr"] = list(self.elr)
        if self.adding:
            doc["adding"] = list(self.adding)
        if self.removing:
            doc["removing"] = list(self.removing)
        if self.retired:
            doc["retired"] = {name: [inc, session] for name, inc, session in self.retired}
            doc["reconfirming"] = list(self.reconfirming)
        if self.unsure:
            doc["unsure"] = {name: list(rest) for name, *rest in self.unsure}
        return doc

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str, version: int = 0) -> GroupState:
        """Parse a znode's document read at ``version``; InvalidGroupState if malformed or broken."""
        try:
            doc = json.loads(raw)
            return cls(leader=doc["leader"], epoch=doc["epoch"], isr=tuple(doc["isr"]), osr=tuple(doc["osr"]),
                       version=version, leader_session=int(doc.get("leader_session", 0)),
                       placement=tuple(doc["replicas"]), storage=tuple((str(name), int(inc), int(session))
                                                                  for name, (inc, session) in
                                                                  dict(doc.get("storage", {})).items()),
                       elr=tuple(str(x) for x in doc.get("elr", ())),
                       adding=tuple(str(x) for x in doc.get("adding", ())),
                       removing=tuple(str(x) for x in doc.get("removing", ())),
                       retired=tuple((str(name), int(inc), int(session))
                                     for name, (inc, session) in dict(doc.get("retired", {})).items()),
                       reconfirming=tuple(str(x) for x in doc.get("reconfirming", ())),
                       unsure=tuple((str(n), int(e), int(end), int(at)) for n, (e, end, at) in dict(doc.get("unsure", {})).items()))
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidGroupState(f"malformed group state {raw!r}: {e}") from None

    @classmethod
    def initial(cls, replicas: Sequence[str], leader_session: int = 0) -> GroupState:
        """A freshly placed group: every replica in sync (they are all empty), first one leads, epoch 1.

        Replicas start at epoch 0 with an empty epoch cache; leadership is always a move to a
        *higher* epoch, so the first leader's epoch is 1 (a replica ignores a znode at its own epoch).
        """
        if not replicas:
            raise InvalidGroupState("a task group needs at least one replica")
        return cls(leader=replicas[0], epoch=1, isr=tuple(replicas), osr=(), leader_session=leader_session,
                   placement=tuple(replicas))


# ----------------------------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class ClientAppend:
    """A client asks the leader to append ``count`` entries (``data`` is opaque to the state machine)."""

    request_id: int
    count: int
    nbytes: int
    ack: Ack
    data: object = None

    def __post_init__(self) -> None:
        if self.count < 1 or self.nbytes < 0:
            raise ValueError(f"an append needs count >= 1 and nbytes >= 0, got {self.count}, {self.nbytes}")


@dataclass(frozen=True, slots=True)
class LocalFlushed:
    """Entries ``[0, end)`` of the local log are durable."""

    end: int


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed; timeouts (ISR lag, append deadlines, resends, heartbeats) are evaluated."""


@dataclass(frozen=True, slots=True)
class MetastoreChanged:
    """The group znode changed (watch) or was read (start-up)."""

    state: GroupState


@dataclass(frozen=True, slots=True)
class IsrChanged:
    """A :class:`ChangeIsr` compare-and-set succeeded; ``state`` is what was written (its ``new``)."""

    state: GroupState


@dataclass(frozen=True, slots=True)
class IsrChangeFailed:
    """A :class:`ChangeIsr` failed: ``reason`` is ``"conflict"`` (version moved on) or ``"session_expired"``.

    ``proposed`` is the ``new`` state of the failed action: results can arrive
    after the replica moved on (even to a new leadership of its own), and only
    the answer to the CAS in flight may change anything.
    """

    reason: str
    proposed: GroupState
    current: GroupState | None = None


@dataclass(frozen=True, slots=True)
class SessionExpired:
    """This replica's metastore session expired: a leader stops writing and applying at once."""


@dataclass(frozen=True, slots=True)
class SessionStarted:
    """The driver opened a new metastore session (the controller may elect this replica with it)."""

    session: int


@dataclass(frozen=True, slots=True)
class ConfigChanged:
    """An operator changed the module's options (``conductor set-option``); they apply from now on.

    The replication factor a group runs with is its replica set in the znode
    (changed by a reassignment, :mod:`replog.reassignment`); the option's
    value only says what the conductor places.
    """

    config: ReplicationConfig


@dataclass(frozen=True, slots=True)
class ResignRequested:
    """The conductor asks the leader of ``epoch`` to hand leadership to ``to`` (which leads under ``to_session``).

    A coordinated hand-off for balancing: the leader stops taking appends,
    waits until everything it appended is applied (so ``to`` holds it all),
    then performs a :class:`HandOff`. Requests for another epoch are stale.
    """

    to: str
    to_session: int
    epoch: int


# ------------------------------------------------------------------------- messages between replicas
# Received messages are events; sent ones travel inside actions.


@dataclass(frozen=True, slots=True)
class Replicate:
    """Leader -> follower: entries ``[start, start + len(entry_epochs))`` plus the apply offset.

    Built by the driver from a :class:`SendEntries` action; an empty one is a
    heartbeat that carries the epoch and apply offset.
    """

    src: str
    dst: str
    epoch: int
    start: int
    entry_epochs: tuple[int, ...]
    apply_offset: int
    data: object = None


@dataclass(frozen=True, slots=True)
class RawReplicate:
    """A :class:`Replicate` as it crosses the network between workers: the leader's log frames, still encoded.

    The worker decodes and validates the frames (CRC, offsets) on the
    follower's task thread, not on the event loop that received them, and only
    then feeds the state machine a :class:`Replicate`. Without frames it is a
    heartbeat, like an empty Replicate.
    """

    src: str
    epoch: int
    start: int
    frames: bytes
    apply_offset: int


@dataclass(frozen=True, slots=True)
class FarHorizonOffer:
    """Leader -> follower: you are too far behind for entries; fetch my checkpoint (the driver's answer to
    :class:`StartFarHorizon`). The follower takes it only from the leader of its current epoch."""

    src: str
    epoch: int


@dataclass(frozen=True, slots=True)
class ReplicateAck:
    """Follower -> leader: ``held`` is the highest durable offset, ``log_end`` the end of its log.

    ``reset`` asks the leader to resume sending at ``log_end`` (after the
    follower reconciled, or when a frame left a gap). ``incarnation`` names the
    follower's storage: the leader counts only acks of the incarnation the
    znode records (a late ack of a lost storage must not count).
    """

    src: str
    dst: str
    epoch: int
    held: int
    log_end: int
    reset: bool = False
    incarnation: int = 0


@dataclass(frozen=True, slots=True)
class EpochRequest:
    """Follower -> leader: where does ``requested_epoch`` end in your log (KIP-101/279)?"""

    src: str
    dst: str
    epoch: int
    requested_epoch: int


@dataclass(frozen=True, slots=True)
class EpochResponse:
    """Leader -> follower: ``(found_epoch, end_offset)`` = ``EpochCache.end_offset_for(requested_epoch)``."""

    src: str
    dst: str
    epoch: int
    requested_epoch: int
    found_epoch: int
    end_offset: int


Message = Replicate | ReplicateAck | EpochRequest | EpochResponse


@dataclass(frozen=True, slots=True)
class LogStartAdvanced:
    """Whole segments below ``start`` were deleted (retention); entries below it can no longer be sent."""

    start: int

    def __post_init__(self) -> None:
        if self.start < 0:
            raise ValueError(f"log start {self.start} is negative")


Event = (ClientAppend | LocalFlushed | Tick | MetastoreChanged | IsrChanged | IsrChangeFailed | SessionExpired
         | SessionStarted | Replicate | ReplicateAck | EpochRequest | EpochResponse | LogStartAdvanced
         | ResignRequested | ConfigChanged)

# ----------------------------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class AppendLocal:
    """Write entries at ``[first, first + len(epochs))`` with those epochs, then flush.

    The entry bytes come from ``data``, which holds entries starting at offset
    ``data_first`` (a client batch, or a received :class:`Replicate` whose head
    the log already had).
    """

    first: int
    epochs: tuple[int, ...]
    data: object
    data_first: int


@dataclass(frozen=True, slots=True)
class Truncate:
    """Remove every entry at offset ``>= end`` (durably)."""

    end: int


@dataclass(frozen=True, slots=True)
class PersistEpochs:
    """Replace the durable epoch checkpoint with these ``(epoch, start)`` pairs."""

    pairs: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Apply:
    """Apply entries up to and including ``up_to`` (atomically with ``_meta.applied``)."""

    up_to: int


@dataclass(frozen=True, slots=True)
class SendEntries:
    """Read ``[start, end)`` from the local log and send it to ``dst`` as a :class:`Replicate`."""

    dst: str
    epoch: int
    start: int
    end: int
    apply_offset: int


@dataclass(frozen=True, slots=True)
class Send:
    """Send a protocol message to ``msg.dst``."""

    msg: ReplicateAck | EpochRequest | EpochResponse


@dataclass(frozen=True, slots=True)
class ChangeIsr:
    """Compare-and-set the group znode from ``expected_version`` to ``new`` (ISR shrink or expand)."""

    expected_version: int
    new: GroupState


@dataclass(frozen=True, slots=True)
class RecordStorage:
    """Compare-and-set the group znode from ``expected_version`` to ``new``: this replica's storage incarnation.

    ``new`` is :func:`replog.eligibility.record_storage` of the znode read: it
    records the incarnation and, if the storage lost what it acknowledged,
    takes the replica out of the ISR (and the leadership) in the same write.
    The result comes back as :class:`IsrChanged` or :class:`IsrChangeFailed`.
    """

    expected_version: int
    new: GroupState


@dataclass(frozen=True, slots=True)
class HandOff:
    """Compare-and-set the group znode from ``expected_version`` to ``new`` (next epoch, led by an ISR follower).

    Also deletes the group's resign request in the same transaction. The result
    comes back as :class:`IsrChanged` (``state`` = ``new``) or :class:`IsrChangeFailed`.
    """

    expected_version: int
    new: GroupState


@dataclass(frozen=True, slots=True)
class StartFarHorizon:
    """``follower`` is too far behind to replay entries: ship it a checkpoint in rounds.

    Catchup ends when the follower acknowledges an offset within
    ``replication.max.near.sync.message.lag`` of the log end; the leader then
    resumes sending entries. It re-issues this action after
    ``replication.far.horizon.retry.millis`` if that does not happen.
    """

    follower: str
    epoch: int
    apply_offset: int


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer client append ``request_id``: entries ``[first, first + count)`` or an error."""

    request_id: int
    first: int
    count: int
    error: ReplogError | None = None


@dataclass(frozen=True, slots=True)
class Removed:
    """This replica is no longer one of the group's replicas: the znode of ``version`` does not list it.

    A reassignment removed it (or cancelled its addition). It has stepped down and serves nothing more (every
    later event is dropped, appends are refused); the driver closes it and deletes its data (log, epoch file,
    storage marks, store), unless ``retired``: that znode keeps it as a retired copy (replog.retirement), deleted
    once a znode lists it neither as a replica nor as retired, reopened if the group takes it back.
    """

    version: int
    retired: bool = False


@dataclass(frozen=True, slots=True)
class RoleChanged:
    """This replica's role changed (drivers start or stop topologies; the simulator checks one leader per epoch)."""

    role: Role
    epoch: int
    leader: str | None


Action = (
    AppendLocal | Truncate | PersistEpochs | Apply | SendEntries | Send | ChangeIsr
    | StartFarHorizon | Reply | RoleChanged | HandOff | RecordStorage | Removed
)
