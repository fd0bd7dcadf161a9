"""A deterministic simulator for the replication state machine (:mod:`replog.replica`).

Everything nondeterministic comes from one seeded PRNG and one virtual clock:
message delays (hence reordering), drops, duplicates, partitions, crashes that
lose every unflushed entry and the store's un-flushed applied state (RocksDB runs
without its WAL: the store comes back at its last flush, below what it applied,
while the storage marks' applied floor, written after every apply, survives a
kill; a quarter of the crashes are power losses, which take the floor back to the
last log flush), restarts that recover from the durable disk only,
storage faults (a disk replaced by an empty one, a tail lost after it was
acknowledged, damage found on read and quarantined while the worker runs),
slow flushes, a versioned metastore with compare-and-set and session expiry,
a controller that elects leaders from the ISR only (the conductor's own rule), and a balancer that asks
leaders to hand leadership to an in-sync follower (resign requests).

The simulator is the driver of :mod:`replog.messages`: it performs every
action the replicas return. After every delivered event it checks the safety
invariants (see :class:`Sim`), raising :class:`InvariantViolation`; after
healing, :meth:`Sim.check_liveness` checks that everything acknowledged got
applied everywhere.
"""

from __future__ import annotations

import heapq
import random
import traceback
from collections.abc import Callable
from dataclasses import astuple, dataclass, field, replace
from typing import Any

from replog.catchup import round_is_last
from replog.config import FSYNC_INTERVAL, ReplicationConfig
from replog.election import next_leadership
from replog.eligibility import (
    StorageMarks,
    check_storage,
    most_up_to_date,
    storage_unsure,
    sure,
    without_doubt,
)
from replog.messages import (
    Ack,
    Action,
    AppendLocal,
    Apply,
    ChangeIsr,
    ClientAppend,
    ConfigChanged,
    Event,
    GroupState,
    HandOff,
    IsrChanged,
    IsrChangeFailed,
    LocalFlushed,
    LogStartAdvanced,
    MetastoreChanged,
    PersistEpochs,
    RecordStorage,
    Removed,
    Replicate,
    Reply,
    ResignRequested,
    Role,
    RoleChanged,
    Send,
    SendEntries,
    SessionExpired,
    SessionStarted,
    StartFarHorizon,
    Tick,
    Truncate,
)
from replog.outbox import Outbox
from replog.reassignment import min_isr_for, min_isr_met
from replog.replica import Replica
from replog.retirement import retired_names
from replog.trims import trim_point
from tests.sim.membership import PlanRules, Reassigner

Entry = tuple[int, str]  # (epoch, payload)


#: how much longer than its quiet period a run that has not converged yet may take to (Sim.check_liveness_by_deadline)
LIVENESS_GRACE_MS = 750


def sim_config(nodes: int, **overrides: Any) -> ReplicationConfig:
    """Timeouts scaled to the simulator's millisecond network, so a run of ~2 s sees many of them."""
    opts: dict[str, Any] = dict(
        replication_factor=nodes, max_time_lag_ms=150, append_timeout_ms=400,
        request_timeout_ms=40, heartbeat_interval_ms=30, max_near_sync_message_lag=40,
        far_horizon_retry_ms=300, max_unapplied_entries=400, max_inflight_entries=60,
        max_batch_entries=16)
    opts.update(overrides)
    return ReplicationConfig(**opts)


#: the open-time storage check's signature (replog.eligibility.check_storage)
StorageRule = Callable[..., "str | None"]


class InvariantViolation(AssertionError):
    """A safety or liveness property failed; the message says which and where."""


@dataclass
class Faults:
    """Fault mix of one run. Probabilities are per message; rates are per virtual second."""

    drop: float = 0.0
    duplicate: float = 0.0
    delay_min_ms: int = 1
    delay_jitter_ms: int = 2
    partition_rate: float = 0.0
    crash_rate: float = 0.0
    session_expiry_rate: float = 0.0
    slow_disk: float = 0.0  #: probability a node gets a slow disk for the run
    slow_flush_ms: int = 80
    resign_rate: float = 0.0  #: leader hand-off requests per virtual second (set by run_seed, not random())
    storage_fault_rate: float = 0.0  #: disk losses, tail losses, corruption per virtual second (set by run_seed)

    @classmethod
    def random(cls, rng: random.Random) -> Faults:
        """A random mix: each fault type on or off, with varied intensity."""
        f = cls()
        if rng.random() < 0.6:
            f.drop = rng.choice([0.01, 0.05, 0.15])
        if rng.random() < 0.4:
            f.duplicate = rng.choice([0.02, 0.1])
        f.delay_jitter_ms = rng.choice([1, 3, 10, 30])
        if rng.random() < 0.5:
            f.partition_rate = rng.choice([1.0, 3.0])
        if rng.random() < 0.6:
            f.crash_rate = rng.choice([1.0, 3.0])
        if rng.random() < 0.3:
            f.session_expiry_rate = rng.choice([1.0, 2.0])
        if rng.random() < 0.4:
            f.slow_disk = 0.5
            f.slow_flush_ms = rng.choice([30, 150])
        return f

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in vars(self).items())


@dataclass
class Disk:
    """The sim's disk: entries plus how many of them are durable, the durable epoch file, the store's applied
    offset (as the running replica sees it, and as its last flush left it on disk) and the storage marks."""

    entries: list[Entry] = field(default_factory=list)
    durable_end: int = 0
    epoch_pairs: tuple[tuple[int, int], ...] = ()
    applied: int = -1
    #: the store's applied offset as of its last flush: what a crash leaves (no RocksDB WAL)
    store_durable: int = -1
    gen: int = 0  #: bumped by every truncation, so flushes started before it report nothing
    #: first offset still in the log: retention deleted ``entries[:start]`` (kept here only as the
    #: store's content, for the invariant checks; sending them is a failure)
    start: int = 0
    #: storage marks (replog.eligibility): this storage's incarnation, the highest offset ever acknowledged
    incarnation: int = 0
    acked: int = -1
    #: the applied floor: the highest offset this storage ever applied (written after every apply, as the
    #: worker does, without a sync: a kill keeps it), and its value at the last log flush (synced with it: what
    #: a power loss leaves)
    floor: int = -1
    floor_synced: int = -1
    #: a storage fault took entries it acknowledged (the open-time check must find it: the sim checks it does)
    damaged: bool = False
    #: ``replication.fsync=interval``: ``durable_end`` is what survives a kill (written to the page cache) and
    #: ``synced_end`` what survives a power loss (fsynced); in ``always`` mode they are equal
    synced_end: int = 0
    #: the acknowledged mark as of the last sync (interval mode writes it to the page cache on every write)
    acked_synced: int = -1
    #: the storage marks' page-cache flag and the machine's boot it was written under (replog.eligibility)
    volatile: bool = False
    boot: int = 0
    #: ``always`` mode, the marks written beside the log's fsync: the last offset of the flush in flight they
    #: claim (``acked`` then covers the flushes reported before it)
    claimed: int = -1
    #: the storage opened unsure (replog.eligibility.storage_unsure) and did lose entries it acknowledged: it holds
    #: less than the applied entries until the znode no longer doubts it (the sim checks it then holds them all)
    lacks: bool = False


@dataclass
class Node:
    id: str
    disk: Disk
    replica: Replica
    alive: bool = True
    incarnation: int = 0
    session: int = 0
    session_live: bool = True
    flush_ms: int = 2
    last_notify_ms: int = 0
    max_applied: int = -1
    max_epoch: int = 0
    #: the driver's outbox policy, as the worker runs it (replog.outbox)
    outbox: Outbox = field(default_factory=Outbox)
    #: the worker hosts a replica of the group (a spare node does not until a reassignment adds it)
    hosting: bool = True
    #: the disk a reassignment's removal deleted last: a leader that has not heard of the removal yet may
    #: count the acks it sent before (they counted when they were given; the target holds the entries too)
    deleted: list[Disk] = field(default_factory=list)
    #: the machine's boot: a power loss starts another one (the page cache is gone); never UNKNOWN_BOOT (0)
    boot: int = 1
    #: interval mode: a periodic fsync is scheduled
    sync_pending: bool = False
    #: ``disk`` is a retired copy (replog.retirement): kept, not hosted, until a znode releases or takes it back
    retained: bool = False


@dataclass
class ClientRequest:
    request_id: int
    payloads: tuple[str, ...]
    ack: Ack
    node: str
    sent_ms: int
    outcome: str = "pending"  #: pending | ok | error type name
    first: int = -1
    epoch: int = -1  #: epoch of the leader that acknowledged


class Sim:
    """One simulated task group.

    Safety invariants checked as actions are performed (``C`` = the committed
    prefix, i.e. every entry any replica applied, in offset order):

    * applying: the applied entries equal ``C`` (nothing applied is ever changed),
      and only durable entries are applied;
    * every member of the metastore ISR holds ``C`` durably and identically: checked
      when ``C`` grows, when a member writes or truncates below ``len(C)``, and when
      a replica joins the ISR (so ISR members never diverge at or below the apply offset);
    * a replica that becomes leader holds ``C``; at most one replica leads an epoch;
    * apply offsets and epochs never go backwards on a replica (a restart resets to
      the durable values, which are >= what was durably applied);
    * an ``applied`` acknowledgement names entries of ``C`` with the client's payloads
      and is only given while the leader's ISR has >= min-ISR members (the leader's
      min-ISR: options change live) and each entry is on >= min-ISR disks, durably;
      an ``append`` acknowledgement names entries the leader holds durably;
    * an ISR shrink never goes below the min-ISR it was decided under;
    * applied means applied across restarts: a leader's store holds everything its
      storage ever applied (its applied floor), also right after a crash lost the
      store's un-flushed state and whatever the ISR's size;
    * depot trims (seeds from ``TRIM_SEEDS_FROM``): a committed trim drops only records
      applied where the leader built it (the promise rule, ``replog.trims.trim_point``).
    """

    def __init__(self, seed: int, *, nodes: int = 3, config: ReplicationConfig | None = None,
                 faults: Faults | None = None, replica_cls: type[Replica] = Replica,
                 metastore_ms: tuple[int, int] = (1, 5), session_timeout_ms: int = 60,
                 trace: bool = False, spares: int = 0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        #: the driver's open-time check (replog.eligibility); a mutant replaces it (tests/sim/mutants.py)
        self.storage_rule: StorageRule = check_storage
        #: when stores flush (its own stream, so the other draws of a seed are as before stores could lose state)
        self.store_rng = random.Random(seed ^ 0x5707)
        self.config = config or sim_config(nodes)
        self.faults = faults or Faults()
        self.replica_cls = replica_cls
        self.metastore_ms = metastore_ms
        self.session_timeout_ms = session_timeout_ms
        self.now = 0
        self._q: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        ids = [chr(ord("a") + i) for i in range(nodes + spares)]
        #: every worker, the group's replicas first; ``spares`` more host nothing until a reassignment adds them
        self.ids = ids
        self._sessions = 0
        self.nodes: dict[str, Node] = {}
        self._incarnations = 0
        for nid in ids:
            self._sessions += 1
            disk = self.new_disk()
            n = Node(nid, disk, self._new_replica(nid, disk, self._sessions), session=self._sessions,
                     hosting=nid in ids[:nodes])
            self.nodes[nid] = n
        self.znode = GroupState(None, 0, tuple(ids[:nodes]), (), 0, 0)
        #: the replicas each znode version listed (a Removed must name a version that did not list its replica)
        self.replica_history: dict[int, tuple[str, ...]] = {0: self.znode.replicas}
        self.cut: set[tuple[str, str]] = set()
        #: far-horizon transfers in progress, per (follower, incarnation)
        self.copying: set[tuple[str, int]] = set()
        self.committed: list[Entry] = []
        #: the epoch of the replica that applied each committed offset first (a leader of epoch e must hold
        #: what leaders of earlier epochs applied, not what later ones did: see _check_holds_committed)
        self.committed_in: list[int] = []
        #: offset -> durable copies storage faults destroyed (for the min-ISR copies check)
        self.lost_copies: dict[int, int] = {}
        self.leaders: dict[int, str] = {}
        self.requests: dict[int, ClientRequest] = {}
        self._next_request = 0
        self._next_payload = 0
        self.sent: list[tuple[int, str, object]] = []  #: (time, dst, message) when trace is on
        self.trace = trace
        self.log: list[str] = []
        self.steps = 0
        self.electing = False
        #: scenarios switch this off and call :meth:`elect` themselves
        self.auto_elect = True
        self.pinned_client: str | None = None
        #: delete log segments (of ``segment_entries`` entries) below each replica's retention point
        self.retention = False
        self.segment_entries = 8
        #: the balancer's outstanding resign request (successor, epoch), withdrawn by the hand-off CAS
        self.resign_request: tuple[str, int] | None = None
        self.hand_offs = 0
        #: scenarios: extra ms before a node's group-znode watch fires (a busy ZooKeeper client thread), so it
        #: hears of a new epoch after its peers do
        self.watch_lag_ms: dict[str, int] = {}
        #: depot trims (pstate.retention): a trim entry "trim:<before>:<applied offset it was built at>" drops
        #: the records (the other payloads) below <before>; ``trim_rule`` is the end it is clamped to: the
        #: builder's applied records (the promise rule) or, to show the check bites, its log's
        self.trim_rule = "applied"
        self.trims_applied = 0

    # ------------------------------------------------------------------------------- scheduling

    def at(self, t: int, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._q, (max(t, self.now), self._seq, fn, args))

    def run_until(self, t: int) -> None:
        q = self._q
        while q and q[0][0] <= t:
            when, _, fn, args = heapq.heappop(q)
            self.now = when
            fn(*args)
        self.now = max(self.now, t)

    def run_until_true(self, pred: Callable[[], bool], max_ms: int = 2_000) -> None:
        """Run event by event until ``pred()`` holds; fail if it does not within ``max_ms``."""
        limit = self.now + max_ms
        q = self._q
        while not pred():
            if not q or q[0][0] > limit:
                self.fail(f"condition not reached within {max_ms} ms")
            when, _, fn, args = heapq.heappop(q)
            self.now = when
            fn(*args)

    def heal_and_settle(self, ms: int = 1_500) -> None:
        """Stop every fault, restart every replica, run ``ms`` and check liveness."""
        self.faults = replace(self.faults, drop=0.0, duplicate=0.0)
        self.heal()
        for nid in self.ids:
            self.nodes[nid].flush_ms = 2
            self.restart(nid)
        self.auto_elect = True
        self._elect_later(0)
        self.run_for(ms)
        self.check_liveness_by_deadline()

    def run_for(self, ms: int) -> None:
        self.run_until(self.now + ms)

    def note(self, text: str) -> None:
        if self.trace:
            self.log.append(f"{self.now:6d} {text}")

    # ------------------------------------------------------------------------------- start

    def start(self, tick_ms: int = 10) -> None:
        self.tick_ms = tick_ms
        for nid in self.ids:
            self._notify(nid, self.znode)
            self.at(self.now + self.rng.randrange(tick_ms), self._tick, nid, 0)
        self._elect_later(0)

    def new_disk(self) -> Disk:
        """An empty storage directory with a fresh incarnation."""
        self._incarnations += 1
        return Disk(incarnation=self._incarnations)

    def _new_replica(self, nid: str, disk: Disk, session: int, unsure: bool = False) -> Replica:
        return self.replica_cls(nid, "g", self.config, session=session, log_start=disk.start,
                                log_end=disk.durable_end, epoch_pairs=disk.epoch_pairs, applied=disk.applied,
                                incarnation=disk.incarnation, applied_floor=disk.floor, unsure=unsure)

    def _open_storage(self, n: Node) -> bool:
        """The driver's open-time check (replog.eligibility): storage that lost acknowledged entries gets a
        new incarnation; so does storage unsure of its last flush (True: the replica registers its log with it).
        The sim knows which storages were damaged, so it checks the rule finds each one, as lost or unsure."""
        d = n.disk
        marks = StorageMarks(d.incarnation, d.acked, applied=d.floor, volatile=d.volatile, boot=d.boot,
                             claimed=d.claimed)
        lost = self.storage_rule(marks, log_end=d.durable_end, applied=d.applied, boot=n.boot)
        unsure = lost is None and storage_unsure(marks, log_end=d.durable_end)
        if self.storage_rule is check_storage and ((lost is not None and not d.damaged)
                                                   or (d.damaged and lost is None and not unsure)):
            self.fail(f"{n.id}: the open-time check says {lost!r} of a storage that is "
                      f"{'damaged' if d.damaged else 'intact'} (log end {d.durable_end}, acked {d.acked}, "
                      f"claimed {d.claimed})")
        if unsure:
            self.note(f"{n.id} opens unsure storage (log end {d.durable_end}, claimed {d.claimed}, "
                      f"{'damaged' if d.damaged else 'intact'})")
            self._incarnations += 1
            d.incarnation = self._incarnations
            d.acked = d.acked_synced = min(d.acked, d.durable_end - 1)
            d.lacks = d.lacks or d.damaged  # (claimed stays: reopened before it registers, it is unsure again)
            d.damaged = False
            return True
        if lost is not None:
            self.note(f"{n.id} opens damaged storage: {lost}")
            self._incarnations += 1
            d.incarnation = self._incarnations
            d.acked = d.acked_synced = d.durable_end - 1
            d.floor = d.floor_synced = d.applied
            d.damaged = False
            d.volatile = False  # the new incarnation's marks (set again before its first page-cache ack)
            d.synced_end = d.durable_end
            d.claimed, d.lacks = -1, False
        return False

    def intact(self, nid: str) -> bool:
        """The znode records ``nid``'s current storage, which holds everything it acknowledged, and does not doubt
        it (an unsure member promises nothing until the leader or an election vouches for it)."""
        return self.holds(nid) and sure(self.znode, nid)

    def holds(self, nid: str) -> bool:
        """``nid``'s storage is the one the znode records and holds everything it acknowledged (the ground truth:
        the znode may doubt it yet)."""
        d = self.nodes[nid].disk
        return not d.damaged and not d.lacks and self.znode.incarnation_of(nid) == d.incarnation

    def _tick(self, nid: str, inc: int) -> None:
        n = self.nodes[nid]
        if not n.alive or n.incarnation != inc or not n.hosting:
            return
        due = n.replica.next_tick_ms()
        if due is None or self.now < due:  # a driver may skip this tick: it must be a no-op
            self.steps += 1
            before = _tick_view(n.replica)
            actions = n.replica.handle(Tick(), self.now)
            if actions or _tick_view(n.replica) != before:
                self.fail(f"{nid}: a tick before next_tick_ms ({due}) acted: {actions}")
        else:
            self._deliver(nid, inc, Tick())
        if self.retention and n.alive and n.incarnation == inc and self.rng.random() < 0.2:
            self._retain(n)
        self.at(self.now + self.tick_ms, self._tick, nid, inc)

    def _retain(self, n: Node) -> None:
        """Retention as the worker does it: delete whole segments below the replica's retention point, which
        depends on the store's durable applied offset: the worker flushes the store first when a segment may go."""
        point = n.replica.retention_point(n.disk.applied)
        start = point - point % self.segment_entries
        if start > n.disk.start:
            n.disk.store_durable = n.disk.applied
            n.disk.start = start
            self.note(f"{n.id} deletes its log below {start}")
            self._deliver(n.id, n.incarnation, LogStartAdvanced(start))

    # ------------------------------------------------------------------------------- delivery

    def _deliver(self, nid: str, inc: int, event: Event) -> None:
        n = self.nodes[nid]
        if not n.alive or n.incarnation != inc or not n.hosting:
            return
        self.steps += 1
        actions = n.replica.handle(event, self.now)
        for a in actions:
            self._perform(n, a)
        if n.incarnation != inc:
            return  # removed by a reassignment (Removed): the replica and its data are gone
        self._ship(n)
        r = n.replica
        if r.applied < n.max_applied:
            self.fail(f"apply offset of {nid} went back from {n.max_applied} to {r.applied}")
        if r.epoch < n.max_epoch:
            self.fail(f"epoch of {nid} went back from {n.max_epoch} to {r.epoch}")
        n.max_applied = r.applied
        n.max_epoch = r.epoch
        if r.is_leader and n.disk.applied < n.disk.floor:
            self.fail(f"{nid} leads with its store applied up to {n.disk.applied}, but it had applied up to "
                      f"{n.disk.floor} before: entries it acknowledged as applied are invisible")
        if r.log_end != len(n.disk.entries):
            self.fail(f"{nid} thinks its log ends at {r.log_end}, the disk has {len(n.disk.entries)}")

    def _perform(self, n: Node, a: Action) -> None:
        disk = n.disk
        if isinstance(a, SendEntries):
            if a.end > len(disk.entries):
                self.fail(f"{n.id} sends [{a.start},{a.end}) beyond its log {len(disk.entries)}")
            if a.start < a.end and a.start < disk.start:
                self.fail(f"{n.id} sends [{a.start},{a.end}) but its log starts at {disk.start}")
            chunk = disk.entries[a.start:a.end]
            msg = Replicate(n.id, a.dst, a.epoch, a.start, tuple(e for e, _ in chunk), a.apply_offset,
                            tuple(p for _, p in chunk))
            n.outbox.add(a.dst, msg)
        elif isinstance(a, Send):
            n.outbox.add(a.msg.dst, a.msg)
        elif isinstance(a, AppendLocal):
            self._append(n, a)
        elif isinstance(a, Apply):
            self._apply(n, a.up_to)
        elif isinstance(a, Reply):
            self._reply(n, a)
        elif isinstance(a, Truncate):
            self._truncate(n, a.end)
        elif isinstance(a, PersistEpochs):
            disk.epoch_pairs = a.pairs
        elif isinstance(a, ChangeIsr):
            lo, hi = self.metastore_ms
            self.at(self.now + self.rng.randint(lo, hi), self._cas, n.id, n.incarnation, a, n.replica.config)
        elif isinstance(a, RecordStorage):
            lo, hi = self.metastore_ms
            self.at(self.now + self.rng.randint(lo, hi), self._record_storage, n.id, n.incarnation, a)
        elif isinstance(a, RoleChanged):
            self.note(f"{n.id} -> {a.role} epoch {a.epoch}")
            if a.role is Role.LEADER:
                prev = self.leaders.get(a.epoch)
                if prev is not None and prev != n.id:
                    self.fail(f"two leaders in epoch {a.epoch}: {prev} and {n.id}")
                self.leaders[a.epoch] = n.id
                self._check_holds_committed(n, "became leader", a.epoch)
        elif isinstance(a, StartFarHorizon):
            self.at(self.now + self.rng.randint(10, 40), self._far_horizon, n.id, n.incarnation, a)
        elif isinstance(a, HandOff):
            lo, hi = self.metastore_ms
            self.at(self.now + self.rng.randint(lo, hi), self._hand_off, n.id, n.incarnation, a)
        elif isinstance(a, Removed):
            self._unhost(n, a)
        else:  # pragma: no cover
            self.fail(f"unknown action {a!r}")

    def _ship(self, n: Node) -> None:
        """What the outbox lets go after a step goes to the network; held beats leave when due."""
        for dst, msg in n.outbox.take(self.now, n.replica.is_leader):
            self._send(n.id, dst, msg)
        due = n.outbox.next_due()
        if due is not None:
            self.at(due, self._release_beats, n.id, n.incarnation)

    def _release_beats(self, nid: str, inc: int) -> None:
        n = self.nodes[nid]
        if n.alive and n.incarnation == inc:
            for dst, msg in n.outbox.due(self.now):
                self._send(nid, dst, msg)

    def _send(self, src: str, dst: str, msg: object) -> None:
        if self.trace:
            self.sent.append((self.now, dst, msg))
        if (src, dst) in self.cut:
            return
        f = self.faults
        copies = 1
        if f.drop and self.rng.random() < f.drop:
            copies = 0
        elif f.duplicate and self.rng.random() < f.duplicate:
            copies = 2
        for _ in range(copies):
            delay = f.delay_min_ms + self.rng.randrange(f.delay_jitter_ms + 1)
            self.at(self.now + delay, self._arrive, src, dst, msg)

    def _arrive(self, src: str, dst: str, msg: Event) -> None:
        if (src, dst) in self.cut:
            return
        n = self.nodes[dst]
        self._deliver(dst, n.incarnation, msg)

    def inject(self, dst: str, msg: Event, delay_ms: int = 0) -> None:
        """Deliver ``msg`` to ``dst`` later, bypassing the network (stale-message scenarios)."""
        self.at(self.now + delay_ms, lambda: self._deliver(dst, self.nodes[dst].incarnation, msg))

    # ------------------------------------------------------------------------------- disk

    def _append(self, n: Node, a: AppendLocal) -> None:
        disk = n.disk
        if a.first != len(disk.entries):
            self.fail(f"{n.id} appends at {a.first} but its log ends at {len(disk.entries)}")
        data = a.data
        assert isinstance(data, tuple)
        in_isr = n.id in self.znode.isr
        for i, e in enumerate(a.epochs):
            o = a.first + i
            entry = (e, data[o - a.data_first])
            if in_isr and o < len(self.committed) and entry != self.committed[o]:
                self.fail(f"ISR member {n.id} writes {entry} at committed offset {o} = {self.committed[o]}")
            disk.entries.append(entry)
        self._flush_later(n)

    def _flush_later(self, n: Node) -> None:
        if n.replica.config.acks_from_page_cache:
            # replication.fsync=interval: reported once written (the page cache keeps it across a kill), after
            # a synced write of the marks saying so; fsynced by the next periodic sync
            if not n.disk.volatile:
                n.disk.volatile, n.disk.boot = True, n.boot
            self.at(self.now + self.rng.randrange(2), self._flushed, n.id, n.incarnation, n.disk.gen,
                    len(n.disk.entries), False)
            if not n.sync_pending:
                n.sync_pending = True
                self.at(self.now + n.replica.config.flush_ms, self._sync, n.id, n.incarnation)
            return
        # replication.fsync=always: the marks are written (and synced, at once here: the adversarial order)
        # beside the log's fsync, claiming the flush in flight; ``acked`` covers the flushes reported before it
        d = n.disk
        d.acked, d.claimed = max(d.acked, d.durable_end - 1), len(d.entries) - 1
        d.acked_synced, d.floor_synced = d.acked, d.floor  # (the floor rides in the same write)
        self.at(self.now + n.flush_ms + self.rng.randrange(2), self._flushed, n.id, n.incarnation,
                n.disk.gen, len(n.disk.entries))

    def _flushed(self, nid: str, inc: int, gen: int, end: int, synced: bool = True) -> None:
        n = self.nodes[nid]
        if not n.alive or n.incarnation != inc or gen != n.disk.gen:
            return
        if end > n.disk.durable_end:
            n.disk.durable_end = end
            if not synced:  # interval mode: the acknowledged mark, in the page cache before the flush is reported
                n.disk.acked = end - 1
            else:
                n.disk.synced_end = end
            self._deliver(nid, inc, LocalFlushed(end))

    def _sync(self, nid: str, inc: int) -> None:
        """Interval mode's periodic fsync: what was written so far survives a power loss from now on."""
        n = self.nodes[nid]
        if not n.alive or n.incarnation != inc:
            return
        n.sync_pending = False
        n.disk.synced_end = n.disk.durable_end
        n.disk.acked_synced = n.disk.acked
        n.disk.floor_synced = n.disk.floor

    def _truncate(self, n: Node, end: int) -> None:
        disk = n.disk
        if ((n.id in self.znode.isr or n.id in self.znode.elr) and end < len(self.committed)
                and end < len(disk.entries)):
            self.fail(f"ISR/ELR member {n.id} truncates to {end}, below the committed end {len(self.committed)}")
        if end <= disk.applied:
            self.fail(f"{n.id} truncates to {end}, below its applied offset {disk.applied}")
        disk.acked = min(disk.acked, end - 1)  # lowered before the cut
        disk.acked_synced = min(disk.acked_synced, end - 1)
        disk.claimed = min(disk.claimed, end - 1)
        del disk.entries[end:]
        disk.durable_end = min(disk.durable_end, end)
        disk.synced_end = min(disk.synced_end, end)
        disk.gen += 1
        self._flush_later(n)

    def _apply(self, n: Node, up_to: int) -> None:
        disk = n.disk
        if up_to >= disk.durable_end:
            self.fail(f"{n.id} applies {up_to} but only [0,{disk.durable_end}) is durable")
        for o in range(disk.applied + 1, up_to + 1):
            entry = disk.entries[o]
            if o < len(self.committed):
                if self.committed[o] != entry:
                    self.fail(f"{n.id} applies {entry} at {o}, but {self.committed[o]} was applied there")
            else:
                assert o == len(self.committed)
                self._check_trim(o, entry)
                self.committed.append(entry)
                self.committed_in.append(n.replica.epoch)
                self._check_isr_holds(o)
        disk.applied = up_to
        disk.floor = max(disk.floor, up_to)
        if self.store_rng.random() < 0.2:  # RocksDB flushes its memtables now and then
            disk.store_durable = up_to

    def _check_trim(self, o: int, entry: Entry) -> None:
        """The promise rule: a trim entry drops only records that were applied where it was built, so every
        record it drops is in an entry committed before it (none a reader was not yet told of, none whose
        append may still be truncated)."""
        if not entry[1].startswith("trim:"):
            return
        _, before, built_at = entry[1].split(":")
        if int(built_at) >= o:
            self.fail(f"trim at {o} was built at applied offset {built_at}, not below its own offset")
        held = _records(self.committed[:int(built_at) + 1])
        if int(before) > held:
            self.fail(f"trim at {o} drops records below {before}, but only {held} were applied where it was "
                      f"built (applied offset {built_at}): it removes records no reader was promised yet")
        self.trims_applied += 1

    def trim(self, before: int) -> ClientRequest | None:
        """The leader builds a depot trim below ``before`` (clamped by the rule) and appends it like a client's
        request (the worker builds it on the leader's task thread from the store's applied state)."""
        target = self.pinned_client or self.znode.leader
        n = self.nodes.get(target) if target is not None else None
        if n is None or not n.alive:
            return None
        applied = n.disk.entries[:n.disk.applied + 1]
        start = max((int(p.split(":")[1]) for _e, p in applied if p.startswith("trim:")), default=0)
        end = _records(applied) if self.trim_rule == "applied" else _records(n.disk.entries)
        payload = f"trim:{trim_point(before, start, max(start, end))}:{n.disk.applied}"
        self._next_request += 1
        req = ClientRequest(self._next_request, (payload,), Ack.APPLIED, n.id, self.now)
        self.requests[req.request_id] = req
        ev = ClientAppend(req.request_id, 1, 10, Ack.APPLIED, (payload,))
        self.at(self.now + 1 + self.rng.randrange(3), self._client_arrive, n.id, ev)
        return req

    def _check_isr_holds(self, o: int) -> None:
        want = self.committed[o]
        for m in self.znode.isr + self.znode.elr:  # an ELR member is electable: it must hold it too
            if not self.intact(m):
                continue  # a storage fault emptied or cut it: it leaves the ISR before it acknowledges anything
            d = self.nodes[m].disk
            if d.durable_end <= o or d.entries[o] != want:
                got = d.entries[o] if o < len(d.entries) else None
                role = "ISR" if m in self.znode.isr else "ELR"
                self.fail(f"offset {o} = {want} applied while {role} member {m} holds {got} "
                          f"(durable end {d.durable_end}); ISR {self.znode.isr}, ELR {self.znode.elr}")

    def _check_holds_committed(self, n: Node, why: str, epoch: int | None = None) -> None:
        """``n`` holds every applied entry; as a leader of ``epoch``, every entry leaders of earlier epochs applied.

        Leader completeness is about earlier epochs: a replica can take up an epoch that is already over (seed
        15131442: its own storage CAS landed under a live session, the answer arrived after its session expired
        and a later epoch had applied entries), and such a zombie cannot hold what the later epoch applied. It
        cannot apply or acknowledge anything either (every other check still runs), so only the entries applied
        before its epoch ended are its due."""
        c = len(self.committed)
        if epoch is not None:
            c = next((o for o, e in enumerate(self.committed_in) if e > epoch), c)
        d = n.disk
        if d.durable_end < c or d.entries[:c] != self.committed[:c]:
            bad = next((o for o in range(c) if o >= d.durable_end or d.entries[o] != self.committed[o]), c)
            self.fail(f"{n.id} {why} but lacks applied entry {bad} = {self.committed[bad]} "
                      f"(holds {d.entries[bad] if bad < len(d.entries) else None}, durable end {d.durable_end})")

    # ------------------------------------------------------------------------------- clients

    def append(self, count: int = 1, ack: Ack = Ack.APPLIED, to: str | None = None) -> ClientRequest:
        """A client appends ``count`` new payloads to ``to`` (default: the leader the metastore names)."""
        target = to or self.pinned_client or self.znode.leader
        self._next_request += 1
        payloads = []
        for _ in range(count):
            self._next_payload += 1
            payloads.append(f"p{self._next_payload}")
        req = ClientRequest(self._next_request, tuple(payloads), ack, target or "-", self.now)
        self.requests[req.request_id] = req
        if target is not None:
            ev = ClientAppend(req.request_id, count, 10 * count, ack, tuple(payloads))
            self.at(self.now + 1 + self.rng.randrange(3), self._client_arrive, target, ev)
        return req

    def _client_arrive(self, target: str, ev: ClientAppend) -> None:
        n = self.nodes[target]
        self._deliver(target, n.incarnation, ev)

    def _reply(self, n: Node, a: Reply) -> None:
        req = self.requests[a.request_id]
        if a.error is not None:
            req.outcome = type(a.error).__name__
            req.first = a.first  # -1: refused before it was appended
            return
        req.outcome = "ok"
        req.first = a.first
        req.epoch = n.replica.epoch
        if a.count != len(req.payloads):
            self.fail(f"reply for {a.count} entries to a request of {len(req.payloads)}")
        if req.ack is Ack.APPLIED:
            # min-ISR is the leader's (options change live, and reach each node on its own schedule); what it
            # promises is copies: every acknowledged entry is on at least that many disks, durably. (The
            # metastore's ISR may already be smaller, by a shrink decided under a lower min-ISR; its members
            # hold every applied entry: _check_isr_holds on each apply, _check_holds_committed on each join.)
            min_isr = n.replica.min_isr
            if not n.replica._min_isr_met(n.replica.isr):
                self.fail(f"{n.id} acknowledged applied with ISR {n.replica.isr} below min-ISR {min_isr}")
            ls = n.replica._ls
            assert ls is not None
            replicas = ls.isr + ls.osr
            # The joint rule of replog.reassignment, as copies on disk: a removed replica's copy is deleted
            # when its plan completes, an added one's when its plan is cancelled.
            target = [m for m in replicas if m not in ls.removing]
            original = [m for m in replicas if m not in ls.adding]
            need = [(target, original)] if ls.adding or ls.removing else []
            for i, p in enumerate(req.payloads):
                o = a.first + i
                if o >= len(self.committed) or self.committed[o][1] != p:
                    self.fail(f"{n.id} acknowledged {p} at {o} as applied, committed has "
                              f"{self.committed[o] if o < len(self.committed) else None}")
                copies = [m.id for m in self.nodes.values()
                          if any(o < d.durable_end and d.entries[o][1] == p for d in (m.disk, *m.deleted[-1:]))]
                # A storage fault may have taken copies that were acknowledged: they counted when they were.
                if not need and len(copies) + self.lost_copies.get(o, 0) < min_isr:
                    self.fail(f"{n.id} acknowledged {p} at {o} as applied with {len(copies)} durable copies "
                              f"({copies}), below min-ISR {min_isr}")
                for tgt, orig in need:
                    cfg = n.replica.config
                    t_need, o_need = min_isr_for(cfg, len(tgt)), min_isr_for(cfg, len(orig))
                    lost = self.lost_copies.get(o, 0)
                    on_t, on_o = [m for m in copies if m in tgt], [m for m in copies if m in orig]
                    if len(on_t) + lost < min(t_need, o_need) or len(on_o) + lost < o_need:
                        self.fail(f"{n.id} acknowledged {p} at {o} as applied with copies on target {on_t} "
                                  f"(needs {min(t_need, o_need)}) and on original {on_o} (needs {o_need}): "
                                  f"a copy the end of the reassignment deletes was needed")
        elif req.ack is Ack.APPEND:
            d = n.disk
            for i, p in enumerate(req.payloads):
                o = a.first + i
                if o >= d.durable_end or d.entries[o][1] != p:
                    self.fail(f"{n.id} acknowledged {p} at {o} as appended but does not hold it durably")

    # ------------------------------------------------------------------------------- metastore & controller

    def _notify(self, nid: str, st: GroupState) -> None:
        """Watch notification, in order per node (as ZooKeeper delivers them)."""
        n = self.nodes[nid]
        lo, hi = self.metastore_ms
        t = max(self.now + self.rng.randint(lo, hi) + self.watch_lag_ms.get(nid, 0), n.last_notify_ms)
        n.last_notify_ms = t
        self.at(t, lambda: self._deliver(nid, n.incarnation, MetastoreChanged(st)))

    def _write_znode(self, st: GroupState) -> None:
        old = self.znode
        self.znode = st
        self.note(f"znode v{st.version} leader={st.leader} epoch={st.epoch} isr={st.isr} osr={st.osr}"
                  + (f" elr={st.elr}" if st.elr else "")
                  + (f" adding={st.adding} removing={st.removing}" if st.reassigning else ""))
        self.replica_history[st.version] = st.replicas
        for m in st.replicas:
            if not self.nodes[m].hosting:
                self._host(self.nodes[m])
        for m in self.ids:
            n = self.nodes[m]
            if n.retained and m not in st.replicas and m not in retired_names(st):
                # released: the worker deletes the retired copy (at once here: the conservative side)
                self.note(f"{m} deletes its retired copy (znode v{st.version})")
                n.retained = False
                n.deleted[:] = [n.disk]
                n.disk = self.new_disk()
        for m in st.isr:
            # (one a storage fault just hit leaves again before it acknowledges anything)
            if m not in old.isr and self.intact(m):
                self._check_holds_committed(self.nodes[m], "joined the ISR")
        for m in st.elr:
            if m not in old.elr and self.intact(m):
                self._check_holds_committed(self.nodes[m], "joined the ELR")
        for m in st.isr + st.elr:
            if not sure(old, m) and sure(st, m) and st.incarnation_of(m) == self.nodes[m].disk.incarnation:
                if self.nodes[m].disk.damaged:
                    # vouched for while it held the log, the write landing after a crash that damaged its disk:
                    # that incarnation is over, and the open-time check finds the damage (seed 41017400), as
                    # for a storage fault between joining the ISR and acknowledging anything (above)
                    continue
                self._check_holds_committed(self.nodes[m], "is no longer doubted")  # (the leader, or the election)
                self.nodes[m].disk.lacks = False
        for nid in self.ids:
            if self.nodes[nid].alive and self.nodes[nid].session_live:  # watches die with the session
                self._notify(nid, st)

    def _cas_allowed(self, nid: str, inc: int, a: ChangeIsr | RecordStorage | HandOff,
                     session_ok: bool = True) -> int | None:
        """When a replica's CAS may be written: the time its answer arrives; else None (a failure is answered)."""
        n = self.nodes[nid]
        lo, hi = self.metastore_ms
        back = self.now + self.rng.randint(lo, hi)
        if not n.alive or n.incarnation != inc:
            return None
        if not n.session_live or not session_ok:
            self.at(back, self._deliver, nid, inc, IsrChangeFailed("session_expired", a.new))
        elif self.znode.version != a.expected_version:
            self.at(back, self._deliver, nid, inc, IsrChangeFailed("conflict", a.new, self.znode))
        else:
            return back
        return None

    def _cas(self, nid: str, inc: int, a: ChangeIsr, config: ReplicationConfig) -> None:
        """The leader's ISR change, decided under ``config`` (its options when it asked: they change live)."""
        back = self._cas_allowed(nid, inc, a, a.new.leader_session == self.nodes[nid].session)
        if back is not None:
            z, new = self.znode, a.new
            if (new.version != a.expected_version + 1 or new.epoch != z.epoch
                    or (new.adding, new.removing) != (z.adding, z.removing)
                    or (new.retired != z.retired and (new.retired or any(r in new.isr for r in z.reconfirming)))):
                self.fail(f"bad CAS from {nid}: {a} over {z}")
            # (growing back towards min-ISR is fine)
            if not set(new.unsure) <= set(z.unsure):
                self.fail(f"{nid}'s ISR change adds unsure records: {a.new} over {z}")
            if len(new.isr) < len(z.isr) and not min_isr_met(new.isr, new.replicas, new.adding, new.removing,
                                                              config):
                self.fail(f"{nid} shrank the ISR to {a.new.isr}, below its min-ISR {config.effective_min_isr} "
                          f"(adding {new.adding}, removing {new.removing})")
            self._write_znode(a.new)
            self.at(back, self._deliver, nid, inc, IsrChanged(a.new))

    def _record_storage(self, nid: str, inc: int, a: RecordStorage) -> None:
        """A replica's CAS recording its storage incarnation (leaving the ISR first if its storage lost entries)."""
        n = self.nodes[nid]
        back = self._cas_allowed(nid, inc, a)
        if back is not None:
            z, new = self.znode, a.new
            others = {m for m in z.replicas if m != nid}
            if (new.version != z.version + 1 or any(new.incarnation_of(m) != z.incarnation_of(m) for m in others)
                    or new.incarnation_of(nid) not in (n.disk.incarnation, 0)
                    or (new.storage_session(nid) or 0) > n.session
                    or set(new.isr) - set(z.isr) or set(z.isr) - set(new.isr) - {nid}
                    or (new.leader != z.leader and (z.leader != nid or new.leader is not None))
                    or {r for r in new.unsure if r[0] != nid} - set(z.unsure)):
                self.fail(f"bad storage record from {nid} (storage {n.disk.incarnation}): {new} over {z}")
            mine = [r for r in new.unsure if r[0] == nid and r not in z.unsure]
            d = n.disk
            if mine and (mine[0][2] > d.durable_end or mine[0][1] != (d.entries[mine[0][2] - 1][0] if mine[0][2] else 0)):
                self.fail(f"{nid} registers its log as {mine[0]} but holds {d.durable_end} durable entries, the last "
                          f"of epoch {d.entries[d.durable_end - 1][0] if d.durable_end else None}")
            self._write_znode(new)
            self.at(back, self._deliver, nid, inc, IsrChanged(new))
            if new.leader is None:
                self._elect_later(self.rng.randint(1, 10))

    def set_config(self, config: ReplicationConfig) -> None:
        """``conductor set-option``: the module znode changes; each node's watch fires on its own schedule.

        A replica started later (a restart) reads the current options, as a
        worker does when it opens the module.
        """
        self.note(f"config: min-ISR {config.effective_min_isr}, lag {config.max_time_lag_ms} ms, "
                  f"near lag {config.max_near_sync_message_lag}, inflight {config.max_inflight_entries}")
        self.config = config
        lo, hi = self.metastore_ms
        for nid in self.ids:
            n = self.nodes[nid]
            if n.alive and n.session_live:
                t = max(self.now + self.rng.randint(lo, hi), n.last_notify_ms)
                n.last_notify_ms = t
                self.at(t, self._deliver, nid, n.incarnation, ConfigChanged(config))

    def request_resign(self, to: str) -> None:
        """The balancer asks the current leader to hand leadership to ``to`` (the resign znode + its watch)."""
        z = self.znode
        if z.leader is None:
            return
        self.resign_request = (to, z.epoch)
        self.note(f"resign requested: {z.leader} -> {to} in epoch {z.epoch}")
        leader, ev = self.nodes[z.leader], ResignRequested(to, self.nodes[to].session, z.epoch)
        if leader.alive and leader.session_live:
            lo, hi = self.metastore_ms
            inc = leader.incarnation
            self.at(self.now + self.rng.randint(lo, hi), self._deliver, leader.id, inc, ev)

    def _hand_off(self, nid: str, inc: int, a: HandOff) -> None:
        """The resigning leader's CAS: next epoch, led by an in-sync follower; withdraws the resign request."""
        n = self.nodes[nid]
        back = self._cas_allowed(nid, inc, a)
        if back is None:
            return
        z, new = self.znode, a.new
        if (z.leader != nid or new.version != z.version + 1 or new.epoch != z.epoch + 1 or new.leader == nid
                or new.leader not in z.isr or (new.isr, new.osr, new.storage) != (z.isr, z.osr, z.storage)
                or (new.adding, new.removing) != (z.adding, z.removing)):
            self.fail(f"bad hand-off from {nid}: {a} over znode {z}")
        assert new.leader is not None
        old, succ = n.disk, self.nodes[new.leader].disk
        if self.intact(new.leader) and (succ.durable_end < len(old.entries)
                                        or succ.entries[:len(old.entries)] != old.entries):
            self.fail(f"{nid} hands off to {new.leader}, which does not durably hold its log "
                      f"({len(old.entries)} entries; successor durable end {succ.durable_end})")
        self.resign_request = None
        self.hand_offs += 1
        self._write_znode(new)
        self.at(back, self._deliver, nid, inc, IsrChanged(new))
        self._elect_later(self.session_timeout_ms)  # the controller replaces a successor that died meanwhile

    def elect(self, nid: str) -> None:
        """Scenario control: the controller elects ``nid`` now (it must be a live ISR member; if the znode doubts
        its log, one the election's rule for unsure members allows, replog.eligibility.most_up_to_date)."""
        n = self.nodes[nid]
        z = self.znode
        if nid not in z.isr or not n.alive or not n.session_live:
            self.fail(f"cannot elect {nid}: not a live ISR member of {z}")
        live = {m: x.session for m, x in self.nodes.items() if x.alive and x.session_live}
        if not sure(z, nid) and nid not in (most_up_to_date(z, live) or ()):
            self.fail(f"cannot elect {nid}: the znode doubts its log and the rule does not allow it yet: {z}")
        self._write_znode(replace(z, leader=nid, epoch=z.epoch + 1, version=z.version + 1, leader_session=n.session,
                                  unsure=without_doubt(z, nid)))

    def _elect_later(self, delay: int) -> None:
        if not self.auto_elect:
            return
        if not self.electing:
            self.electing = True
            self.at(self.now + delay, self._elect)

    def _elect(self) -> None:
        """The controller: the conductor's election rule (``replog.election``) over the live sessions, in one CAS.

        The preference order is random, so every ISR member gets elected in some run.
        """
        self.electing = False
        live = {m: n.session for m, n in self.nodes.items() if n.alive and n.session_live}
        order = list(self.ids)
        self.rng.shuffle(order)
        new = next_leadership(self.znode, live, order=order)
        if new is not None:
            self._write_znode(new)
        if self.znode.leader is None:
            self._elect_later(20)

    def expire_session(self, nid: str, notify_after_ms: int = 5) -> None:
        """The metastore expires ``nid``'s session; the replica hears of it ``notify_after_ms`` later."""
        n = self.nodes[nid]
        if not n.alive or not n.session_live:
            return
        n.session_live = False
        self.note(f"session of {nid} expired")
        if self.znode.leader == nid:
            self._elect_later(self.rng.randint(1, 10))
        session = n.session

        def notify() -> None:
            # (a crash ends the process and its session; a far-horizon install rebuilds only the replica)
            if n.alive and n.session == session:
                inc = n.incarnation
                self._deliver(nid, inc, SessionExpired())
                self._sessions += 1
                n.session = self._sessions
                n.session_live = True
                self._deliver(nid, inc, SessionStarted(n.session))
                self._notify(nid, self.znode)
                # The new session re-reads every watched znode (kazoo's DataWatch does on CONNECTED), the
                # module's too: options set while the session was down arrive now (seed 7804: a leader kept
                # the faults' max-inflight 8 and took longer than the quiet period to catch a follower up).
                if n.replica.config != self.config:
                    self.at(n.last_notify_ms, self._deliver, nid, inc, ConfigChanged(self.config))
        self.at(self.now + notify_after_ms, notify)

    # ------------------------------------------------------------------------------- crashes

    def crash(self, nid: str, power: bool | None = None) -> None:
        """A kill, or (``power``; by default a quarter of the crashes) a power loss of the node's machine."""
        n = self.nodes[nid]
        if not n.alive:
            return
        self.note(f"crash {nid}")
        n.alive = False
        n.incarnation += 1
        n.sync_pending = False
        n.outbox.clear()  # what the process had not sent yet dies with it
        d = n.disk
        del d.entries[d.durable_end:]
        d.applied = d.store_durable  # the store's memtables die with the process
        if power is None:
            power = self.store_rng.random() < 0.25
        if power:  # a power loss, not a kill: the floor's unsynced writes are gone too
            d.floor = d.floor_synced
            if d.volatile and self.survivable(nid):
                self._lose_page_cache(n)
        if n.session_live:
            n.session_live = False
            if self.znode.leader == nid:
                self._elect_later(self.session_timeout_ms)

    def _lose_page_cache(self, n: Node) -> None:
        """Interval mode's power loss: the entries written since the last sync are gone, acknowledged or not,
        and the machine comes back under another boot, so the page-cache rule counts the storage as lost (the
        sim expects the open-time check to say so whatever was actually lost)."""
        d = n.disk
        n.boot += 1
        cut = max(d.start, d.synced_end)
        if d.store_durable >= cut:
            # The store's flushed state is ahead of what the log kept: at open the log restarts after the
            # store's applied offset, as the worker's open does (conductor/worker/replica_disk.py).
            cut = d.start = d.store_durable + 1
        self.note(f"{n.id} loses power: its page cache [{cut},{d.durable_end}) is gone "
                  f"(acknowledged up to {d.acked})")
        if cut < d.durable_end:
            self._lose_copies(d, cut)
            del d.entries[cut:]
            d.durable_end = cut
            d.gen += 1
        d.acked = min(d.acked, d.acked_synced)  # the marks' page-cache writes are gone too
        d.damaged = True

    def survivable(self, nid: str) -> bool:
        """Whether the group survives ``nid`` losing what it acknowledged: another ISR or ELR member keeps an
        intact copy (during a reassignment among the target and among the original replicas, since either may
        survive it). The storage and power nemeses hit only then (with every copy gone, losing an entry is not
        a bug)."""
        z = self.znode
        survivors = [z.target, z.original] if z.reassigning else [z.replicas]
        # A retired copy holds every applied entry while it is kept (nothing is applied meanwhile): it is taken back
        # if the kept replicas lost theirs (replog.retirement). It counts until the first of them reconfirms: a
        # kept replica's confirmation may release it, so a fault after that one is a fault after the plan, which
        # the group survives only with an intact ISR or ELR member (seed 15000099: c reconfirmed, then lost power;
        # a's new storage record released b's copy while c was down).
        kept = all(m in z.reconfirming for m in z.isr + z.elr) and any(
            m != nid and not self.nodes[m].disk.damaged and self.nodes[m].disk.incarnation == inc
            for m, inc, _ in z.retired)
        # (an unsure member that holds everything counts: the election's witnesses find it, replog.eligibility)
        return kept or all(any(self.holds(m) for m in z.isr + z.elr if m != nid and m in keep) for keep in survivors)

    def power_loss(self, nid: str, restart_after_ms: int) -> None:
        """The node's machine loses power (and restarts later)."""
        if self.nodes[nid].alive:
            self.crash(nid, power=True)
            self.at(self.now + restart_after_ms, self.restart, nid)

    def restart(self, nid: str) -> None:
        n = self.nodes[nid]
        if n.alive:
            return
        self.note(f"restart {nid}")
        n.alive = True
        self._sessions += 1
        n.session = self._sessions
        n.session_live = True
        if not n.hosting:
            return  # a worker without a replica of the group
        unsure = self._open_storage(n)
        n.replica = self._new_replica(nid, n.disk, n.session, unsure)
        if n.replica.applied < n.disk.applied:
            self.fail(f"{nid} recovered applied {n.replica.applied} < durable {n.disk.applied}")
        n.max_applied = n.replica.applied
        n.max_epoch = n.replica.epoch
        self.at(self.now + self.rng.randrange(self.tick_ms), self._tick, nid, n.incarnation)
        self._notify(nid, self.znode)

    def _far_horizon(self, leader: str, inc: int, a: StartFarHorizon, rnd: int = 1, finc: int = -1,
                     prev: int = -1) -> None:
        """A round: the leader checkpoints its applied state; the copy reaches the follower some time later.

        After each round the shared round rule (replog.catchup) decides: install, or another round. Like
        the worker's follower, one incarnation runs one transfer at a time and ignores offers meanwhile.
        """
        if rnd == 1:
            finc = self.nodes[a.follower].incarnation
            if (a.follower, finc) in self.copying:
                return
            self.copying.add((a.follower, finc))
        ln = self.nodes[leader]
        if not ln.alive or ln.incarnation != inc or ln.replica.epoch != a.epoch or not ln.replica.is_leader:
            self.copying.discard((a.follower, finc))
            return
        upto = ln.disk.applied
        ln.disk.store_durable = upto  # a checkpoint flushes the store
        state = list(ln.disk.entries[:upto + 1])
        pairs = tuple((e, s) for e, s in ln.disk.epoch_pairs if s <= upto)
        self.note(f"{leader} checkpoints [0,{upto}] for {a.follower} (round {rnd})")
        copy_ms = self.rng.randint(10, 120) if upto != prev else self.rng.randint(1, 5)  # nothing new: one call
        self.at(self.now + copy_ms, self._end_round, leader, inc, a, rnd, finc, upto, state, pairs)

    def _end_round(self, leader: str, inc: int, a: StartFarHorizon, rnd: int, finc: int, upto: int,
                   state: list[Entry], pairs: tuple[tuple[int, int], ...]) -> None:
        behind = len(self.nodes[leader].disk.entries) - 1 - upto
        if round_is_last(behind, self.config.max_near_sync_message_lag, rnd):
            self.copying.discard((a.follower, finc))
            self._install_checkpoint(a.follower, finc, leader, a.epoch, upto, state, pairs)
        else:
            self._far_horizon(leader, inc, a, rnd + 1, finc, upto)

    def _install_checkpoint(self, nid: str, inc: int, leader: str, epoch: int, upto: int,
                            state: list[Entry], pairs: tuple[tuple[int, int], ...]) -> None:
        """The follower's side of far horizon, under the driver contract's conditions (see replog.messages)."""
        n = self.nodes[nid]
        r = n.replica
        if not n.alive or n.incarnation != inc or (leader, nid) in self.cut:
            return
        if r.far_horizon_refusal(leader, epoch, upto, in_isr=nid in self.znode.isr) is not None:
            return  # a leadership that is over, or it would drop acknowledged entries / bring nothing new
        d = n.disk
        self.note(f"{nid} installs a checkpoint of [0,{upto}] from {leader}")
        d.entries = state
        d.durable_end = d.synced_end = upto + 1
        d.start = upto + 1
        d.applied = d.store_durable = d.floor = d.floor_synced = upto
        d.acked = d.acked_synced = upto
        d.claimed = -1
        d.epoch_pairs = pairs
        d.gen += 1
        # Rebuilt like a restarted replica (same session), told the current znode at once.
        n.incarnation += 1
        n.replica = self._new_replica(nid, d, n.session)
        if self.znode.incarnation_of(nid) != d.incarnation:
            # A reassignment removed it and took it back while it was copying, and it never saw the removal: the
            # znode no longer records its storage, so the rebuilt replica serves nothing (nor takes the current
            # epoch) until it has recorded it again, like a restarted one (seed 11013759).
            n.max_epoch = n.replica.epoch
        self.at(self.now + self.rng.randrange(self.tick_ms), self._tick, nid, n.incarnation)
        self._deliver(nid, n.incarnation, MetastoreChanged(self.znode))

    # ------------------------------------------------------------------------------- storage faults

    def lose_disk(self, nid: str, restart_after_ms: int) -> None:
        """The node's disk is replaced by an empty one: it crashes and restarts with nothing."""
        self.crash(nid)
        n = self.nodes[nid]
        self.note(f"{nid} loses its disk")
        self._lose_copies(n.disk, 0)
        n.disk = self.new_disk()
        self.at(self.now + restart_after_ms, self.restart, nid)

    def lose_tail(self, nid: str, entries: int, restart_after_ms: int) -> None:
        """A lying disk: on the crash the log also loses up to ``entries`` of its last *durable* entries."""
        self.crash(nid)
        d = self.nodes[nid].disk
        cut = max(d.applied + 1, d.start, d.durable_end - entries)
        if cut < d.durable_end:
            self.note(f"{nid} loses its log tail [{cut},{d.durable_end}) (acknowledged up to {d.acked})")
            self._lose_copies(d, cut)
            del d.entries[cut:]
            d.durable_end = cut
            d.synced_end = min(d.synced_end, cut)
            d.gen += 1
            d.damaged = True
        self.at(self.now + restart_after_ms, self.restart, nid)

    def _lose_copies(self, d: Disk, start: int) -> None:
        for o in range(start, d.durable_end):
            self.lost_copies[o] = self.lost_copies.get(o, 0) + 1

    def find_corruption(self, nid: str, offset: int) -> None:
        """The running replica finds entry ``offset`` damaged: the worker quarantines what is unsafe and reopens
        the replica in place (same process, same session). Above the applied offset only the log from there
        goes; at or below it the store's state is suspect too, so the whole storage is discarded."""
        n = self.nodes[nid]
        if not n.alive or not n.session_live or not n.hosting:
            return  # (a reopen during a session change is a restart: covered by crashes)
        d = n.disk
        self.note(f"{nid} finds entry {offset} damaged")
        n.incarnation += 1  # the old replica object is gone, with what it had not sent
        n.outbox.clear()
        self._lose_copies(d, offset if offset > d.applied and offset >= d.start else 0)
        if offset > d.applied and offset >= d.start:
            d.damaged = d.durable_end > offset  # (what it flushed was reported: acknowledged, or about to be)
            del d.entries[offset:]
            d.durable_end = min(d.durable_end, offset)
            d.synced_end = min(d.synced_end, offset)
            d.gen += 1
            d.applied = d.store_durable  # the failed replica's store is abandoned unflushed
        else:
            n.disk = self.new_disk()
        unsure = self._open_storage(n)
        n.replica = self._new_replica(nid, n.disk, n.session, unsure)
        n.max_applied = n.replica.applied
        n.max_epoch = n.replica.epoch
        self.at(self.now + self.rng.randrange(self.tick_ms), self._tick, nid, n.incarnation)
        self._deliver(nid, n.incarnation, MetastoreChanged(self.znode))

    # ------------------------------------------------------------------------------- membership

    def _host(self, n: Node) -> None:
        """The worker opens a replica of the group, which a reassignment added to it: empty, new storage; or from
        the retired copy it kept, which the group takes back (checked at open like any storage)."""
        n.hosting = True
        unsure = False
        if n.retained and self.znode.incarnation_of(n.id) is not None:  # (re-added by a later plan: empty)
            self.note(f"{n.id} reopens its retired copy: taken back")
            n.retained = False
            unsure = self._open_storage(n)
        else:
            if n.retained:
                n.retained, n.deleted[:] = False, [n.disk]
            self.note(f"{n.id} opens a new replica")
            n.disk = self.new_disk()
        n.incarnation += 1
        n.outbox.clear()
        n.max_applied, n.max_epoch = -1, 0
        n.replica = self._new_replica(n.id, n.disk, n.session, unsure)
        if n.alive:
            self.at(self.now + self.rng.randrange(self.tick_ms), self._tick, n.id, n.incarnation)
            if n.session_live:
                self._notify(n.id, self.znode)

    def _unhost(self, n: Node, a: Removed) -> None:
        """The replica says a reassignment removed it: the worker closes it and deletes its data."""
        listed = self.replica_history.get(a.version)
        if listed is None or n.id in listed:
            self.fail(f"{n.id} says it was removed by znode v{a.version}, which lists {listed}")
        n.hosting = False
        n.incarnation += 1  # what the replica had not done dies with it
        n.outbox.clear()
        d = n.disk
        if a.retired and n.id in retired_names(self.znode) + self.znode.replicas:
            # A retired copy: the worker closes the replica cleanly (its log flushed, its store too) and keeps it.
            self.note(f"{n.id} is removed (znode v{a.version}): closes its replica, keeps its data (retired)")
            n.retained = True
            d.durable_end = d.synced_end = len(d.entries)
            d.acked_synced, d.floor_synced = d.acked, d.floor
            d.store_durable, d.volatile, d.gen = d.applied, False, d.gen + 1
        else:
            self.note(f"{n.id} is removed (znode v{a.version}): closes its replica, deletes its data")
            n.deleted[:] = [d]
            n.disk = self.new_disk()
        if n.id in self.znode.replicas:  # taken back meanwhile: reopened (from the retired copy, or empty)
            self._host(n)

    # ------------------------------------------------------------------------------- partitions

    def isolate(self, nid: str) -> None:
        for o in self.ids:
            if o != nid:
                self.cut.add((nid, o))
                self.cut.add((o, nid))

    def cut_link(self, src: str, dst: str) -> None:
        self.cut.add((src, dst))

    def heal_link(self, src: str, dst: str) -> None:
        self.cut.discard((src, dst))

    def heal(self) -> None:
        self.cut.clear()

    # ------------------------------------------------------------------------------- helpers

    def leader(self) -> str | None:
        return self.znode.leader

    def fail(self, what: str) -> None:
        raise InvariantViolation(f"t={self.now}ms: {what}")

    def check_liveness_by_deadline(self, grace_ms: int = LIVENESS_GRACE_MS, step_ms: int = 50) -> int:
        """:meth:`check_liveness` now; if it fails, again every ``step_ms`` for up to ``grace_ms`` more.

        Liveness is a deadline on recovery after healing. Nearly every run has converged when it is first
        checked; the grace lets the few whose recovery legitimately takes longer finish, while a run stuck
        for good still fails (with the first check's finding). A seed that passes the first check runs
        exactly as before the grace existed. What can take longer: a replica rebuilt from a far-horizon copy
        after healing that then replays hundreds of entries over a network that reorders frames (each frame
        ahead of the follower's end is dropped and the window resent, go-back-N; the worker's one TCP link
        per peer does not reorder, the simulator's network does, to prove the rules need no order). Seed
        46016021: a new leader 200 ms after healing, the rebuilt replica's copy offer refused while its
        transfer from the leader's previous epoch wound down (a 300 ms retry), then 395 entries replayed in
        780 ms under 30 ms of jitter: the group converged about 30 ms after the 1,500 ms mark.

        Returns how long past the first check the run converged (0: at once), which sweeps report.
        """
        start, deadline = self.now, self.now + grace_ms
        try:
            self.check_liveness()
            return 0
        except InvariantViolation as first:
            finding = first
        while self.now < deadline:
            self.run_for(min(step_ms, deadline - self.now))
            try:
                self.check_liveness()
                return self.now - start
            except InvariantViolation:
                continue
        raise InvariantViolation(f"{finding} (still not converged {grace_ms} ms later)")

    def check_liveness(self) -> None:
        """After healing and quiescence: one leader, everyone applied the leader's whole log, acks kept."""
        z = self.znode
        if z.leader is None or not self.nodes[z.leader].replica.is_leader:
            self.fail(f"no working leader after healing (znode {z})")
        lead = self.nodes[z.leader]
        end = len(lead.disk.entries)
        if len(self.committed) != end:
            self.fail(f"leader {z.leader} log has {end} entries but only {len(self.committed)} are applied; "
                      f"ISR {z.isr}, applied " + ", ".join(f"{m}={self.nodes[m].disk.applied}" for m in self.ids))
        for m in z.replicas:
            d = self.nodes[m].disk
            if d.applied != end - 1 or d.entries != self.committed:
                self.fail(f"{m} applied {d.applied} of {end} entries after healing "
                          f"(log {len(d.entries)}, durable {d.durable_end})")
        if z.reassigning:
            self.fail(f"a reassignment is still in progress after healing: {z}")
        if z.retired:
            self.fail(f"retired copies are still kept after healing: {z}")
        for m in self.ids:
            n = self.nodes[m]
            if m not in z.replicas and (n.hosting or n.disk.entries):
                self.fail(f"{m} is not a replica but still {'hosts one' if n.hosting else 'holds its data'}")
        final_epoch = z.epoch
        for req in self.requests.values():
            if req.outcome != "ok":
                continue
            must = req.ack is Ack.APPLIED or (req.ack is Ack.APPEND and req.epoch == final_epoch)
            if not must:
                continue
            for i, p in enumerate(req.payloads):
                o = req.first + i
                if o >= end or self.committed[o][1] != p:
                    self.fail(f"acknowledged ({req.ack}) {p} at {o} was lost")


# ------------------------------------------------------------------------------------------------ random runs


@dataclass(frozen=True)
class RunResult:
    seed: int
    steps: int
    appended: int
    applied: int
    error: str | None
    #: reassignments completed and cancelled (membership runs)
    plans_completed: int = 0
    plans_cancelled: int = 0
    #: depot trims committed (trim seeds)
    trims: int = 0
    #: how long after its quiet period the run converged (0: by then; see Sim.check_liveness_by_deadline)
    late_ms: int = 0


def _records(entries: list[Entry]) -> int:
    """Depot records the entries appended (every payload but trims)."""
    return sum(1 for _e, p in entries if not p.startswith("trim:"))


def _tick_view(r: Replica) -> tuple[Any, ...]:
    """What a tick could change in a replica (to check that a tick before ``next_tick_ms`` changes nothing)."""
    ls = r._ls
    leader = None if ls is None else (ls.isr, ls.osr, ls.version, ls.pending_change, ls.stalled, ls.resign,
                                      len(ls.wait_append), len(ls.wait_applied),
                                      [astuple(p) for p in ls.peers.values()])
    return (r.role, r.epoch, r.reconciled, r._requested_epoch, r._request_sent_ms, r.apply_offset, leader)


def replay_command(seed: int) -> str:
    return f"SIM_SEED={seed} .venv/bin/python -m pytest tests/sim/test_sim.py::test_replay"


#: seeds from here on run membership changes (the conductor's reassignments, tests/sim/membership.py): every
#: seed swept and kept before they existed lies below, and replays as it was recorded
MEMBERSHIP_SEEDS_FROM = 10_000_000
#: seeds from here on also run depot trims (pstate.retention's promise rule), from their own generator
TRIM_SEEDS_FROM = 20_000_000
#: seeds from here on run half of their groups with replication.fsync=interval and the power-loss nemesis
INTERVAL_SEEDS_FROM = 13_000_000


def run_seed(seed: int, replica_cls: type[Replica] = Replica, fault_ms: int = 1200,
             quiet_ms: int = 1500, trace: bool = False, membership: bool | None = None,
             plan_rules: type[PlanRules] = PlanRules, prepare: Callable[[Sim], None] | None = None,
             trim_rule: str = "applied", storage_rule: StorageRule = check_storage,
             interval: bool | None = None) -> RunResult:
    """One randomized run: faults and client load for ``fault_ms``, then heal and check liveness.

    ``membership`` (default: the seeds from MEMBERSHIP_SEEDS_FROM) adds spare workers and the
    reassignment nemesis, which plays the conductor with ``plan_rules``. ``prepare(sim)`` runs before it starts
    (a test's initial disks: tests/sim/test_restore.py). ``interval`` (default: half of the
    seeds from INTERVAL_SEEDS_FROM) runs replication.fsync=interval with the power-loss nemesis. A
    ``storage_rule`` other than replog's (a mutant) is trusted: the sim then checks only what follows from it.
    """
    rng = random.Random(seed ^ 0x5EED)
    nodes = rng.choice([2, 3, 3, 3, 4])
    member_rng = random.Random(seed ^ 0x4E4B)  # its own stream, like the other fault classes
    if membership is None:
        membership = seed >= MEMBERSHIP_SEEDS_FROM
    spares = 0
    reassigner = None
    if membership:
        nodes = member_rng.choice([1, 2, 3, 3, 4])
        spares = 2 if nodes == 1 else member_rng.choice([1, 2])
    faults = Faults.random(rng)
    # Its own stream, so seeds without hand-offs replay exactly as before hand-offs existed.
    balance_rng = random.Random(seed ^ 0xBA1A)
    if balance_rng.random() < 0.5:
        faults.resign_rate = balance_rng.choice([2.0, 6.0])
    config = sim_config(nodes, min_isr=rng.choice([None, None, nodes]),
                        max_unapplied_entries=rng.choice([400, 400, 40]))
    power_rng = random.Random(seed ^ 0xB007)  # its own stream, so earlier seeds replay as recorded
    coin = power_rng.random() < 0.5
    if interval is None:
        interval = seed >= INTERVAL_SEEDS_FROM and coin
    if interval:
        config = replace(config, fsync=FSYNC_INTERVAL, flush_ms=power_rng.choice([5, 20, 60]))
    sim = Sim(seed, nodes=nodes, config=config, faults=faults, replica_cls=replica_cls, trace=trace,
              metastore_ms=rng.choice([(1, 5), (1, 40)]), spares=spares)
    sim.storage_rule = storage_rule
    # Its own generator, so seeds recorded before retention existed still replay their runs.
    sim.retention = random.Random(seed ^ 0x7E7E).random() < 0.5
    config_rng = random.Random(seed ^ 0xC0F1)  # likewise for live option changes
    storage_rng = random.Random(seed ^ 0xD15C)  # and for storage faults
    if storage_rng.random() < 0.5:
        faults.storage_fault_rate = storage_rng.choice([1.0, 3.0])
    late_ms = 0
    slow = {nid for nid in sim.ids if rng.random() < faults.slow_disk}
    for nid in slow:
        sim.nodes[nid].flush_ms = faults.slow_flush_ms
    try:
        if prepare is not None:
            prepare(sim)
        sim.start()
        _schedule_faults(sim, rng, fault_ms)
        _schedule_clients(sim, rng, fault_ms)
        _schedule_resigns(sim, balance_rng, fault_ms)
        _schedule_config_changes(sim, config_rng, fault_ms)
        _schedule_storage_faults(sim, storage_rng, fault_ms)
        if membership:
            reassigner = _schedule_membership(sim, member_rng, fault_ms, plan_rules)
        if seed >= TRIM_SEEDS_FROM:
            sim.trim_rule = trim_rule
            _schedule_trims(sim, random.Random(seed ^ 0x7219), fault_ms)
        if interval:
            _schedule_power_losses(sim, power_rng, fault_ms)
        sim.run_until(fault_ms)
        # heal: no more faults, everyone back, fast disks, the options liveness is judged under
        sim.faults = replace(sim.faults, drop=0.0, duplicate=0.0)
        if sim.config != config:
            sim.set_config(config)
        sim.heal()
        for nid in sim.ids:
            sim.nodes[nid].flush_ms = 2
            sim.restart(nid)
        sim.run_until(fault_ms + quiet_ms)
        late_ms = sim.check_liveness_by_deadline()
        err = None
    except AssertionError as e:
        if isinstance(e, InvariantViolation):
            kind = "invariant"
        else:
            frame = traceback.extract_tb(e.__traceback__)[-1]
            kind = f"state-machine assertion ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} {frame.line})"
        err = (f"seed {seed} ({nodes} nodes{f' + {spares} spare' if spares else ''}; {faults.describe()}): "
               f"{kind} failed: {e}\n"
               f"replay: {replay_command(seed)}")
        if trace:
            err += "\n" + "\n".join(sim.log[-60:])
    plans = (reassigner.completed, reassigner.cancelled) if reassigner is not None else (0, 0)
    return RunResult(seed, sim.steps, sim._next_payload, len(sim.committed), err, *plans, sim.trims_applied,
                     late_ms)


def _poisson(sim: Sim, rng: random.Random, rate: float, until_ms: int, action: Callable[[], None]) -> None:
    """Schedule ``action`` at the events of a Poisson process of ``rate`` per virtual second, until ``until_ms``."""
    if rate <= 0:
        return
    t = 0.0
    while True:
        t += rng.expovariate(rate / 1000.0)
        if t >= until_ms:
            return
        sim.at(int(t), action)


def _schedule_faults(sim: Sim, rng: random.Random, until_ms: int) -> None:
    f = sim.faults

    def poisson(rate: float, action: Callable[[], None]) -> None:
        _poisson(sim, rng, rate, until_ms, action)

    def partition() -> None:
        if rng.random() < 0.5:
            sim.isolate(rng.choice(sim.ids))
        else:
            a, b = rng.sample(sim.ids, 2)
            sim.cut_link(a, b)
        sim.at(sim.now + rng.choice([rng.randint(30, 300), rng.randint(300, 700)]), sim.heal)

    def crash() -> None:
        nid = sim.znode.leader if (sim.znode.leader and rng.random() < 0.5) else rng.choice(sim.ids)
        sim.crash(nid)
        sim.at(sim.now + rng.randint(5, 250), sim.restart, nid)

    def expire() -> None:
        if sim.znode.leader:
            sim.expire_session(sim.znode.leader, notify_after_ms=rng.choice([1, 20, 200]))

    poisson(f.partition_rate, partition)
    poisson(f.crash_rate, crash)
    poisson(f.session_expiry_rate, expire)


def _schedule_storage_faults(sim: Sim, rng: random.Random, until_ms: int) -> None:
    """Disk losses, tail losses after acknowledgement and corruption found on read, on a node chosen at random.

    Only where the group can survive it: some other member of the ISR or the
    ELR keeps an intact copy (during a reassignment, among the target and among
    the original replicas, since the plan may be completed or cancelled) (with every copy of an entry gone, losing it is
    not a bug). That member may be down or not yet confirmed: the damaged
    replica leaves the ISR, or stays in it marked lost, and the group is led
    again once an intact member can be elected (seeds 5100562, 6596 stalled
    until the ELR kept a deposed leader electable). The leader is hit as often
    as a follower.
    """
    rate = sim.faults.storage_fault_rate
    if rate <= 0:
        return

    def fault() -> None:
        z = sim.znode
        nid = z.leader if (z.leader and rng.random() < 0.5) else rng.choice(sim.ids)
        # (during a reassignment, whichever way it ends: the conductor may be writing its last step already)
        if not sim.nodes[nid].hosting or not sim.survivable(nid):
            return
        kind = rng.random()
        if kind < 0.35:
            sim.lose_disk(nid, rng.randint(5, 250))
        elif kind < 0.7:
            sim.lose_tail(nid, rng.randint(1, 6), rng.randint(5, 250))
        else:
            d = sim.nodes[nid].disk
            if d.durable_end > d.start:
                sim.find_corruption(nid, rng.randrange(d.start, d.durable_end))

    _poisson(sim, rng, rate, until_ms, fault)


def _schedule_power_losses(sim: Sim, rng: random.Random, until_ms: int) -> None:
    """replication.fsync=interval: machines lose power (their page cache with it) and restart, one at a time
    and only while another ISR or ELR member keeps an intact copy (:meth:`Sim.survivable`): what the mode
    promises to survive is any minority losing power, so long as one in-sync copy keeps it."""
    rate = rng.choice([2.0, 5.0])

    def cut() -> None:
        z = sim.znode
        nid = z.leader if (z.leader and rng.random() < 0.5) else rng.choice(sim.ids)
        if sim.nodes[nid].hosting and sim.nodes[nid].alive and sim.survivable(nid):
            sim.power_loss(nid, rng.randint(5, 250))

    _poisson(sim, rng, rate, until_ms, cut)


def _schedule_membership(sim: Sim, rng: random.Random, until_ms: int,
                         rules: type[PlanRules] = PlanRules) -> Reassigner:
    """The membership nemesis: plans started at random during the faults, a quarter of them cancelled.

    Kinds: grow by one or two (RF 1 -> 3, 3 -> 5), shrink by one (3 -> 2),
    replace one replica by a spare, or any set of workers. The conductor's loop
    goes on after the faults, so every plan ends before liveness is judged.
    """
    reassigner = Reassigner(sim, rng, rules)
    rate = rng.choice([2.0, 5.0])

    def plan() -> None:
        z = sim.znode
        if z.reassigning:
            if rng.random() < 0.2:
                reassigner.cancel()
            return
        current = list(z.replicas)
        spare = [m for m in sim.ids if m not in current]
        kind = rng.random()
        if kind < 0.3 and spare:
            target = current + rng.sample(spare, min(len(spare), rng.choice([1, 2])))
        elif kind < 0.55 and len(current) > 1:
            target = rng.sample(current, len(current) - 1)
        elif kind < 0.8 and spare:
            out = rng.choice(current)
            target = [m if m != out else rng.choice(spare) for m in current]
        else:
            target = rng.sample(sim.ids, rng.randint(1, len(sim.ids)))
        rng.shuffle(target)
        reassigner.start(target, cancel=rng.random() < 0.25)

    _poisson(sim, rng, rate, until_ms, plan)
    return reassigner


def _schedule_resigns(sim: Sim, rng: random.Random, until_ms: int) -> None:
    """Like the conductor's balancer: ask the leader to hand off to a random in-sync follower."""
    rate = sim.faults.resign_rate
    if rate <= 0:
        return

    def resign() -> None:
        z = sim.znode
        followers = [m for m in z.isr if m != z.leader]
        if z.leader is not None and followers:
            sim.request_resign(rng.choice(followers))

    _poisson(sim, rng, rate, until_ms, resign)


def _schedule_config_changes(sim: Sim, rng: random.Random, until_ms: int) -> None:
    """On half of the seeds, an operator changes live options (``set-option``) a few times during the faults.

    min-ISR moves anywhere in [1, replication factor] (lowering it is how an
    operator unstalls a group); the lag, near-horizon and inflight limits move
    within a factor of a few of the simulator's defaults.
    """
    if rng.random() < 0.5:
        return
    base = sim.config
    rf = base.replication_factor
    for _ in range(rng.randint(1, 4)):
        cfg = replace(base, min_isr=rng.choice([None, *range(1, rf + 1)]),
                      max_time_lag_ms=rng.choice([60, 150, 400]),
                      max_near_sync_message_lag=rng.choice([10, 40, 200]),
                      max_inflight_entries=rng.choice([8, 60, 500]))
        sim.at(rng.randrange(until_ms), sim.set_config, cfg)


def _schedule_trims(sim: Sim, rng: random.Random, until_ms: int) -> None:
    """Trims every few dozen milliseconds, below a point anywhere from the start to past the end."""
    t = 20
    while t < until_ms:
        sim.at(t, lambda: sim.trim(int(_records(sim.committed) * rng.uniform(0.5, 3.0)) + rng.randrange(5)))
        t += 10 + rng.randrange(60)


def _schedule_clients(sim: Sim, rng: random.Random, until_ms: int) -> None:
    t = 5
    acks = (Ack.NONE, Ack.APPEND, Ack.APPLIED, Ack.APPLIED)
    gap = rng.choice([3, 6, 12])
    while t < until_ms:
        sim.at(t, lambda c=rng.randint(1, 3), a=rng.choice(acks): sim.append(c, a))  # type: ignore[misc]
        t += 1 + rng.randrange(gap)
