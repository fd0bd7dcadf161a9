"""Whether a replica's storage still holds what it acknowledged, and what the group znode says about it (pure).

An ISR member promises every applied entry. A replica whose storage lost some
of what it acknowledged (a replaced disk, a tail a lying disk dropped, damage
found on read and quarantined) no longer keeps that promise, yet its node id
is still in the ISR: electing it loses acknowledged writes (Kafka's KIP-966
eligible leader replicas and KIP-903 broker incarnation ids fix the same
hole). The rules:

* **Storage marks** (kept by the driver beside the epoch file, fsynced): the
  storage's *incarnation* (a random id made with the storage directory), the
  highest offset it *acknowledged* (in ``always`` mode: the flushes reported
  before the last marks write), the flush in flight that write *claimed*
  (synced beside the log's fsync, before the flush is reported, so the claim
  never trails an ack), and the offset of
  a far-horizon checkpoint whose install is in progress. :func:`check_storage`
  tells at open whether the storage lost anything acknowledged; if it did (or
  the marks themselves are damaged) the driver gives it a *new* incarnation.
* **Registration**: the group znode records each replica's incarnation and the
  ZooKeeper session that recorded it. A replica acknowledges, applies and
  leads nothing until the znode records its current incarnation
  (:func:`record_storage`, one versioned CAS), and confirms it under every new
  session: the conductor elects only replicas whose record names their live
  session, so it never elects a restarted replica before it has checked its
  storage (KIP-903's incarnation ids, registered with each broker session). A replica
  that never registered never acknowledged anything, so a fresh storage is
  simply recorded; one whose recorded incarnation differs lost what the old
  one acknowledged, so it leaves the ISR (and the leadership, with an epoch
  bump) in the same write, and rejoins only the usual way: by catching up
  from the leader (near or far horizon) until the leader re-admits it.
* **Eligibility**: if such a replica is the last ISR member it cannot leave
  (the ISR never empties), so it is marked :data:`STORAGE_LOST` and is never
  elected (:func:`eligible`): the group stalls with that reason instead of
  electing an empty replica.
* The leader counts only acks carrying the incarnation the znode records, and
  forgets what it knew about a follower whose incarnation changes.
* **Unsure storage** (``replication.fsync=always`` with the marks written beside
  the log, not after it: docs/data-on-disk.md). Each flush's marks write
  *claims* the flush in flight (``claimed``) while ``acked`` covers only the
  flushes reported before it. A log ending below ``acked`` lost what it
  acknowledged; one ending at or below ``claimed`` only may have
  (:func:`storage_unsure`): a power loss during that flush (nothing of it was
  acknowledged) looks the same as a lying disk that dropped the acknowledged
  tail. Such a replica takes a new incarnation (the leader forgets its acks)
  but stays in the ISR (or ELR), its record in the znode's ``unsure`` carrying
  its log's last epoch and end (:func:`record_storage` with ``log``). It is not
  elected like a sure member (:func:`sure`); it is elected only when no sure
  member can be and every ISR and ELR member registered its log in the current
  leaderless epoch, as the most up-to-date of them (Raft's rule:
  :func:`most_up_to_date`), since an intact member holds every applied entry
  and a member that lost some has a log that is a strict prefix of the applied
  entries. A leader drops a follower's record once it holds the leader's whole
  log (``replog.replica_leader``); the election drops the one it elects.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from replog.messages import STORAGE_LOST, GroupState
from replog.retirement import confirmed


@dataclass(frozen=True, slots=True)
class StorageMarks:
    """What a replica's storage says about itself (see the module docstring)."""

    incarnation: int
    #: highest offset ever acknowledged (reported durable) from this storage; -1 = none
    acked: int = -1
    #: offset of a far-horizon checkpoint being installed, -1 = none
    installing: int = -1
    #: the replica closed cleanly (the last thing it wrote)
    clean: bool = False
    #: the applied floor: the highest offset this storage ever applied, -1 = none. The store may come back
    #: below it after a crash (its un-flushed state is lost); entries up to it were committed, so the
    #: replica re-applies them at open whatever the ISR (Replica's ``applied_floor``)
    applied: int = -1
    #: ``replication.fsync=interval``: it may have acknowledged entries that were in the page cache only
    #: (written, fsynced, before the first such acknowledgement)
    volatile: bool = False
    #: the machine's boot (an id of the running kernel) when ``volatile`` was written: the page cache dies with it
    boot: int = 0
    #: marks written beside the log's fsync (``always``): the last offset of the flush in flight when they were
    #: written (``acked`` then covers the flushes reported before it); -1: none claimed
    claimed: int = -1

    def __post_init__(self) -> None:
        assert self.incarnation > STORAGE_LOST, f"an incarnation is a positive id, got {self.incarnation}"


#: the boot id where the kernel does not say one (conductor.worker.durability.machine_boot)
UNKNOWN_BOOT = 0


def check_storage(marks: StorageMarks | None, *, log_end: int, applied: int, boot: int = 0) -> str | None:
    """Why this storage lost entries it acknowledged, or None if it holds them all.

    ``log_end`` is the recovered log's end, ``applied`` the store's durable
    applied offset; the applied floor (``marks.applied``) must be in the log
    too, since it is re-applied from there. No marks means a new storage
    directory (nothing recorded, nothing acknowledged from it). A store ahead
    of the log is the one state a far-horizon install interrupted between the
    store swap and the log reset leaves behind (``installing`` set): finishing it (log restarts after
    ``applied``) loses nothing; without that mark the log lost applied entries.

    **The page-cache rule** (``replication.fsync=interval``, KIP-966's unclean shutdown): a storage that may
    have acknowledged entries from the page cache (``volatile``), did not close cleanly, and opens under
    another ``boot`` of the machine (a power loss, a kernel crash, a reboot: the page cache is gone) counts
    as lost, whatever its other marks say (they were in the page cache too). It gets a new incarnation, so
    it is not elected and leaves the ISR until it has caught up from the leader and been re-admitted. A
    killed process under the same boot lost nothing: the kernel still holds and writes back its page cache.
    Where the kernel gives no boot id (``UNKNOWN_BOOT``) a kill cannot be told from a power loss, so every
    unclean restart of such a storage counts as lost (a rebuild from the leader, never a lost entry).
    """
    if marks is None:
        return None
    if marks.volatile and not marks.clean and (boot == UNKNOWN_BOOT or marks.boot != boot):
        return ("it acknowledged entries from the page cache (replication.fsync=interval) and the machine "
                "restarted without a clean shutdown: what it acknowledged may be lost")
    end = log_end
    if marks.installing >= 0 and applied >= log_end:
        end = applied + 1  # the install is finished by resetting the log after the checkpoint
    if applied >= end:
        return f"the replog ends at offset {log_end} but the store applied up to {applied}: the replog lost entries"
    if marks.applied >= end:
        return (f"it applied entries up to offset {marks.applied} but its replog ends at offset {log_end}: "
                "the replog lost applied entries")
    if marks.acked >= end:
        return (f"it acknowledged entries up to offset {marks.acked} but its replog ends at offset {log_end}: "
                "the tail it acknowledged was lost")
    return None


def storage_unsure(marks: StorageMarks | None, *, log_end: int) -> bool:
    """The log may lack entries this storage acknowledged, or may not: it ends at or below the flush its marks
    claimed (``check_storage`` found nothing lost below ``acked``). A power loss during that flush leaves this
    state with nothing lost; so does a lying disk that dropped the flush after it was acknowledged."""
    return marks is not None and marks.claimed >= log_end


def unsure_of(state: GroupState, node: str) -> tuple[int, int, int] | None:
    """``node``'s unsure record: its log's last epoch and end, and the znode epoch they were registered in."""
    return next(((r[1], r[2], r[3]) for r in state.unsure if r[0] == node), None)


def sure(state: GroupState, node: str) -> bool:
    """The znode does not doubt ``node``'s log (no unsure record)."""
    return all(r[0] != node for r in state.unsure)


def without_doubt(state: GroupState, node: str) -> tuple[tuple[str, int, int, int], ...]:
    """The unsure records with ``node``'s dropped (for a ``replace``: the leader, or the election, vouches for it)."""
    return tuple(r for r in state.unsure if r[0] != node)


def most_up_to_date(state: GroupState, live: dict[str, int]) -> list[str] | None:
    """The members an election may pick when no sure member can lead: the ISR and ELR members (but those marked
    lost) with the most up-to-date logs (highest last epoch, then longest), if every one of them is live, confirmed
    under its session and registered its log in this leaderless epoch; None while one has not.

    Why the first of them holds every applied entry: an applied entry was held by every ISR member, so an intact
    member holds them all, and a member that lost some (a lying disk) holds a strict prefix of them, which is
    less up to date than the intact member's log (a lower last epoch, or the same one and a shorter log).
    """
    if state.leader is not None or state.retired:
        return None  # (a leader's followers still change their logs; retired copies are taken back instead)
    pool = [m for m in state.isr + state.elr if state.incarnation_of(m) != STORAGE_LOST]
    logs = {}
    for m in pool:
        doubt = unsure_of(state, m)
        if m not in live or not eligible(state, m, live[m]) or doubt is None or doubt[2] != state.epoch:
            return None
        logs[m] = doubt[:2]
    if not logs:
        return None
    best = max(logs.values())
    return [m for m in pool if logs[m] == best]


def record_storage(state: GroupState, node: str, incarnation: int, session: int,
                   log: tuple[int, int] | None = None) -> GroupState | None:
    """The znode recording ``node``'s storage ``incarnation`` under ``session``; None when there is nothing to write.

    * already recorded under this session: None;
    * recorded under another session (the replica restarted, or renewed its
      session, with its storage intact): the session is updated;
    * never recorded, or ``node`` is outside the ISR: recorded (nothing it
      acknowledged is promised by the ISR); an ELR member recorded with another
      incarnation leaves the ELR (what it held is gone);
    * recorded differently (the storage was replaced or lost entries) and
      ``node`` in the ISR: it leaves the ISR for the OSR, and the leadership if
      it had it (epoch + 1, so whatever it sent before is fenced); the
      remaining members hold every applied entry;
    * the same, but ``node`` is the last ISR member: it stays (the ISR never
      empties) marked STORAGE_LOST, leaderless, never elected; None if it is
      marked so already.

    While a plan's retired copies are kept (:mod:`replog.retirement`), a
    replica on the znode's ``reconfirming`` list records its storage again
    even if recorded under this session: the write takes it off the list
    (unless it marks it lost, or unsure), and releases the copies if it was the last.

    ``log`` (last epoch, log end) says the replica is unsure of its log
    (:func:`storage_unsure` at open, or the znode's record): an ISR or ELR
    member stays where it is with an unsure record, leaving only the
    leadership (epoch + 1); the record is written again under each new session
    and in each new leaderless epoch, with the log as it is then.
    """
    assert incarnation > STORAGE_LOST, incarnation
    recorded = state.incarnation_of(node)
    if log is not None and recorded not in (None, STORAGE_LOST) and (node in state.isr or node in state.elr):
        return _record_unsure(state, node, incarnation, session, log)
    if recorded == incarnation and state.storage_session(node) == session and node not in state.reconfirming:
        return None
    if recorded in (None, incarnation) or node not in state.isr:
        elr = state.elr if recorded == incarnation else tuple(x for x in state.elr if x != node)
        return confirmed(replace(state, version=state.version + 1, elr=elr,
                                 storage=state.with_storage(node, incarnation, session)), node)
    others = tuple(x for x in state.isr if x != node)
    if not others and recorded == STORAGE_LOST and state.leader != node:
        return None
    change: dict[str, object] = {"version": state.version + 1}
    if others:
        change.update(isr=others, osr=tuple(x for x in state.replicas if x == node or x in state.osr),
                      storage=state.with_storage(node, incarnation, session))
    else:
        change.update(storage=state.with_storage(node, STORAGE_LOST, session))
    if state.leader == node:
        change.update(leader=None, leader_session=0, epoch=state.epoch + 1)
    return confirmed(replace(state, **change), node)  # type: ignore[arg-type]


def _record_unsure(state: GroupState, node: str, incarnation: int, session: int,
                   log: tuple[int, int]) -> GroupState | None:
    """``record_storage`` of an unsure ISR or ELR member (see there); None when the znode says it all already."""
    doubt = unsure_of(state, node)
    fresh = doubt is not None and (state.leader is not None or doubt[2] == state.epoch)
    if (state.incarnation_of(node), state.storage_session(node)) == (incarnation, session) and fresh:
        return None
    change: dict[str, object] = {"version": state.version + 1,
                                 "storage": state.with_storage(node, incarnation, session)}
    epoch = state.epoch
    if state.leader == node:
        epoch += 1
        change.update(leader=None, leader_session=0, epoch=epoch)
    change["unsure"] = (*without_doubt(state, node), (node, *log, epoch))
    return replace(state, **change)  # type: ignore[arg-type]


def eligible(state: GroupState, node: str, session: int = 0) -> bool:
    """``node`` may be elected leader as far as its storage goes (ISR membership and liveness aside).

    It must have recorded intact storage under its current ``session`` (0:
    unknown, not checked), so a replica that restarted is elected only once it
    confirmed its storage. A group whose znode records no storage at all
    (created before these records) is not checked.
    """
    if not state.storage:
        return True
    inc = state.incarnation_of(node)
    if inc is None or inc == STORAGE_LOST:
        return False
    return session == 0 or state.storage_session(node) == session
