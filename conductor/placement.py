"""Pure placement and leadership decisions: which node holds which replica, who leads.

Nothing here talks to ZooKeeper. The conductor reads the metastore, asks these
functions what the next state should be, and writes it back with a versioned
compare-and-set. Keeping the decisions pure lets us test them exhaustively
(hypothesis, brute force on small cases) and reuse them in the simulator.

Safety rules encoded here (DESIGN.md section 4):

* a leader is only ever chosen from ISR ∩ live nodes, never from the OSR
  (no unclean election: an OSR member may lack applied entries);
* every change of leadership, including to "no leader", bumps the epoch so a
  deposed leader's messages are fenced;
* if no ISR member is live the group stays leaderless, keeping its ISR, until
  an ISR member returns;
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

from collections import Counter, deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from conductor.metastore import GroupState, InvalidGroupState

K = TypeVar("K", bound=Hashable)


# ---- placement ------------------------------------------------------------------------------


def place(groups: int | Iterable[int], nodes: Sequence[str], rf: int) -> dict[int, list[str]]:
    """Assign ``rf`` replicas of each group to distinct nodes; the first replica is the leader.

    Replica counts per node differ by at most one (each group takes the ``rf``
    least-loaded nodes). Leaders are then balanced over those replica sets with
    the same min-cost assignment as ``balance_leaders``, so leader counts are
    as even as the replica sets allow (in practice they differ by at most one).
    Deterministic: the same input always gives the same placement.
    """
    group_ids = list(range(groups)) if isinstance(groups, int) else list(groups)
    node_list = list(dict.fromkeys(nodes))
    if rf < 1:
        raise ValueError(f"replication factor must be at least 1, got {rf}")
    if rf > len(node_list):
        raise ValueError(f"replication factor {rf} needs {rf} distinct nodes but only {len(node_list)} given")
    n = len(node_list)
    load = dict.fromkeys(node_list, 0)
    sets: dict[int, list[str]] = {}
    for i, g in enumerate(group_ids):
        # Rotate the tie-break start so equal loads do not always favour the same nodes.
        order = sorted(range(n), key=lambda j, i=i: (load[node_list[j]], (j - i) % n))  # type: ignore[misc]
        chosen = [node_list[j] for j in order[:rf]]
        for node in chosen:
            load[node] += 1
        sets[g] = chosen
    choices: dict[int, dict[str, int]] = {g: {node: (0 if k == 0 else 1) for k, node in enumerate(s)}
                                          for g, s in sets.items()}
    leaders = _balanced_assignment(choices, base=Counter(), counted=set(node_list))
    return {g: [leaders[g]] + [x for x in s if x != leaders[g]] for g, s in sets.items()}


# ---- leader election --------------------------------------------------------------------------


def _sessions(live_nodes: Iterable[str] | Mapping[str, int]) -> dict[str, int]:
    """Normalise "live" to node -> session id (0 = unknown, which disables the session check)."""
    if isinstance(live_nodes, Mapping):
        return {str(k): int(v) for k, v in live_nodes.items()}
    return dict.fromkeys(live_nodes, 0)


def leader_alive(state: GroupState, live_nodes: Iterable[str] | Mapping[str, int]) -> bool:
    """True if the leader is live under the session it was elected in (when both sessions are known)."""
    live = _sessions(live_nodes)
    if state.leader is None or state.leader not in live:
        return False
    now = live[state.leader]
    return state.leader_session == 0 or now == 0 or now == state.leader_session


def elect_leader(state: GroupState, live_nodes: Iterable[str] | Mapping[str, int],
                 exclude: Iterable[str] = (), disallowed: Iterable[str] = ()) -> str | None:
    """The new leader: the first replica (in preference order) that is in the ISR and live.

    Never an OSR member: it may lack entries that were already applied, so
    electing it would lose acknowledged writes. None if no ISR member is live.
    Nodes drained of leadership (``disallowed``) are taken only when no allowed
    ISR member is live: availability beats the drain.
    """
    live = set(_sessions(live_nodes)) - set(exclude)
    isr = set(state.isr)
    candidates = [node for node in state.replicas if node in isr and node in live]
    banned = set(disallowed)
    allowed = [node for node in candidates if node not in banned]
    pick = allowed or candidates
    return pick[0] if pick else None


def next_leadership(state: GroupState, live_nodes: Iterable[str] | Mapping[str, int],
                    disallowed: Iterable[str] = ()) -> GroupState | None:
    """The state after reacting to the live set, or None if nothing must change.

    * leader lost (dead, or restarted under a new session), another ISR member
      live: that member leads; the old leader moves to the OSR (it must catch
      up before rejoining); epoch + 1.
    * leader restarted and no other ISR member is live: it is elected again
      under its new session (it is in the ISR, so this is a clean election), epoch + 1.
    * leader dead, no ISR member live: leaderless, ISR kept as it is (only those
      replicas hold every applied entry), epoch + 1 to fence the old leader.
    * leaderless and an ISR member is live again: it leads, epoch + 1.

    Dead followers are left alone: the leader moves them to the OSR itself,
    because only it knows whether the ISR may shrink without going below min-ISR.
    Elections prefer nodes not in ``disallowed`` (see ``elect_leader``).
    """
    live = _sessions(live_nodes)
    if leader_alive(state, live):
        return None
    if state.leader is None:
        new_leader = elect_leader(state, live, disallowed=disallowed)
        if new_leader is None:
            return None
        return replace(state, leader=new_leader, epoch=state.epoch + 1, version=state.version + 1,
                       leader_session=live[new_leader])
    old = state.leader
    new_leader = elect_leader(state, live, exclude=[old], disallowed=disallowed)
    if new_leader is not None:
        return replace(
            state,
            leader=new_leader,
            epoch=state.epoch + 1, version=state.version + 1,
            isr=tuple(x for x in state.isr if x != old),
            osr=tuple(x for x in state.replicas if x == old or x in state.osr),
            leader_session=live[new_leader],
        )
    if old in live:  # restarted, and the only live in-sync replica
        return replace(state, epoch=state.epoch + 1, version=state.version + 1, leader_session=live[old])
    return replace(state, leader=None, epoch=state.epoch + 1, version=state.version + 1, leader_session=0)


def leaderless_reason(state: GroupState, live_nodes: Iterable[str] | Mapping[str, int]) -> str | None:
    """Why a group has no (live) leader, in words for `conductor status`; None if it is led."""
    live = _sessions(live_nodes)
    if leader_alive(state, live):
        return None
    if state.leader is not None and state.leader in live:
        return (f"leader {state.leader} restarted under a new ZooKeeper session; the conductor re-elects "
                "a leader shortly")
    live_osr = [x for x in state.osr if x in live]
    why = f"no in-sync replica is live (ISR {list(state.isr)} all down)"
    if live_osr:
        why += f"; OSR member(s) {live_osr} are live but may lack applied entries, so they are never elected"
    return why + "; the group waits for an ISR member to return"


def fully_in_sync(state: GroupState, live_nodes: Iterable[str] | Mapping[str, int]) -> bool:
    """The leader is alive and every replica is live and in the ISR: nothing for failover to repair.

    Periodic balancing waits for this, so it never fights a failover or moves
    leadership to a replica that is about to be dropped from the ISR.
    """
    live = _sessions(live_nodes)
    return leader_alive(state, live) and not state.osr and all(r in live for r in state.replicas)


def switch_leader(state: GroupState, to: str, session: int = 0) -> GroupState:
    """Hand leadership to an in-sync replica (balancing or a resign) under ``session``, bumping the epoch."""
    if to not in state.isr:
        raise InvalidGroupState(f"cannot hand leadership to {to}: not in the ISR {list(state.isr)}")
    return replace(state, leader=to, epoch=state.epoch + 1, version=state.version + 1, leader_session=session)


# ---- leader balancing ----------------------------------------------------------------------------


def balance_leaders(groups: Mapping[K, GroupState], live_nodes: Iterable[str] | Mapping[str, int],
                    disallowed: Iterable[str] = ()) -> dict[K, str]:
    """The minimal set of leader switches ``{group: new_leader}`` that balances leadership.

    Only groups with a live leader take part (leaderless groups are the
    election's job). A group may switch to a live, in-sync, allowed follower.
    The result, in order of priority:

    1. moves leadership off ``disallowed`` nodes wherever the group has an allowed alternative;
    2. makes leader counts over allowed live nodes as even as possible (it
       minimises the sum of squared counts, whose minimisers are exactly the
       assignments where counts differ by at most one whenever one exists);
    3. among those, uses the fewest switches.

    Solved exactly as a min-cost flow with convex node costs, so it is optimal,
    not a greedy approximation (the tests check it against brute force).
    """
    sessions = _sessions(live_nodes)
    live = set(sessions)
    banned = set(disallowed)
    counted = live - banned
    base: Counter[str] = Counter()
    choices: dict[K, dict[str, int]] = {}
    for g, st in groups.items():
        if st.leader is None or not leader_alive(st, sessions):
            continue
        options = {x for x in st.isr if x in live and x not in banned}
        if st.leader not in banned:
            options.add(st.leader)
        if not options:
            base[st.leader] += 1  # stuck on a disallowed leader: nowhere to go
            continue
        choices[g] = {x: (0 if x == st.leader else 1) for x in sorted(options)}
    assignment = _balanced_assignment(choices, base, counted)
    return {g: node for g, node in assignment.items() if node != groups[g].leader}


def _balanced_assignment(choices: Mapping[K, Mapping[str, int]], base: Counter[str],
                         counted: set[str]) -> dict[K, str]:
    """Pick one node per key from its choices minimising (sum of squared counts over ``counted``, cost).

    Min-cost flow: source -> key (1) -> node (choice cost) -> sink, where the
    k-th unit into node n costs M * (2 * (base[n] + k) - 1): the marginal of
    (base + k)^2, so total node cost is M * sum(count^2) + constant. With
    M greater than any possible sum of choice costs, balance strictly dominates
    the number of switches. Successive shortest paths (Bellman-Ford/SPFA on the
    residual graph) keep the flow integral and optimal.
    """
    keys = list(choices)
    if not keys:
        return {}
    nodes = sorted({n for c in choices.values() for n in c})
    big = sum(max(c.values(), default=0) for c in choices.values()) + 1
    # vertex ids: 0 source, 1 sink, keys, then nodes
    source, sink = 0, 1
    kid = {k: 2 + i for i, k in enumerate(keys)}
    nid = {n: 2 + len(keys) + i for i, n in enumerate(nodes)}
    nv = 2 + len(keys) + len(nodes)
    to: list[int] = []
    cap: list[int] = []
    cost: list[int] = []
    adj: list[list[int]] = [[] for _ in range(nv)]

    def add(u: int, v: int, c: int, w: int) -> int:
        adj[u].append(len(to))
        to.append(v)
        cap.append(c)
        cost.append(w)
        adj[v].append(len(to))
        to.append(u)
        cap.append(0)
        cost.append(-w)
        return len(to) - 2

    choice_edge: dict[tuple[K, str], int] = {}
    degree: Counter[str] = Counter()
    for k in keys:
        add(source, kid[k], 1, 0)
        for n, w in choices[k].items():
            choice_edge[(k, n)] = add(kid[k], nid[n], 1, w)
            degree[n] += 1
    for n in nodes:
        if n in counted:
            for j in range(1, degree[n] + 1):
                add(nid[n], sink, 1, big * (2 * (base[n] + j) - 1))
        else:
            add(nid[n], sink, degree[n], 0)

    for _ in keys:
        dist = [None] * nv  # type: list[int | None]
        prev_edge = [-1] * nv
        in_queue = [False] * nv
        dist[source] = 0
        queue = deque([source])
        while queue:
            u = queue.popleft()
            in_queue[u] = False
            du = dist[u]
            assert du is not None
            for e in adj[u]:
                if cap[e] <= 0:
                    continue
                v = to[e]
                nd = du + cost[e]
                dv = dist[v]
                if dv is None or nd < dv:
                    dist[v] = nd
                    prev_edge[v] = e
                    if not in_queue[v]:
                        in_queue[v] = True
                        queue.append(v)
        if dist[sink] is None:  # cannot happen: every key has at least one choice
            raise AssertionError("assignment flow found no augmenting path")
        v = sink
        while v != source:
            e = prev_edge[v]
            cap[e] -= 1
            cap[e ^ 1] += 1
            v = to[e ^ 1]
    result: dict[K, str] = {}
    for (k, n), e in choice_edge.items():
        if cap[e] == 0:
            result[k] = n
    return result
