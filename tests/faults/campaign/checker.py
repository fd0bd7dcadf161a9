"""The checker: the history and the ZooKeeper record against the final state of every replica.

Findings are of four kinds, counted apart because they mean different things:
- ``lost_acknowledged``: an append acknowledged with ack="applied" that is not in the final state;
- ``duplicated``: an acknowledged or unknown value present more than once (the campaign's clients never re-send
  a value, and the client library's retries are idempotent, so `make test` fails on any);
- ``divergent_replicas``: a replica whose replog bytes, depot records, counts or applied offset differ from
  its group's leader, or whose files cannot be read (a replica a reassignment rebuilt from a checkpoint is
  judged on the entries both logs hold; a replica a reassignment removed is not a member and not compared);
- ``violations``: everything else that must never happen: a failed value visible, a value nobody sent,
  counts that are not a replay of their depot, an epoch that went back, two leaders in one epoch, an
  acknowledgement while the ISR was below min-ISR the whole time, a group unavailable for longer than the
  session timeout + 2 s after healing, a cluster that did not converge.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import msgpack

from tests.faults.campaign.history import Op
from tests.faults.campaign.module import COUNTED
from tests.faults.campaign.replicas import ReplicaState
from tests.faults.campaign.zkwatch import GroupEvent


@dataclass
class Findings:
    acknowledged: int = 0
    unknown: int = 0
    failed: int = 0
    lost_acknowledged: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    divergent_replicas: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    #: acknowledged appends the min-ISR rule could not judge: the ZooKeeper record skipped a state nearby
    isr_unjudged: int = 0

    @property
    def ok(self) -> bool:
        """Safe: nothing lost, nothing divergent, no violation (duplicates are reported apart)."""
        return not (self.lost_acknowledged or self.divergent_replicas or self.violations)

    def lines(self, limit: int = 10) -> list[str]:
        out = []
        for name in ("lost_acknowledged", "duplicated", "divergent_replicas", "violations"):
            items = getattr(self, name)
            out += [f"{name}: {x}" for x in items[:limit]]
            if len(items) > limit:
                out.append(f"{name}: ... and {len(items) - limit} more")
        return out


@dataclass
class Inputs:
    ops: list[Op]
    #: (group) -> {worker: state}
    replicas: dict[int, dict[str, ReplicaState]]
    #: the final leader of each group per ZooKeeper (None: leaderless)
    leaders: dict[int, str | None]
    events: list[GroupEvent]
    min_isr: int
    #: per group: seconds from the heal until an append succeeded (None: none did)
    unavailable_after_heal: dict[int, float | None]
    availability_bound_s: float
    converged: bool
    #: ZooKeeper's record misses states changed faster than a watch re-arms: the ISR check allows this much
    #: lag between a state's change in ZooKeeper and the recorder seeing it
    zk_lag_s: float = 1.0


def check(inp: Inputs) -> Findings:
    f = Findings()
    references = _check_replicas(inp, f)
    _check_values(inp, references, f)
    _check_counts(references, f, "" if inp.converged else " (the cluster did not converge: hops may be pending)")
    _check_epochs(inp.events, f)
    _check_min_isr(inp, f)
    for g, s in sorted(inp.unavailable_after_heal.items()):
        if s is None or s > inp.availability_bound_s:
            f.violations.append(f"group {g}: no append succeeded within {inp.availability_bound_s:.1f} s of the heal"
                                f" (first success after {s if s is None else round(s, 1)} s)")
    if not inp.converged:
        f.violations.append("the cluster did not converge after healing (a replica never caught up or an ISR "
                            "stayed short)")
    return f


def _check_replicas(inp: Inputs, f: Findings) -> dict[int, ReplicaState]:
    """Compare every replica with its group's leader (or first readable replica); the references."""
    refs: dict[int, ReplicaState] = {}
    for g, states in sorted(inp.replicas.items()):
        readable = [s for s in states.values() if s.error is None]
        lead = states.get(inp.leaders.get(g) or "")
        ref = lead if lead is not None and lead.error is None else (readable[0] if readable else None)
        if ref is None:
            f.divergent_replicas += [f"group {g} {w}: unreadable: {s.error}" for w, s in sorted(states.items())]
            continue
        refs[g] = ref
        for w, s in sorted(states.items()):
            if s is ref:
                continue
            why = _differs(ref, s)
            if why:
                f.divergent_replicas.append(f"group {g} {w} vs {ref.worker}: {why}")
    return refs


def _differs(ref: ReplicaState, s: ReplicaState) -> str | None:
    if s.error is not None:
        return f"unreadable: {s.error}"
    if s.log_start != ref.log_start:
        return _differs_rebuilt(ref, s)
    if (s.log_start, s.log_end) != (ref.log_start, ref.log_end):
        # Only an uncommitted tail may be missing: the leader may append housekeeping (an outbox trim) after
        # the cluster converged and before it froze. Both applied up to the commit point, so equal applied
        # offsets and a byte prefix mean the follower holds every committed entry.
        lagging = (s.log_start == ref.log_start and s.log_end < ref.log_end and s.applied == ref.applied
                   and ref.replog.startswith(s.replog))
        if not lagging:
            return f"log [{s.log_start}, {s.log_end}) != [{ref.log_start}, {ref.log_end})"
    if s.replog != ref.replog[:len(s.replog)]:
        at = next((i for i, (a, b) in enumerate(zip(s.replog, ref.replog, strict=False)) if a != b),
                  min(len(s.replog), len(ref.replog)))
        return f"replog bytes differ from byte {at} ({len(s.replog)} vs {len(ref.replog)} bytes)"
    return _state_differs(ref, s)


def _differs_rebuilt(ref: ReplicaState, s: ReplicaState) -> str | None:
    """Logs that start at different offsets: a replica a reassignment added (or a far-horizon install rebuilt)
    copied a checkpoint, so its log starts where that checkpoint's applied offset ended. Byte prefixes cannot
    be compared; the entries both hold must be equal, the later log must not end early, and both stores must
    hold the same state."""
    common = s.entries.keys() & ref.entries.keys()
    if common != set(range(max(s.log_start, ref.log_start), min(s.log_end, ref.log_end))):
        return f"log [{s.log_start}, {s.log_end}) does not overlap [{ref.log_start}, {ref.log_end}) as a suffix"
    bad = next((o for o in sorted(common) if s.entries[o] != ref.entries[o]), None)
    if bad is not None:
        return f"entry {bad} differs (log [{s.log_start}, {s.log_end}) vs [{ref.log_start}, {ref.log_end}))"
    if s.log_end != ref.log_end and not (s.log_end < ref.log_end and s.applied == ref.applied):
        return f"log [{s.log_start}, {s.log_end}) != [{ref.log_start}, {ref.log_end})"
    return _state_differs(ref, s)


def _state_differs(ref: ReplicaState, s: ReplicaState) -> str | None:
    """What the stores hold, once the logs agree: depot records, counts, the applied offset."""
    if s.depots != ref.depots:
        return "depot records differ"
    if s.counts != ref.counts:
        return f"counts differ: {s.counts} vs {ref.counts}"
    if s.applied != ref.applied:
        return f"applied offset {s.applied} != {ref.applied}"
    return None


def _check_values(inp: Inputs, refs: dict[int, ReplicaState], f: Findings) -> None:
    seen: Counter[str] = Counter()
    where: dict[str, str] = {}
    for ref in refs.values():
        for depot, rec in ref.records():
            seen[rec["id"]] += 1
            where[rec["id"]] = depot
    ops = {op.value: op for op in inp.ops}
    for op in inp.ops:
        n = seen[op.value]
        if op.outcome == "ok":
            f.acknowledged += 1
            if n == 0:
                f.lost_acknowledged.append(f"{op.value} (group {op.group}, {op.depot}, acked at {op.complete:.1f} s; "
                                           f"{_in_replogs(inp, op)})")
        elif op.outcome == "failed":
            f.failed += 1
            if n:
                f.violations.append(f"failed value {op.value} is visible ({op.error})")
        else:
            f.unknown += 1
        if n > 1 and op.outcome != "failed":
            f.duplicated.append(f"{op.value} x{n} ({op.outcome}, group {op.group}, {op.error or 'acked'})")
        if n and where[op.value] != op.depot:
            f.violations.append(f"{op.value} sent to {op.depot} is in {where[op.value]}")
    phantoms = [v for v in seen if v not in ops]
    if phantoms:
        f.violations.append(f"{len(phantoms)} value(s) nobody appended are visible, e.g. {phantoms[:3]}")


def _in_replogs(inp: Inputs, op: Op) -> str:
    """Where a value missing from the applied state still is: the replogs holding its record's bytes (it was
    written but the group never applied it again), or none (it is gone)."""
    needle = b"\xa2id" + msgpack.packb(op.value)
    holders = [f"{w}/{g}" for g, states in sorted(inp.replicas.items()) for w, st in sorted(states.items())
               if needle in st.replog]
    return f"still in the replog of {', '.join(holders)}, not applied" if holders else "in no replog"


def _check_counts(refs: dict[int, ReplicaState], f: Findings, note: str) -> None:
    """Each PState is a replay of its depot: the count of a key is the number of its depot's records."""
    for depot, pstate in COUNTED.items():
        if pstate is None:
            continue
        expected: Counter[str] = Counter(rec["key"] for ref in refs.values() for d, rec in ref.records() if d == depot)
        actual: Counter[str] = Counter()
        for ref in refs.values():
            actual.update(ref.counts.get(pstate, {}))
        for key in sorted(set(expected) | set(actual)):
            if expected[key] != actual[key]:
                f.violations.append(f"{pstate}[{key}] = {actual[key]} but {depot} holds {expected[key]} record(s) "
                                    f"of that key{note}")


def _check_epochs(events: list[GroupEvent], f: Findings) -> None:
    by_group: dict[int, list[GroupEvent]] = defaultdict(list)
    for ev in events:
        by_group[ev.group].append(ev)
    for g, evs in sorted(by_group.items()):
        evs.sort(key=lambda e: e.version)
        leaders: dict[int, set[str]] = defaultdict(set)
        for prev, ev in itertools.pairwise(evs):
            if ev.epoch < prev.epoch:
                f.violations.append(f"group {g}: epoch went back from {prev.epoch} to {ev.epoch} "
                                    f"(znode versions {prev.version} -> {ev.version})")
        for ev in evs:
            if ev.leader is not None:
                leaders[ev.epoch].add(ev.leader)
        for epoch, who in sorted(leaders.items()):
            if len(who) > 1:
                f.violations.append(f"group {g}: epoch {epoch} had leaders {sorted(who)}")


def _check_min_isr(inp: Inputs, f: Findings) -> None:
    """An acknowledged append needs min-ISR replicas: ZooKeeper's ISR must have been that big at some moment
    between its invocation and its acknowledgement (an ISR shrink is written to ZooKeeper before the leader
    applies without the removed replica, so ZooKeeper's ISR is never smaller than the leader's).

    The record may have skipped states (see zkwatch); an append whose window holds a skipped version, or
    borders one, is not judged (counted in `isr_unjudged`), since the skipped state may have had a bigger ISR.
    """
    by_group: dict[int, list[GroupEvent]] = defaultdict(list)
    for ev in sorted(inp.events, key=lambda e: (e.group, e.version)):
        by_group[ev.group].append(ev)
    bad: list[str] = []
    for op in inp.ops:
        if op.outcome != "ok" or op.group is None or op.complete is None:
            continue
        evs = by_group.get(op.group, [])
        lo, hi = op.invoke - inp.zk_lag_s, op.complete + inp.zk_lag_s
        first = max((i for i, e in enumerate(evs) if e.t <= lo), default=0)
        last = max((i for i, e in enumerate(evs) if e.t <= hi), default=-1)
        window = evs[first:last + 1]
        if not window or max(len(e.isr) for e in window) >= inp.min_isr:
            continue
        following = evs[last + 1:last + 2]
        versions = [e.version for e in window + following]
        if any(b != a + 1 for a, b in itertools.pairwise(versions)):
            f.isr_unjudged += 1
            continue
        bad.append(op.value)
    if bad:
        f.violations.append(f"{len(bad)} append(s) acknowledged while ZooKeeper's ISR was below min-ISR "
                            f"{inp.min_isr} throughout, e.g. {bad[:3]}")
