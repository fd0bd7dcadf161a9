"""One task-group replica on a worker node: the driver of a :class:`replog.replica.Replica`.

Each replica's loop runs on one *task thread* that owns its replog, epoch file
and RocksDB store; nothing else touches them, so none of them needs a lock. The
thread is a worker's :class:`~conductor.worker.task_thread.TaskThread`, dedicated to the replica or stepping
several replicas in turn. Each step drains the inbox in bulk, feeds every event to the state machine, and
performs the returned actions. Local appends are written at once but fsynced once per drain cycle: appends that
arrived while the previous fsync ran share the next one (group commit), turning a ~1 ms fsync into throughput.

The actions' contract is in :mod:`replog.messages`; this module only performs them.
"""

from __future__ import annotations

import functools
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, assert_never

from conductor.worker import checkpoint_install
from conductor.worker.checkpoint_install import ParkedInstall
from conductor.worker.dataflow import DataflowDriver, Inflow
from conductor.worker.drain_sync import DrainSync
from conductor.worker.durability import LogDurability, machine_boot
from conductor.worker.entry_applier import EntryApplier
from conductor.worker.inbox import (
    AttachDataflow,
    Fail,
    InboxItem,
    InstallCheckpoint,
    Ordered,
    ReplicaInbox,
)
from conductor.worker.log_frames import ReplicateReads, append_local
from conductor.worker.pending_entry import PendingEntry
from conductor.worker.replica_disk import open_disk
from conductor.worker.replica_faults import REPLICA_FAULTS, Fault, describe, fault_kind
from conductor.worker.task_clock import MAX_SLEEP_MS, RETAIN_INTERVAL_MS, TICK_MS, next_wake_ms, now_ms
from conductor.worker.timings import ReplicaTimings, replica_counters
from conductor.worker.waiting_appends import WaitingAppends
from pstate.checkpoint import Manifest
from pstate.errors import PStateError
from replog.batch import scan_frames
from replog.config import DEFAULT_SEGMENT_BYTES, ReplicationConfig
from replog.errors import (
    AppendFailed,
    Backpressure,
    EntryTooLarge,
    ReplicaFailed,
    ReplogError,
)
from replog.messages import (
    STORAGE_LOST,
    Ack,
    Action,
    AppendLocal,
    Apply,
    ChangeIsr,
    ClientAppend,
    ConfigChanged,
    EpochRequest,
    EpochResponse,
    Event,
    FarHorizonOffer,
    GroupState,
    HandOff,
    IsrChanged,
    IsrChangeFailed,
    LocalFlushed,
    LogStartAdvanced,
    MetastoreChanged,
    PersistEpochs,
    RawReplicate,
    RecordStorage,
    Removed,
    Replicate,
    ReplicateAck,
    Reply,
    ResignRequested,
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
from replog.replica import Replica
from topology.entries.port import EntryPort
from topology.errors import TopologyError

if TYPE_CHECKING:
    from conductor.worker.task_thread import TaskThread

log = logging.getLogger("millrace.node")


class ReplicaHost:
    """Owns one replica's disk state and task thread; every other thread talks to it through `post`."""

    def __init__(
        self,
        node_id: str,
        module: str,
        group: int,
        data_dir: Path,
        config: ReplicationConfig,
        session: int,
        store: EntryApplier,
        send: Callable[[str, int, list[tuple[str, Any]]], None],
        change_isr: Callable[[ReplicaHost, int, GroupState], None],
        on_role: Callable[[ReplicaHost, RoleChanged], None] | None = None,
        on_far_horizon: Callable[[ReplicaHost, str, int], None] | None = None,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        hand_off: Callable[[ReplicaHost, int, GroupState], None] | None = None,
        dataflow: DataflowDriver | None = None,
        on_fault: Callable[[ReplicaHost], None] | None = None,
        *,
        task_thread: TaskThread,
        entries: EntryPort,
        stats: dict[str, int] | None = None,
        timings: ReplicaTimings | None = None,  # latency histograms; None: --metrics-detail off
    ) -> None:
        self.node_id = node_id
        self.module = module
        self.group = group
        self.name = f"{module}/{group}"
        self.dir = data_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        applied = store.applied_offset
        boot = machine_boot()
        disk = open_disk(self.name, self.dir, applied, segment_bytes, boot)
        self.log, self.epoch_file, self.marks = disk.log, disk.epoch_file, disk.marks
        #: where writes are fsynced: before every ack, or every replication.flush.ms (conductor.worker.durability)
        self.durability = LogDurability(self.log, self.marks, boot)
        self.syncs = DrainSync(self.durability, self.log)  # a drain's fsync, maybe ahead on a helper thread
        self.reads = ReplicateReads()  # the drain's log reads for its followers (shared by those in step)
        #: why this storage is not intact (it lost entries it acknowledged), None if it is
        self.storage_lost = disk.storage_lost
        #: this storage's incarnation (replog.eligibility): new with the directory, or after a loss
        self.incarnation = disk.incarnation
        self.store = store
        #: builds the entries this replica appends as a leader (task thread only)
        self.entries = entries
        self.config = config
        self._send = send
        self._change_isr = change_isr
        self._on_role = on_role
        self._on_far_horizon = on_far_horizon
        self._hand_off = hand_off
        #: hop messages of the module's topologies (None when no topology runs here)
        self.dataflow = dataflow
        #: told (on the task thread, before its disk closes) when a fault stopped this replica
        self._on_fault = on_fault
        #: the fault that stopped this replica (it serves nothing once set; the worker replaces it)
        self.fault: Fault | None = None
        #: the last fault of this group's replica on this node, before it was (re)opened (status, metrics)
        self.last_fault: Fault | None = None
        self.replica = self._new_replica(session, applied, disk.floor, unsure=disk.unsure)
        #: the group znode as last fed to the state machine (far-horizon install checks ISR membership)
        self._znode: GroupState | None = None
        #: follower: the far-horizon transfer running for this replica, if any (set by the node)
        self.catchup: Any = None
        self._next_retain_ms = 0
        #: work happened since the last retention check (an idle replica's retention point does not move)
        self._retain_owed = True
        #: what other threads post to the task thread, typed and bounded (conductor.worker.inbox)
        self.inbox = ReplicaInbox(self.name)
        self.waiting = WaitingAppends(self.name)
        self._stop = threading.Event()
        self._dirty = False
        self._step_now = 0  # the clock of the drain `begin` started (`finish` goes on with it)
        #: peer messages of this drain, shipped in one transport call, and held beats (replog.outbox's policy)
        self.outbox = Outbox()
        #: follower: apply up to here once this drain's fsync and acks are out (see `_perform`)
        self._apply_later = -1
        #: a far-horizon install whose writes run off the task thread: this replica is parked meanwhile
        self._parked: ParkedInstall | None = None
        #: the task thread this replica's loop runs on: a dedicated one, or one it shares with other replicas
        self.task_thread = task_thread
        self.thread = task_thread.thread
        #: set once the task thread let go of this replica's disk (stopped or failed)
        self.closed = threading.Event()
        self._next_tick = 0
        self._next_flow = 0  # the earliest the dataflow's next round is due with nothing arriving
        #: counters for metrics and `conductor status` (the worker's record of this replica keeps them)
        self.stats = replica_counters() if stats is None else stats
        self.timings = timings
        self.last_error: str | None = None
        #: a reassignment removed this replica: its data goes once its disk is closed, unless retired (kept)
        self.removed = self.retired = False
        log.info("%s: opened replica on %s (log [%d, %d), applied %d)", self.name, node_id,
                 self.log.start_offset, self.log.end_offset, applied)

    def _new_replica(self, session: int, applied: int, floor: int, unsure: bool = False) -> Replica:
        return Replica(
            self.node_id, self.name, self.config, session=session, log_start=self.log.start_offset,
            log_end=self.log.end_offset, epoch_pairs=self.epoch_file.load(), applied=applied,
            incarnation=self.incarnation, applied_floor=floor, unsure=unsure,
        )

    # ------------------------------------------------------------------ called from other threads

    def start(self) -> None:
        self.task_thread.add(self)

    def post(self, item: InboxItem) -> None:
        """Hand ``item`` to the task thread; an append over the inbox's bound is refused (Backpressure) at once.

        A closed replica takes nothing more (no thread would ever drain it): an append gets the answer its
        waiting appends got when it closed, anything else is dropped (the worker replaces or closes it).
        """
        if self.closed.is_set():
            if isinstance(item, PendingEntry):
                fault = self.fault
                item.done(-1, None, ReplogError(f"{self.name}: the replica is closing") if fault is None
                          else ReplicaFailed(self.name, fault.kind, fault.reason))
            return
        if isinstance(item, PendingEntry):
            refused = self.inbox.put_append(item, self.config.max_unapplied_entries, self.config.max_unapplied_bytes)
            if refused is not None:
                item.done(-1, None, refused)
                return
        elif not self.inbox.put(item):
            return  # a peer message dropped (counted): the protocol resends it
        self.task_thread.wake_soon(self)  # (on the event loop: once its iteration is over, task_thread.LoopWakes)

    def stop(self) -> None:
        self._stop.set()
        self.task_thread.wake(self)
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.closed.wait(timeout=10)

    # ------------------------------------------------------------------------- the task thread

    def due_ms(self, now: int) -> int:
        """When this replica's loop must run next with nothing in its inbox (ticks, beats, dataflow, retention)."""
        if self._parked is not None:  # (its install's writes wake it; a parked replica has nothing else due)
            return now if self._parked.written else now + MAX_SLEEP_MS
        return next_wake_ms(now, self._next_tick, self.replica.next_tick_ms(), self.outbox.next_due(),
                            None if self.dataflow is None else self.dataflow.next_due_ms(now),
                            self._next_retain_ms if self._retain_owed else None, self._next_flow,
                            self.durability.next_sync_ms)

    def drain_inbox(self) -> list[InboxItem]:
        """Everything posted so far, without waiting (the task thread's step); nothing while parked."""
        return [] if self._parked is not None else self.inbox.drain()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def begin(self, items: list[InboxItem]) -> bool:
        """A drain of ``items`` up to its fsync (entries written and shipped); False once it stopped (disk closed).
        The rest is ``finish``: a shared task thread's pass overlaps its replicas' fsyncs (``TaskThread._pass``)."""
        return self._guarded(lambda: self._step_begin(items))

    @property
    def sync_owed(self) -> bool:
        """After ``begin``: the drain wrote entries that must be fsynced before they are acknowledged."""
        return self._dirty and not self.replica.config.acks_from_page_cache and self._parked is None

    def sync_ahead(self) -> None:
        """Any thread, between ``begin`` and ``finish``: the drain's fsync (conductor.worker.drain_sync)."""
        self.syncs.ahead(self.replica.config)

    def finish(self) -> bool:
        """The rest of the drain ``begin`` started (after ``sync_ahead``, if called); False as ``begin``."""
        return self._parked is not None or self._guarded(self._step_finish)  # (parked: nothing to finish)

    def _guarded(self, run: Callable[[], None]) -> bool:
        if self._stop.is_set():
            self._close_disk()
            return False
        try:
            run()
        except Exception as exc:
            failed = Fault(fault_kind(exc), describe(exc), time.time())
            log.error("%s: replica failed (%s): %s; it stops serving, gives up leadership and restarts",
                      self.name, failed.kind, failed.reason, exc_info=True)
        else:
            if self._stop.is_set():
                self._close_disk()
                return False
            return True
        # Out of the handler: the exception's frames (which hold RocksDB handles) are gone before the disk closes.
        self.fault = failed
        self.last_error = failed.reason
        self.waiting.fail_all(self.dataflow, ReplicaFailed(self.name, failed.kind, failed.reason))
        if self._on_fault is not None:
            self._on_fault(self)  # first: leadership moves while this disk closes (the restart waits for it)
        self._close_disk()
        return False

    def _step_begin(self, items: list[InboxItem]) -> None:
        if self._parked is not None and not self._parked.written:
            return  # (parked: its task thread is woken once the install's writes are over)
        if self._parked is not None:  # resumed: what waited first, then what came meanwhile
            p, self._parked = self._parked, None
            items = p.resumed(self.name, self._installed) + items + self.inbox.drain()
        now = self._step_now = now_ms()
        appends: list[PendingEntry] = []
        for i, item in enumerate(items):
            if isinstance(item, PendingEntry):
                appends.append(item)
            else:
                self._handle_item(item)
                if self._parked is not None:  # an install's writes run: the rest waits until it resumes
                    self._parked.held = [*appends, *items[i + 1:]]
                    return
        if self.dataflow is not None:  # envelopes that arrived: one entry with this drain's appends
            appends += [PendingEntry(request, 0, Ack.NONE, done) for request, done in self.dataflow.entries(now)]
        if appends:
            self._client_appends(appends)
        self._retain_owed = self._retain_owed or bool(items) or bool(appends)
        now = now_ms()
        tick_due = self.replica.next_tick_ms()
        if now >= self._next_tick and tick_due is not None and now >= tick_due:
            self._feed(Tick())
            self._next_tick = now + TICK_MS
        if self._dirty:
            self._ship(hold_acks=True)  # entries for followers leave before our own fsync, so theirs overlaps ours

    def _step_finish(self) -> None:
        now = self._step_now
        self._flush_if_dirty()
        self.durability.sync_if_due(now)
        self._ship()
        if self.outbox.beats:
            self._hand_over(self.outbox.due(now_ms()))
        self._apply_deferred()
        if self.dataflow is not None:
            self.dataflow.drained(now_ms())
            self._next_flow = now + TICK_MS
        if self._retain_owed and now >= self._next_retain_ms:
            self._next_retain_ms = now + RETAIN_INTERVAL_MS
            self._retain_owed = False
            self._retain()

    def report(self, exc: BaseException) -> None:
        """Any thread: a read found this replica's data damaged; the task thread stops on it (a fault)."""
        self.post(Fail(exc))

    def _handle_item(self, item: Ordered) -> None:
        match item:
            case RawReplicate():
                self._on_raw_replicate(item)
            case FarHorizonOffer():
                self._on_far_horizon_offer(item)
            case Inflow():
                if self.dataflow is not None:
                    self.dataflow.received(item)
            case Fail():
                raise item.error  # the replica's fault (step's handler stops it)
            case InstallCheckpoint():
                self._start_install(item)
            case AttachDataflow():
                self._attach(item)
            case MetastoreChanged():
                self._znode = item.state
                self._feed(item)
            case ConfigChanged():
                self.config = item.config
                self._feed(item)
            case ReplicateAck() if self.timings is not None:  # (a peer round trip ends)
                self._feed(self.timings.peer_acked(item, time.perf_counter()))
            case (ReplicateAck() | EpochRequest() | EpochResponse() | IsrChanged() | IsrChangeFailed()
                  | SessionExpired() | SessionStarted() | ResignRequested()):
                self._feed(item)
            case _:
                assert_never(item)

    def _attach(self, m: AttachDataflow) -> None:
        """Start the dataflow a newly prepared code version needs (none ran here before)."""
        if self.dataflow is None:
            m.bind()
            self.dataflow = m.driver
            m.driver.role(self.replica.role, self.replica.epoch)

    def _client_appends(self, ps: list[PendingEntry]) -> None:
        """Every append of one inbox drain becomes ONE state-machine append per ack level.

        One append means one log frame, one replication frame per follower and
        one reply to split, instead of one of each per request: this is what
        makes many small concurrent appends cheap (a run per ack level). Each request is still its own
        replog entry (its own change set), so they succeed or fail separately
        while building, and share the fate of the batch once appended.
        """
        # Consecutive runs of one ack level, in build order: entries must reach the log in the
        # order they were built, since each one builds on the ones before it.
        runs: list[tuple[Ack, list[tuple[PendingEntry, bytes | None]]]] = []
        # A resigning leader refuses appends (NotLeader): build nothing, so later runs are refused alike.
        leader = self.replica.accepts_appends
        offset = self.replica.log_end
        for p in ps:
            payload = None
            if leader:
                try:
                    builder, p.result = self.entries.build(p.request)
                    # Staged at once, so the next change set builds on this one (depot offsets, updates).
                    if builder is not None:
                        payload = self._stage(offset, builder)
                except REPLICA_FAULTS:
                    raise  # damaged data, a full disk: the replica's fault, not this request's
                except (ReplogError, PStateError, TopologyError, ValueError) as e:  # bad input or user code
                    p.done(-1, None, e)
                    continue
                except Exception as e:  # anything else building ONE entry fails that request alone
                    log.exception("%s: building an append's entry failed; that append is refused", self.name)
                    p.done(-1, None, AppendFailed(self.name, describe(e)))
                    continue
                if builder is None:
                    p.done(-1, p.result, None)
                    continue
                offset += 1
            if not runs or runs[-1][0] is not p.ack:
                runs.append((p.ack, []))
            runs[-1][1].append((p, payload))
        for i, (ack, group) in enumerate(runs):
            rid = self.waiting.add([p for p, _b in group])
            before = self.replica.log_end
            self._feed(ClientAppend(rid, len(group), sum(p.nbytes for p, _b in group), ack,
                                    data=[b for _p, b in group]))
            if leader and self.replica.log_end != before + len(group):
                # Refused (backpressure, lost leadership): its staged writes must go, and so must the
                # later runs, which were built on top of it.
                for _ack, later in runs[i + 1:]:
                    for p, _b in later:
                        p.done(-1, None, Backpressure(self.name, "an earlier append of the same batch was refused"))
                self._restage()
                return
            if self.timings is not None and leader:
                self.timings.built(before, [p.request for p, _b in group], time.perf_counter())

    def _stage(self, offset: int, builder: Any) -> bytes:
        """Stage one built entry, or refuse it (:class:`EntryTooLarge`, nothing staged) over max.entry.bytes."""
        payload: bytes = builder.encode()
        if len(payload) > self.config.max_entry_bytes:
            raise EntryTooLarge(self.name, "entry", len(payload), self.config.max_entry_bytes)
        return self.store.stage(offset, builder, payload)

    def _restage(self) -> None:
        """Rebuild the staged overlay from the log, the truth: exactly the entries appended, not applied."""
        self.store.drop_staged()
        start = self.store.applied_offset + 1
        if self.replica.is_leader and start < self.log.end_offset:
            tail = self.log.read_entries(start, self.log.end_offset)
            self.store.stage_inherited([(off, typ, payload) for off, _e, typ, payload in tail])

    def _on_raw_replicate(self, m: RawReplicate) -> None:
        epochs: tuple[int, ...] = ()
        if m.frames:
            scan = scan_frames(m.frames, expect_offset=m.start)
            if scan.error is not None:
                log.warning("%s: dropped a replication frame from %s at offset %d: %s (the leader resends)",
                            self.name, m.src, m.start, scan.error)
                return
            epochs = tuple(e for f in scan.frames for e in (f.epoch,) * f.entry_count)
        self._feed(Replicate(m.src, self.node_id, m.epoch, m.start, epochs, m.apply_offset, data=m.frames))

    def _feed(self, event: Event) -> None:
        for action in self.replica.handle(event, now_ms()):
            self._perform(action)

    def _flush_if_dirty(self) -> None:
        while self._dirty:
            # Entries for followers leave before our own fsync, so theirs overlaps ours.
            self._ship(hold_acks=True)
            self._dirty = False
            spent = self.syncs.take(self.replica.config)  # before anything is acknowledged
            if self.timings is not None and spent[0]:
                self.timings.flushed(self.replica.role.value, *spent)
            self.stats["flushes"] += 1
            self._feed(LocalFlushed(self.log.end_offset))

    # --------------------------------------------------------------------------------- actions

    def _perform(self, a: Action) -> None:
        match a:
            case AppendLocal():
                append_local(self.log, a, self.name)
                self._dirty = True
            case SendEntries():
                if self.timings is not None:
                    self.timings.peer_sent(a.dst, a.end, time.perf_counter())
                for m in self.reads.messages(self.log, self.node_id, a):
                    self.outbox.add(a.dst, m)
            case Send():
                self.outbox.add(a.msg.dst, a.msg)
            case Reply():
                self.waiting.reply(a, self.dataflow, self.stats, self.timings)
            case Apply():
                if self.replica.is_leader:
                    self._apply(a.up_to)  # before the Reply that follows: replies must see applied state
                else:
                    # Nobody reads a follower's store before its next drain: apply after this drain's
                    # fsync and acks, off the path of the leader's commit.
                    self._apply_later = max(self._apply_later, a.up_to)
            case Truncate():
                self._apply_deferred()
                log.warning("%s: truncating replog to offset %d (epoch reconciliation)", self.name, a.end)
                self.store.drop_staged()
                self.marks.lower_to(a.end)  # before the cut
                self.log.truncate(a.end)
                self.log.flush()
            case PersistEpochs():
                self.epoch_file.save(list(a.pairs))
            case ChangeIsr():
                self._change_isr(self, a.expected_version, a.new)
            case RecordStorage():
                self._record_storage(a)
            case HandOff():
                assert self._hand_off is not None, f"{self.name}: a hand-off needs the hand_off callback"
                log.warning("%s: handing leadership to %s (epoch %d -> %d)", self.name, a.new.leader,
                            a.new.epoch - 1, a.new.epoch)
                self._hand_off(self, a.expected_version, a.new)
            case RoleChanged():
                self._apply_deferred()
                log.warning("%s: now %s in epoch %d (leader %s)", self.name, a.role.value, a.epoch, a.leader)
                # Staged entries belong to a leadership. A new leader stages the tail it inherited
                # (appended in earlier epochs, not yet applied) so new change sets build on top of it.
                self._restage()
                if self.dataflow is not None:
                    self.dataflow.role(a.role, a.epoch)
                if self._on_role is not None:
                    self._on_role(self, a)
            case StartFarHorizon():
                log.warning("%s: follower %s needs entries this replog no longer keeps, or is more than "
                            "replication.max.near.sync.message.lag entries behind: offering it a checkpoint",
                            self.name, a.follower)
                self.outbox.add(a.follower, FarHorizonOffer(self.node_id, a.epoch))
            case Removed():
                log.warning("%s: no longer a replica of the group (znode version %d): closing it and %s", self.name,
                            a.version, "keeping its data (a retired copy)" if a.retired else "deleting its data")
                self.removed, self.retired = True, a.retired
                self._stop.set()
            case _:
                assert_never(a)

    def _record_storage(self, a: RecordStorage) -> None:
        """Record this storage's incarnation in the group znode (the state machine's CAS, as a ChangeIsr's)."""
        me, new = self.node_id, a.new
        if new.incarnation_of(me) == STORAGE_LOST:
            log.error("%s: storage lost acknowledged entries and this is the last in-sync replica: marking it "
                      "lost in the group znode; the group stalls until its data is restored", self.name)
        elif me in (self._znode.isr if self._znode is not None else ()) and me not in new.isr:
            log.warning("%s: leaving the ISR%s before serving anything: %s; it rebuilds from the leader",
                        self.name, " and the leadership" if new.leader is None else "",
                        self.storage_lost or "its storage is new (the directory was emptied or replaced) while "
                                             "the group records the storage it had")
        else:
            log.info("%s: recording storage incarnation %016x under session %x", self.name, self.incarnation,
                     self.replica.session)
        self._change_isr(self, a.expected_version, new)

    def _ship(self, hold_acks: bool = False) -> None:
        """Hand the drain's peer messages to the transport in one call (one event-loop wake-up, not one each).

        What waits (acks before an fsync, a leader's beats) is :class:`replog.outbox.Outbox`'s decision.
        """
        self._hand_over(self.reads.handed(self.outbox.take(now_ms(), self.replica.is_leader, hold_acks)))

    def _hand_over(self, out: list[tuple[str, Any]]) -> None:
        if not out:
            return
        try:
            self._send(self.module, self.group, out)
        except Exception:  # the transport is closing: the protocol resends what matters
            log.debug("%s: could not hand %d message(s) to the transport", self.name, len(out), exc_info=True)

    def _apply_deferred(self) -> None:
        if self._apply_later >= 0:
            up_to, self._apply_later = self._apply_later, -1
            self._apply(up_to)

    def _apply(self, up_to: int) -> None:
        applied = self.store.applied_offset
        if up_to <= applied:
            return
        entries = [(off, typ, payload) for off, _epoch, typ, payload in self.log.read_entries(applied + 1, up_to + 1)]
        flow = self.dataflow.applying() if self.dataflow is not None and self.replica.is_leader else None
        t0 = time.perf_counter()
        self.store.apply_entries(entries, flow)
        if self.timings is not None and entries:
            self.timings.applied(self.replica.role.value, entries[0][0], entries[-1][0], t0, time.perf_counter())
        self.stats["entries_applied"] += len(entries)
        # The applied floor, in the page cache at once (a SIGKILL keeps it), durable with the next flush.
        assert self.marks.current is not None
        self.marks.update(applied=max(self.marks.current.applied, up_to), sync=False)

    def _close_disk(self) -> None:
        if self._parked is not None:  # (its writes end first)
            self._parked.settle(self.name)
            self._parked = None
        try:
            self.waiting.fail_all(self.dataflow, ReplogError(f"{self.name}: the replica is closing"))
            self.log.flush()
            self.log.close()
            if self.fault is None:
                self.marks.update(clean=True)
        except Exception:
            if self.fault is None:
                raise
            log.warning("%s: closing the failed replica's replog: %s", self.name, self.log, exc_info=True)
        finally:
            try:
                self.marks.close()
            finally:
                try:
                    if self.fault is None:
                        self.store.close()
                    else:  # (its flush may be what failed; the replog replays what the memtables held)
                        self.store.abandon()
                finally:
                    if self.removed and not self.retired:  # (a retired copy: ReplicaMembership deletes it)
                        shutil.rmtree(self.dir, ignore_errors=True)
                    self.closed.set()

    # ------------------------------------------------------------------------ retention

    def _retain(self) -> None:
        """Delete whole replog segments below the state machine's retention point.

        The point depends on the applied offset the store holds *durably*; with
        RocksDB's WAL off that takes a flush, so one is made only when a whole
        segment would go (about once per segment written), never per check.
        """
        segments = self.log.segments()
        if len(segments) < 2 or self.replica.retention_point(self.store.applied_offset) < segments[1].base_offset:
            return
        self.store.flush()
        point = self.replica.retention_point(self.store.applied_offset)
        freed = self.log.delete_segments_below(point)
        if freed:
            self.stats["replog_deleted_bytes"] += freed
            self._feed(LogStartAdvanced(self.log.start_offset))
            log.info("%s: retention deleted %.1f MB of replog below offset %d (log now [%d, %d))", self.name,
                     freed / 1e6, self.log.start_offset, self.log.start_offset, self.log.end_offset)

    # ------------------------------------------------------------------------ far horizon

    def _on_far_horizon_offer(self, m: FarHorizonOffer) -> None:
        if self.replica.far_horizon_refusal(m.src, m.epoch) is not None:
            return  # from a leadership that is over (or we have not caught up with the epoch yet)
        if self.catchup is not None and self.catchup.running:
            return
        if self._on_far_horizon is not None:
            self._on_far_horizon(self, m.src, m.epoch)

    def checkpoint_for_transfer(self, directory: Path) -> tuple[Manifest, list[tuple[int, int]], int]:
        """Leader, any thread: a checkpoint of the applied state, its epoch history, and the log end now.

        Safe off the task thread: the store checkpoints under its own lock, and
        the epoch cache never changes at or below the applied offset.
        """
        log_end = self.replica.log_end
        manifest = self.store.checkpoint(directory, self.replica.epoch)
        pairs = [(e, s) for e, s in self.replica.epochs.to_pairs() if s <= manifest.applied_offset]
        return manifest, pairs, log_end

    def _start_install(self, m: InstallCheckpoint) -> None:
        """Task thread: install a fetched checkpoint (verified and opened off this thread: store_swap) if the
        driver contract allows it, its writes on an install thread while this replica is parked."""
        began = time.perf_counter()
        try:
            if checkpoint_install.refused(m, self.replica, self._znode, self.node_id):
                return
            self._apply_later = -1
            self.outbox.clear()
            self.store.drop_staged()
        except Exception as e:
            m.done.set_exception(e)
            return
        writes = functools.partial(checkpoint_install.durable_steps, self.epoch_file, self.marks, self.store,
                                   self.log, m)
        self._parked = checkpoint_install.start(m, began, writes, lambda: self.task_thread.wake(self))

    def _installed(self, upto: int) -> None:
        """Task thread, an install's writes over (ParkedInstall.resumed): the replica's new state machine."""
        r = self.replica
        self.replica = self._new_replica(r.session, upto, upto)
        self.stats["far_horizon_installs"] += 1
        if not r.session_ok:
            self._feed(SessionExpired())
        if self._znode is not None:
            self._feed(MetastoreChanged(self._znode))

    # ------------------------------------------------------------------------ introspection

    @property
    def replicas(self) -> tuple[str, ...] | None:
        """The group's replicas as this replica last learnt them (None before it learnt any); any thread."""
        st = self._znode
        return None if st is None else tuple(st.replicas)
