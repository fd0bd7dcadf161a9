"""A replica's dataflow on its worker: the task thread's side of :class:`topology.dataflow.group.GroupDataflow`.

The rules (what to consume, when a tree is complete, what to ship) live in
:mod:`topology.dataflow`; this driver performs them for one replica, on its
task thread, at the points the replica host offers:

* leadership starts or ends (:meth:`DataflowDriver.role`);
* a pull or a batch of envelopes arrives from another worker (:class:`Inflow`);
* each inbox drain, the entries to add to those it appends: the envelopes
  queued since the last one (one inbound entry for all of them, sharing the
  drain's fsync), and now and then a trim (:meth:`DataflowDriver.entries`);
* entries are applied (the leader feeds each one to the tracker);
* an ``ack="applied"`` append's entry is applied: its reply waits until its
  whole tree of hops is (:meth:`DataflowDriver.hold_reply`);
* after each drain: answers for completed trees, then pulls and batches for
  other groups' leaders (:meth:`DataflowDriver.drained`).

Messages leave through ``send(group, node, message)``: the worker sends a pull
to the source group's leader and a batch to the node that pulled. Appends
waiting on a leadership that ends fail with ``NotLeader``: the client retries
them, as any append of a leader that failed over (at least once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pstate import outbox
from replog.errors import NotLeader
from replog.messages import Ack, Role
from topology.dataflow.group import Batch, GroupDataflow
from topology.dataflow.shipping import Pull
from topology.entries.requests import InboundHops, OutboxTrim

log = logging.getLogger("millrace.node")

#: how often a leader looks for outbox envelopes its destinations completed (trims go in batches)
TRIM_INTERVAL_MS = 200


@dataclass(frozen=True)
class Inflow:
    """A dataflow message from ``peer`` (a worker's node id) for this replica's group."""

    peer: str
    msg: Pull | Batch


class DataflowDriver:
    """Drives one replica's :class:`GroupDataflow` from its task thread (see the module docstring)."""

    def __init__(self, name: str, flow: GroupDataflow, send: Callable[[int, str | None, Pull | Batch], None]) -> None:
        self.name = name
        self.flow = flow
        self._send = send
        self._waiting: dict[int, Any] = {}  # applied root offset -> the PendingEntry whose reply waits
        self._next_trim_ms = 0
        #: the flow was busy since the last trim check: one more check is owed once it settles
        self._trim_owed = False

    @property
    def leading(self) -> bool:
        return self.flow.leading

    def role(self, role: Role, epoch: int) -> None:
        if role is Role.LEADER:
            self.flow.lead(epoch)
            return
        if self.flow.leading:
            self.flow.follow()
            self.fail_waiting(NotLeader(self.name, None, epoch))

    def received(self, item: Inflow) -> None:
        self.flow.received(item.msg, item.peer)

    def entries(self, now_ms: int) -> list[tuple[InboundHops | OutboxTrim, Callable[..., None]]]:
        """Entries to append in this drain, as (request, done): the queued envelopes, and a trim when due."""
        if not self.flow.leading:
            return []
        out: list[tuple[InboundHops | OutboxTrim, Callable[..., None]]] = []
        if self.flow.inbound_due(now_ms):
            out.append((InboundHops(now_ms), self._inbound_done))
        if now_ms >= self._next_trim_ms:
            self._next_trim_ms = now_ms + TRIM_INTERVAL_MS
            self._trim_owed = False
            if self.flow.trims_due():
                out.append((OutboxTrim(), _nobody))
        return out

    def next_due_ms(self, now_ms: int) -> int | None:
        """When the task thread must drain again with nothing arriving (see ``GroupDataflow.next_due_ms``).

        A trim is checked at most every ``TRIM_INTERVAL_MS``; the last one a burst of work owes is due
        even when the flow has gone quiet by then.
        """
        due = self.flow.next_due_ms(now_ms)
        if self.flow.working():
            self._trim_owed = True
        if self._trim_owed and self.flow.leading:
            due = self._next_trim_ms if due is None else min(due, self._next_trim_ms)
        return due

    def _inbound_done(self, first: int, result: Any, error: Exception | None) -> None:
        if error is not None:  # refused before reaching the log: pull again from where the log is
            self.flow.dropped_inbound()

    def applying(self) -> GroupDataflow | None:
        """The dataflow to feed applied entries to (None on a follower: it only applies)."""
        return self.flow if self.flow.leading else None

    def hold_reply(self, offset: int, p: Any) -> bool:
        """True when ``p``'s ``applied`` reply must wait for the tree its entry started (answered in ``drained``)."""
        if p.ack is not Ack.APPLIED or not self.flow.leading or self.flow.root_complete(offset):
            return False
        self._waiting[offset] = p
        return True

    def drained(self, now_ms: int) -> None:
        """After a drain: answer appends whose trees completed, then send pulls and batches."""
        if not self.flow.leading:
            return
        for off in self.flow.completed_roots():
            p = self._waiting.pop(off, None)
            if p is not None:
                _answer(self.name, p, off, p.result, None)
        for group, node, msg in self.flow.outgoing(now_ms):
            self._send(group, node, msg)

    def fail_waiting(self, error: Exception) -> None:
        waiting, self._waiting = self._waiting, {}
        for off, p in waiting.items():
            _answer(self.name, p, off, None, error)

    def status(self) -> dict[str, int]:
        """For metrics and ``conductor status``: dead letters and envelopes in flight (leader only)."""
        return {"dead_letters": outbox.dead_letters(self.flow.store.applied_reader()),
                "envelopes_in_flight": self.flow.tracker.in_flight() if self.flow.leading else 0,
                "appends_waiting_for_hops": len(self._waiting)}


def _answer(name: str, p: Any, offset: int, result: Any, error: Exception | None) -> None:
    try:
        p.done(offset, result, error)
    except Exception:
        log.exception("%s: append callback failed", name)


def _nobody(first: int, result: Any, error: Exception | None) -> None:
    """Trims answer nobody: a refused one is simply due again later."""
