"""Who leads a task group: the election rule, shared by the conductor and the simulator (pure).

Nothing here talks to ZooKeeper. The conductor reads the metastore, asks these
functions what the next state should be, and writes it back with a versioned
compare-and-set; the simulator (``tests/sim``) calls the same functions, so the
rule it checks is the rule that runs.

Safety rules (docs/replication.md, Election):

* a leader is only ever chosen from ISR ∩ live nodes, never from the OSR
  (no unclean election: an OSR member may lack applied entries);
* every change of leadership, including to "no leader", bumps the epoch so a
  deposed leader's messages are fenced;
* only *eligible* ISR members are elected: not one whose storage lost entries
  it acknowledged (``replog.eligibility``; KIP-966's eligible leader replicas);
* *sure* members first: one unsure of its log (a power loss during a flush, or
  a lost tail: ``replog.eligibility``) only when no sure ISR or ELR member can
  lead and every ISR and ELR member registered its log in this leaderless
  epoch, as the most up-to-date of them (:func:`_elect_unsure`);
* if no eligible ISR member is live, an eligible *ELR* member is elected
  (``GroupState.elr``: a leader deposed by a failover, while nothing was
  applied since, holds every applied entry; KIP-966); failing that the group
  stays leaderless, keeping its ISR, until an ISR member returns;
* during a reassignment (``replog.reassignment``) a replica being removed is
  elected only when no other in-sync replica can lead: it holds every applied
  entry, so electing it is safe, but the plan would have to move leadership
  off it again before removing it; an added replica is electable once it is
  in the ISR (it then holds every applied entry), never before;
* a new state carries the znode version it will have once written (the read
  one plus one), as the replication state machine's proposals do;
* leadership is bound to the ZooKeeper session of the elected node
  (``leader_session``): a node that restarted under the same id but a new
  session may have lost its unflushed tail, so it does not silently keep
  leading; the conductor treats it like a lost leader.

"Live" is given either as node ids or as a mapping node id -> session id (the
``ephemeralOwner`` of ``/millrace/nodes/<id>``); only the mapping lets the
session check happen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from replog.eligibility import eligible, most_up_to_date, sure, without_doubt
from replog.messages import STORAGE_LOST, GroupState, InvalidGroupState


def live_sessions(live_nodes: Iterable[str] | Mapping[str, int]) -> dict[str, int]:
    """Normalise "live" to node -> session id (0 = unknown, which disables the session check)."""
    if isinstance(live_nodes, Mapping):
        return {str(k): int(v) for k, v in live_nodes.items()}
    return dict.fromkeys(live_nodes, 0)


def leader_alive(state: GroupState, live_nodes: Iterable[str] | Mapping[str, int]) -> bool:
    """True if the leader is live under the session it was elected in (when both sessions are known)."""
    live = live_sessions(live_nodes)
    if state.leader is None or state.leader not in live:
        return False
    now = live[state.leader]
    return state.leader_session == 0 or now == 0 or now == state.leader_session


def elect_leader(state: GroupState, live_nodes: Iterable[str] | Mapping[str, int],
                 exclude: Iterable[str] = (), disallowed: Iterable[str] = (),
                 order: Sequence[str] = ()) -> str | None:
    """The new leader: the first replica (in preference order) that is in the ISR, eligible and live.

    The preference order is the placement (``state.replicas``) unless ``order``
    gives another (the simulator passes a random one to explore every choice).

    Never an OSR member: it may lack entries that were already applied, so
    electing it would lose acknowledged writes; never a member whose storage
    is lost or not confirmed under its live session (``replog.eligibility``).
    None if no ISR member qualifies.
    Nodes drained of leadership (``disallowed``) are taken only when no allowed
    ISR member is live: availability beats the drain; replicas a reassignment
    removes come last of all, for the same reason.
    """
    return _pick(state, state.isr, live_nodes, exclude, disallowed, order)


def _pick(state: GroupState, pool: Iterable[str], live_nodes: Iterable[str] | Mapping[str, int],
          exclude: Iterable[str], disallowed: Iterable[str], order: Sequence[str]) -> str | None:
    """The first live, eligible member of ``pool`` in preference order, drained nodes next to last, replicas
    being removed last."""
    sessions = live_sessions(live_nodes)
    live = set(sessions) - set(exclude)
    members = set(pool)
    candidates = [node for node in (order or state.replicas) if node in members and node in live
                  and eligible(state, node, sessions[node]) and sure(state, node)]
    banned, leaving = set(disallowed), set(state.removing)
    tiers = ([n for n in candidates if n not in banned and n not in leaving],
             [n for n in candidates if n not in leaving], candidates)
    pick = next((tier for tier in tiers if tier), [])
    return pick[0] if pick else None


def next_leadership(state: GroupState, live_nodes: Iterable[str] | Mapping[str, int],
                    disallowed: Iterable[str] = (), order: Sequence[str] = ()) -> GroupState | None:
    """The state after reacting to the live set, or None if nothing must change.

    * leader lost (dead, or restarted under a new session), another ISR member
      live: that member leads; the old leader moves to the OSR (it must catch
      up before rejoining); epoch + 1.
    * leader restarted and no other ISR member is live: it is elected again
      under its new session (it is in the ISR, so this is a clean election), epoch + 1.
    * leader dead, no ISR member live: leaderless, ISR kept as it is (only those
      replicas hold every applied entry), epoch + 1 to fence the old leader.
    * leaderless and an ISR member is live again: it leads, epoch + 1.
    * no ISR member can lead (down, unconfirmed, or its storage lost) but an
      ELR member can: it leads and joins the ISR (:func:`_elect_from_elr`).

    A leader lost to a failover that leaves at most one live, confirmed
    in-sync replica joins the ELR as it leaves the ISR: it holds every entry applied so far, and nothing more
    is applied until the next leader's first CAS empties the ELR
    (``replog.replica_leader``; see :func:`_elr_after_failover`).

    Dead followers are left alone: the leader moves them to the OSR itself,
    because only it knows whether the ISR may shrink without going below min-ISR.
    Elections prefer nodes not in ``disallowed``, then follow ``order`` (see ``elect_leader``).
    """
    live = live_sessions(live_nodes)
    if leader_alive(state, live):
        return None
    if state.leader is None:
        new_leader = elect_leader(state, live, disallowed=disallowed, order=order)
        if new_leader is None:
            return _elect_from_elr(state, live, disallowed, order) or _elect_unsure(state, live, disallowed, order)
        return replace(state, leader=new_leader, epoch=state.epoch + 1, version=state.version + 1,
                       leader_session=live[new_leader])
    old = state.leader
    new_leader = elect_leader(state, live, exclude=[old], disallowed=disallowed, order=order)
    if new_leader is not None:
        return replace(
            state,
            leader=new_leader,
            epoch=state.epoch + 1, version=state.version + 1,
            isr=tuple(x for x in state.isr if x != old),
            osr=tuple(x for x in state.replicas if x == old or x in state.osr),
            elr=_elr_after_failover(state, old, [x for x in state.isr if x != old], live),
            leader_session=live[new_leader],
        )
    if old in live and eligible(state, old, live[old]) and sure(state, old):  # restarted, the only live in-sync one
        return replace(state, epoch=state.epoch + 1, version=state.version + 1, leader_session=live[old])
    from_elr = _elect_from_elr(state, live, disallowed, order)
    if from_elr is not None:
        return from_elr
    return replace(state, leader=None, epoch=state.epoch + 1, version=state.version + 1, leader_session=0)


def _elr_after_failover(state: GroupState, old: str, isr_left: Iterable[str], live: dict[str, int]) -> tuple[str, ...]:
    """The ELR once a failover removed ``old`` from the ISR, leaving ``isr_left``.

    ``old`` joins when at most one of the members left is a live copy the
    conductor could elect (live and confirmed under its session): that lone
    copy is a single point of failure, worth the new leader's CAS before it
    applies. Counting live copies, not members, matters: a member that is down
    may have lost its disk without the znode knowing yet, and the live one may
    have just quarantined its storage without having recorded it (sim seed
    9414234: d, the only intact copy, left for the OSR behind b and a dead c,
    both already lost, and the group stalled). With two or more live copies,
    losing every one is a multiple fault, the group stalls as without an ELR,
    and the new leader applies at once (its first apply does not wait on its
    own ZooKeeper connection, which a lost host may just have broken: the
    multi-host failover test caught that wait).
    """
    if old in state.elr:
        return state.elr
    copies = [x for x in isr_left if x in live and eligible(state, x, live[x]) and sure(state, x)]
    if len(copies) > 1:
        return state.elr
    return (*state.elr, old)


def _elect_from_elr(state: GroupState, live: dict[str, int], disallowed: Iterable[str],
                    order: Sequence[str]) -> GroupState | None:
    """The state electing an ELR member because no ISR member can lead; None if none can either.

    The ELR member holds every applied entry (see :func:`next_leadership`), so
    it leads and joins the ISR. The ISR members that still hold every applied
    entry stay; one whose storage is lost leaves for the OSR (it rebuilds from
    the new leader); a lost leader leaves for the OSR and joins the ELR, as in
    any failover. The epoch is bumped, fencing the old leadership.
    """
    pick = _pick(state, state.elr, live, (), disallowed, order)
    if pick is None:
        return None
    old = state.leader
    keep = {x for x in state.isr if x != old and state.incarnation_of(x) != STORAGE_LOST} | {pick}
    elr = tuple(x for x in state.elr if x != pick)
    if old is not None:
        elr = _elr_after_failover(replace(state, elr=elr), old, keep, live)
    return replace(
        state, leader=pick, epoch=state.epoch + 1, version=state.version + 1,
        isr=tuple(x for x in state.replicas if x in keep),
        osr=tuple(x for x in state.replicas if x not in keep),
        elr=elr, leader_session=live[pick],
    )


def _elect_unsure(state: GroupState, live: dict[str, int], disallowed: Iterable[str],
                  order: Sequence[str]) -> GroupState | None:
    """The state electing the most up-to-date unsure member (``replog.eligibility.most_up_to_date``) when no sure
    one can lead; None while some ISR or ELR member has not registered its log in this leaderless epoch.

    The one elected holds every applied entry, so its record is dropped in the same write; an ELR member elected
    so joins the ISR as in :func:`_elect_from_elr`.
    """
    best = most_up_to_date(state, live)
    if not best:
        return None
    pick = _pick(replace(state, unsure=()), best, live, (), disallowed, order)
    assert pick is not None, (state, best)
    keep = {x for x in state.isr if state.incarnation_of(x) != STORAGE_LOST} | {pick}
    isr = tuple(x for x in state.replicas if x in keep)
    return replace(state, leader=pick, epoch=state.epoch + 1, version=state.version + 1, leader_session=live[pick],
                   isr=isr, osr=tuple(x for x in state.replicas if x not in isr),
                   elr=tuple(x for x in state.elr if x != pick), unsure=without_doubt(state, pick))


def leaderless_reason(state: GroupState, live_nodes: Iterable[str] | Mapping[str, int]) -> str | None:
    """Why a group has no (live) leader, in words for `conductor status`; None if it is led."""
    live = live_sessions(live_nodes)
    if leader_alive(state, live):
        return None
    if state.leader is not None and state.leader in live:
        return (f"leader {state.leader} restarted under a new ZooKeeper session; the conductor re-elects "
                "a leader shortly")
    live_osr = [x for x in state.osr if x in live]
    lost = [x for x in state.isr if state.incarnation_of(x) == STORAGE_LOST]
    if lost and state.elr:
        return (f"no intact in-sync replica: {lost} lost entries it had acknowledged; eligible leader "
                f"replica(s) {list(state.elr)} hold every applied entry and one is elected once live "
                "and confirmed")
    if lost:  # only ever the last ISR member: the others leave the ISR instead
        return (f"no intact in-sync replica: {lost} lost entries it had acknowledged (its storage was replaced "
                "or damaged) and is never elected; the group stalls (writes it acknowledged may be lost: "
                "restore its data)")
    unconfirmed = unconfirmed_members(state, live)
    doubted = [x for x in state.isr + state.elr if not sure(state, x) and x in live]
    if doubted:
        waiting = [x for x in state.isr + state.elr if x not in lost and x not in doubted]
        return (f"replica(s) {doubted} may lack entries they acknowledged (a power loss during a flush, or a lost "
                "tail); the most up-to-date in-sync replica is elected once every one has registered its log"
                + (f" (waiting for {waiting})" if waiting else ""))
    if unconfirmed:
        return (f"in-sync replica(s) {unconfirmed} are live but have not confirmed their storage since they "
                "(re)started; the conductor elects one once it has")
    why = f"no in-sync replica is live (ISR {list(state.isr)} all down)"
    if live_osr:
        why += f"; OSR member(s) {live_osr} are live but may lack applied entries, so they are never elected"
    return why + "; the group waits for an ISR member to return"


def unconfirmed_members(state: GroupState, live_nodes: Iterable[str] | Mapping[str, int]) -> list[str]:
    """Live ISR members not electable only because they have not confirmed their storage under their session
    yet (they do so within a metastore round trip of starting): worth electing again shortly."""
    live = live_sessions(live_nodes)
    return [x for x in state.isr + state.elr if x in live and state.incarnation_of(x) != STORAGE_LOST
            and not eligible(state, x, live[x])]


def switch_leader(state: GroupState, to: str, session: int = 0) -> GroupState:
    """Hand leadership to an in-sync replica (balancing or a resign) under ``session``, bumping the epoch."""
    if to not in state.isr or not sure(state, to):
        raise InvalidGroupState(f"cannot hand leadership to {to}: not a sure member of the ISR {list(state.isr)} "
                                f"(unsure: {[r[0] for r in state.unsure]})")
    return replace(state, leader=to, epoch=state.epoch + 1, version=state.version + 1, leader_session=session)


def abdicate(state: GroupState, node: str, live_nodes: Iterable[str] | Mapping[str, int],
             disallowed: Iterable[str] = ()) -> GroupState | None:
    """The state after leader ``node`` gives up leadership because of a fault; None if it does not lead.

    The worker writes it with a versioned compare-and-set (on a conflict it
    re-reads and asks again, so a stale answer is never written). Guarantees:

    * ``node`` no longer leads, and the epoch is bumped, so whatever it still
      sends is fenced;
    * ``node`` leaves the ISR (to the OSR: it rejoins only by catching up from
      the next leader) when another ISR member remains, since the ISR never
      becomes empty; the remaining members hold every applied entry, so no
      acknowledged write is lost by the move;
    * the next leader is elected by the same rule as a failover
      (:func:`elect_leader`: ISR ∩ live, ``node`` excluded) in the same CAS; if
      no other ISR member is live, the group is leaderless until one returns.
      If ``node`` is the only ISR member it stays in the ISR (it alone holds
      every applied entry) and the group is leaderless: the conductor's next
      election may pick it again once it has restarted.
    """
    if state.leader != node:
        return None  # stale: leadership already moved on
    live = live_sessions(live_nodes)
    successor = elect_leader(state, live, exclude=[node], disallowed=disallowed)
    others = tuple(x for x in state.isr if x != node)
    if not others:
        return replace(state, leader=None, epoch=state.epoch + 1, version=state.version + 1, leader_session=0)
    return replace(
        state,
        leader=successor,
        epoch=state.epoch + 1, version=state.version + 1,
        isr=others,
        osr=tuple(x for x in state.replicas if x == node or x in state.osr),
        leader_session=live[successor] if successor is not None else 0,
    )
