"""The appends a leader's replica appended and has not answered yet, per state-machine request.

A drain's appends go to the state machine as one ``ClientAppend`` per run of an
ack level (``ReplicaHost._client_appends``); its ``Reply`` answers the run, except
an ``applied`` append whose entry sent hops, which the dataflow answers once they
are applied too (:meth:`DataflowDriver.hold_reply`). A replica that stops or fails
answers every waiting append with the error.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from conductor.worker.pending_entry import PendingEntry
from conductor.worker.timings import ReplicaTimings, measure_reply
from replog.messages import Reply

if TYPE_CHECKING:
    from conductor.worker.dataflow import DataflowDriver

log = logging.getLogger("millrace.node")


class WaitingAppends:
    """Request id -> the run of appends it carries, until the state machine replies (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._runs: dict[int, list[PendingEntry]] = {}
        self._next = 1

    def add(self, run: list[PendingEntry]) -> int:
        """A run of appends goes to the state machine: the request id its ``Reply`` will name."""
        rid = self._next
        self._next += 1
        self._runs[rid] = run
        return rid

    def reply(self, a: Reply, dataflow: DataflowDriver | None, stats: dict[str, int],
              timings: ReplicaTimings | None) -> None:
        """The state machine answered a request: its appends get their offsets (or the error), but an applied
        one whose entry sent hops, which the dataflow answers once those are applied."""
        run = self._runs.pop(a.request_id, None)
        if run is None:
            return
        assert a.error is not None or a.count == len(run), (a, len(run))
        stats["appends"] += len(run)
        measure_reply(stats, timings, a.error, run)
        for i, p in enumerate(run):
            if a.error is None and dataflow is not None and dataflow.hold_reply(a.first + i, p):
                continue  # answered when the hops its entry sent are applied too
            _answer(self.name, p, a.first + i, p.result if a.error is None else None, a.error)

    def fail_all(self, dataflow: DataflowDriver | None, err: Exception) -> None:
        """The replica stops or failed: every append waiting for its entry, or for the hops it sent, gets ``err``."""
        if dataflow is not None:
            dataflow.fail_waiting(err)
        runs, self._runs = self._runs, {}
        for run in runs.values():
            for p in run:
                _answer(self.name, p, -1, None, err)


def _answer(name: str, p: PendingEntry, first: int, result: object, error: Exception | None) -> None:
    try:
        p.done(first, result, error)
    except Exception:
        log.exception("%s: append callback failed", name)
