"""The conductor's own Prometheus metrics and its recent leadership changes.

The controller tells a :class:`ConductorMetrics` what it did (an election, a CAS that lost a race, a
balancing move, a reassignment step, the groups it saw without a leader); nothing here decides anything. The counters live in a
registry of the conductor's own (not the process-global one), served at ``/metrics`` on the UI port. Only the
active conductor makes elections, so a standby's counters stay at zero and its list of changes is empty.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from conductor.metastore import GroupState

#: leadership changes kept for the UI's list (the oldest drops out)
RECENT_CHANGES = 200


class ConductorMetrics(Collector):
    """Counters of the conductor's actions, time without a leader per group, the recent leadership changes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["module"]
        self.elections = Counter("millrace_conductor_elections", "leadership changes the conductor wrote "
                                 "(a new leader, or none)", labels, registry=self.registry)
        self.cas_conflicts = Counter("millrace_conductor_cas_conflicts", "group updates that lost a "
                                     "compare-and-set race and were re-decided", labels, registry=self.registry)
        self.balancing_moves = Counter("millrace_conductor_balancing_moves", "leader switches requested by "
                                       "leadership balancing", labels, registry=self.registry)
        self.reassignment_steps = Counter("millrace_conductor_reassignment_steps", "reassignment steps the "
                                          "conductor wrote (step: start, hand_off, complete, release, take_back)",
                                          ["module", "step"], registry=self.registry)
        self.reassignments = Counter("millrace_conductor_reassignments", "reassignment plans finished (outcome: "
                                     "completed, cancelled)", ["module", "outcome"], registry=self.registry)
        self.leaderless_seconds = Counter("millrace_conductor_leaderless_seconds", "seconds task groups spent "
                                          "without a leader, as seen by the active conductor", labels,
                                          registry=self.registry)
        self._lock = threading.Lock()
        #: (module, group) -> when the conductor first saw it leaderless (monotonic seconds)
        self._leaderless_since: dict[tuple[str, int], float] = {}
        self._changes: deque[dict[str, Any]] = deque(maxlen=RECENT_CHANGES)
        self.registry.register(self)

    # ---- what the controller reports -------------------------------------------------------------

    def transition(self, module: str, group: int, old: GroupState, new: GroupState, reason: str | None) -> None:
        """The conductor wrote ``new`` over ``old`` (an election, a fence or a leaderless group); ``reason`` is
        why ``new`` has no leader, if it has none."""
        self.elections.labels(module).inc()
        if new.leader is None:
            why = f"no leader: {reason or 'no live in-sync replica'}"
        elif old.leader is None:
            why = "a returning replica took the leaderless group"
        elif old.leader == new.leader:
            why = "leader fenced (new session or ISR): same node, new epoch"
        else:
            why = f"failover: leader {old.leader} lost or restarted"
        with self._lock:
            self._changes.appendleft({
                "at": time.time(), "module": module, "group": group, "from": old.leader, "to": new.leader,
                "epoch": new.epoch, "isr": list(new.isr), "reason": why})

    def reassignment_step(self, module: str, step: str) -> None:
        """The plan executor wrote a step of a group's reassignment (conductor.reassigning)."""
        self.reassignment_steps.labels(module, step).inc()

    def reassignment_done(self, module: str, cancelled: bool) -> None:
        self.reassignments.labels(module, "cancelled" if cancelled else "completed").inc()

    def cas_conflict(self, module: str) -> None:
        self.cas_conflicts.labels(module).inc()

    def balancing_move(self, module: str, group: int, source: str | None, to: str, epoch: int) -> None:
        self.balancing_moves.labels(module).inc()
        with self._lock:
            self._changes.appendleft({"at": time.time(), "module": module, "group": group, "from": source,
                                      "to": to, "epoch": epoch, "isr": None, "reason": "leadership balancing"})

    def group_seen(self, module: str, group: int, state: GroupState) -> None:
        """A reconcile saw ``state``: start or stop the group's leaderless clock."""
        key = (module, group)
        now = time.monotonic()
        with self._lock:
            since = self._leaderless_since.get(key)
            if state.leader is None and since is None:
                self._leaderless_since[key] = now
            elif state.leader is not None and since is not None:
                del self._leaderless_since[key]
                self.leaderless_seconds.labels(module).inc(now - since)

    def forget_groups(self, keep: set[tuple[str, int]]) -> None:
        """Stop the clocks of groups not in ``keep``: a destroyed module's, or all of them when the term ends."""
        with self._lock:
            for key in set(self._leaderless_since) - keep:
                del self._leaderless_since[key]

    # ---- what the UI and Prometheus read -----------------------------------------------------------

    def recent_changes(self) -> list[dict[str, Any]]:
        """The latest leadership changes, newest first."""
        with self._lock:
            return list(self._changes)

    def leaderless(self) -> dict[tuple[str, int], float]:
        """Seconds each currently leaderless group has been without a leader."""
        now = time.monotonic()
        with self._lock:
            return {k: now - since for k, since in self._leaderless_since.items()}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily("millrace_conductor_group_leaderless_for_seconds", "how long a task group has "
                                  "been without a leader (present only while it has none)", labels=["module", "group"])
        for (module, group), seconds in sorted(self.leaderless().items()):
            gauge.add_metric([module, str(group)], seconds)
        yield gauge
