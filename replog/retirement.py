"""Retired copies: what a plan's last write removes is kept until the replicas it keeps confirm their storage (pure).

The window this closes. A replica that finds damage while it runs reopens in
place, under the same ZooKeeper session, with a new storage incarnation; until
its ``RecordStorage`` write lands, the group znode still records its old storage
under its live session, so it looks live and confirmed. A plan whose last write
(the completion of :func:`replog.reassignment.advance_reassignment`, or a
cancel) lands in that window, shrinking the group onto that replica, would
delete the removed replicas' copies: perhaps the last intact ones. Checking
harder before the write only narrows the window, since damage is found
asynchronously. So the write that ends a plan does not delete them:

1. **Retire** (:func:`retire`). The removed replicas that were in the ISR or
   the ELR (they hold every applied entry) leave the replicas as *retired
   copies*: the znode keeps their storage records in ``retired``, and lists
   the kept replicas of the ISR and ELR in ``reconfirming``. A retired replica
   steps down (``Removed(retired=True)``) and its worker keeps its data.
2. **Nothing is applied while copies are retired.** A leader whose znode has
   ``retired`` copies does not advance its apply offset (it keeps replicating).
   So a retired copy holds every applied entry for as long as it is kept:
   whichever replica turns out damaged, taking a retired copy back loses nothing.
3. **Reconfirm** (:func:`confirmed`). Each replica in ``reconfirming`` records
   its storage again after that write (``replog.eligibility.record_storage``):
   the same incarnation takes it off the list; a new one (the damage found)
   takes it out of the ISR as always, or, as the last ISR member, marks it
   :data:`STORAGE_LOST` and keeps it on the list.
4. **Release** (:func:`released`). Once no ISR or ELR member is left on the
   list, the same write drops ``retired`` and ``reconfirming``: every replica
   that holds the applied entries has shown its storage is the recorded one
   after the plan ended. The retired replicas' workers then delete their data,
   and the leader applies again. (A kept replica that is down does not hold
   the release up once its leader moved it to the OSR: it rejoins only by
   catching up.) A replica's confirmation is the boundary: damage it finds
   after it has recorded its storage again is a fault after the plan, which
   the group survives only with another intact in-sync copy.
5. **Take back** (:func:`take_back`). If instead every ISR member lost its
   storage (marked lost) or is unsure of it (``replog.eligibility``: those stay
   in the ISR), and no sure ELR member is left, the retired copies become ISR
   members again, leaderless, so the conductor's election picks one of them;
   the lost replicas move to the OSR, record their new storage and catch up
   from it. The plan is then undone for that group, and the conductor starts
   it again towards its target.

The conductor (``conductor/reassigning.py``) and the simulator's conductor
(``tests/sim/membership.py``) write steps 1, 4 (when a leader moved the last
unconfirmed member out) and 5; the replicas write steps 3 and 4.
"""

from __future__ import annotations

from dataclasses import replace

from replog.messages import STORAGE_LOST, GroupState


def retire(state: GroupState, new: GroupState) -> GroupState:
    """``new``, the write ending the plan of ``state`` (keeping ``new.replicas``), with the copies it removes
    from the ISR or ELR retired instead of deleted, and the kept ISR and ELR members left to reconfirm."""
    assert state.reassigning and not new.reassigning and not state.retired, (state, new)
    held = set(state.isr) | set(state.elr)
    retired = tuple(rec for rec in state.storage
                    if rec[0] not in new.replicas and rec[0] in held and rec[1] != STORAGE_LOST)
    if not retired:
        return new
    return replace(new, retired=retired, reconfirming=tuple(r for r in new.replicas if r in new.isr or r in new.elr))


def retired_names(state: GroupState) -> tuple[str, ...]:
    """The nodes whose copies ``state`` keeps retired."""
    return tuple(rec[0] for rec in state.retired)


def unconfirmed(state: GroupState) -> tuple[str, ...]:
    """The ISR and ELR members that have not recorded their storage since the plan's last write."""
    return tuple(r for r in state.reconfirming if r in state.isr or r in state.elr)


def released(state: GroupState) -> GroupState:
    """``state`` (a write in progress: its version is not bumped here) without its retired copies once no ISR or
    ELR member is left to reconfirm; ``state`` itself otherwise."""
    if state.retired and not unconfirmed(state):
        return replace(state, retired=(), reconfirming=())
    return state


def confirmed(state: GroupState, node: str) -> GroupState:
    """``state``, a write recording ``node``'s storage, with ``node`` off the reconfirming list (not if it is marked
    lost: that is what keeps the retired copies for a take-back), and the retired copies released if it was the
    last ISR or ELR member on it."""
    if node not in state.reconfirming or state.incarnation_of(node) == STORAGE_LOST:
        return state
    return released(replace(state, reconfirming=tuple(r for r in state.reconfirming if r != node)))


def take_back(state: GroupState) -> GroupState | None:
    """The write taking the retired copies back, if every ISR member lost its storage or is unsure of it and no sure
    ELR member is left (nothing else can be elected); None otherwise. See the module docstring (step 5)."""
    doubted = {r[0] for r in state.unsure}  # (replog.eligibility: unsure ones may have lost entries, or not)
    if not state.retired or any(r not in doubted for r in state.elr) or any(
            state.incarnation_of(r) != STORAGE_LOST and r not in doubted for r in state.isr):
        return None
    back = retired_names(state)
    keep = tuple(r for r in state.isr if r in doubted)  # (witnesses for the election, if a copy is lost too)
    new = replace(state, version=state.version + 1, leader=None, leader_session=0, placement=state.replicas + back,
                  isr=back + keep, osr=state.osr + tuple(r for r in state.isr if r not in keep),
                  storage=state.storage + state.retired, retired=(), reconfirming=())
    assert not new.reassigning, new
    return new


def waiting_reason(state: GroupState) -> str:
    """Why the retired copies of ``state`` are still kept (for the conductor's step and status)."""
    return (f"the copies of {list(retired_names(state))} are kept until replica(s) {list(unconfirmed(state))} "
            f"record their storage again (or the leader moves them out of the ISR)")
