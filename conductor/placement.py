"""Pure placement and balancing decisions: which node holds which replica, which one should lead.

Nothing here talks to ZooKeeper. The conductor reads the metastore, asks these
functions what the next state should be, and writes it back with a versioned
compare-and-set. Keeping the decisions pure lets us test them exhaustively
(hypothesis, brute force on small cases) and reuse them in the simulator.

Who leads after a failure, a hand-off or an abdication is the election rule,
in ``replog/election.py`` (the simulator runs it); here are placement and
leader balancing, which only ever move leadership between in-sync replicas.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from conductor.metastore import GroupState
from replog.election import leader_alive, live_sessions
from replog.eligibility import sure

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


def fully_in_sync(state: GroupState, live_nodes: Iterable[str] | Mapping[str, int]) -> bool:
    """The leader is alive and every replica is live and in the ISR: nothing for failover to repair.

    Periodic balancing waits for this, so it never fights a failover or moves
    leadership to a replica that is about to be dropped from the ISR.
    """
    live = live_sessions(live_nodes)
    return (leader_alive(state, live) and not state.osr and not state.unsure
            and all(r in live for r in state.replicas))


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
    sessions = live_sessions(live_nodes)
    live = set(sessions)
    banned = set(disallowed)
    counted = live - banned
    base: Counter[str] = Counter()
    choices: dict[K, dict[str, int]] = {}
    for g, st in groups.items():
        if st.leader is None or not leader_alive(st, sessions):
            continue
        options = {x for x in st.isr if x in live and x not in banned and sure(st, x)}  # (replog.eligibility)
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


# ---- reassignment targets --------------------------------------------------------------------------


def scale_targets(current: Mapping[int, Sequence[str]], nodes: Sequence[str], rf: int) -> dict[int, list[str]]:
    """Each group's replicas after a scale to exactly ``nodes`` with ``rf`` replicas, moving as few as possible.

    Replica counts per node end within one of each other (at most
    ``ceil(groups * rf / len(nodes))`` each). A group keeps the current
    replicas it may (in their order: its preferred leader stays first unless
    it goes); a node over its share drops replicas from groups in turn (one
    per group per pass, followers before leaders); then every group is filled
    up to ``rf`` with the least-loaded nodes it lacks. Deterministic.
    """
    node_list = list(dict.fromkeys(nodes))
    if rf < 1:
        raise ValueError(f"replication factor must be at least 1, got {rf}")
    if rf > len(node_list):
        raise ValueError(f"replication factor {rf} needs {rf} distinct workers but only {len(node_list)} given")
    cap = -(-len(current) * rf // len(node_list))
    keep = {g: [r for r in reps if r in node_list][:rf] for g, reps in sorted(current.items())}
    load: Counter[str] = Counter(r for reps in keep.values() for r in reps)
    while any(load[n] > cap for n in node_list):
        for reps in keep.values():
            over = [r for r in reps[1:] if load[r] > cap] or [r for r in reps[:1] if load[r] > cap]
            if over:
                drop = max(over, key=lambda r: load[r])
                reps.remove(drop)
                load[drop] -= 1
    for i, reps in enumerate(keep.values()):
        while len(reps) < rf:
            order = sorted((n for n in node_list if n not in reps),
                           key=lambda n, i=i: (load[n], (node_list.index(n) - i) % len(node_list)))  # type: ignore[misc]
            reps.append(order[0])
            load[order[0]] += 1
    assert all(len(set(r)) == len(r) == rf for r in keep.values()), keep
    return keep


def replace_targets(current: Mapping[int, Sequence[str]], node: str, candidates: Sequence[str],
                    load: Mapping[str, int]) -> dict[int, list[str]]:
    """The groups holding ``node`` with it replaced by the least-loaded candidate each lacks (by ``load``, the
    replicas per node, counted as they are placed); ValueError when a group has no candidate left."""
    counts: Counter[str] = Counter({n: load.get(n, 0) for n in candidates})
    out: dict[int, list[str]] = {}
    for g, reps in sorted(current.items()):
        if node not in reps:
            continue
        options = sorted((n for n in candidates if n not in reps and n != node), key=lambda n: (counts[n], n))
        if not options:
            raise ValueError(f"task group {g} (replicas {list(reps)}) has no live worker left to take {node}'s "
                             "replica: start a worker first")
        out[g] = [r for r in reps if r != node] + [options[0]]
        counts[options[0]] += 1
    return out
