"""A far-horizon install's durable steps, run off the task thread while the replica is parked (issue 27).

Why: a worker's replicas share a task thread (``--task-threads``, 1 by default). An install's writes are
fsyncs the crash order requires (the epoch history, the ``installing`` mark, the store's swap, the replog's
reset, the marks: 6.5-88 ms measured on a loaded box), and while the task thread waited for them a follower
already in another group's ISR held that group's acknowledgements. So the task thread does the install's
checks and its changes of the replica's state itself, and hands only the writes to an install thread
(:func:`start`); meanwhile the replica is *parked* (:class:`ParkedInstall`): its task thread neither drains
its inbox nor steps it (nothing else touches its replog, marks or state machine), while the worker's other
replicas on that thread keep stepping. Once the writes are over the replica is woken and, on its task
thread, takes its new state machine and handles what waited (:meth:`ParkedInstall.resumed`).

What does not change: the driver contract of replog.messages is checked on the task thread before anything
is written (still following the offering leader, outside the ISR, nothing beyond the checkpoint) and
holds until the replica resumes, since no event reaches its state machine while it is parked; the writes
run in the same order, one after the other, on one thread (:func:`durable_steps`), so a crash between
two of them leaves what it left before (a crash between the store's swap and the log's reset is finished
at open: replica_disk.open_disk). A replica stopped while parked waits for the writes before its disk
closes (bounded: a few fsyncs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conductor.worker.inbox import InboxItem, InstallCheckpoint
from conductor.worker.lazy_pool import LazyPool
from conductor.worker.pending_entry import PendingEntry
from replog.errors import ReplogError

if TYPE_CHECKING:
    from conductor.worker.entry_applier import EntryApplier
    from replog.epoch_file import EpochFile
    from replog.log import Log
    from replog.marks_file import MarksFile
    from replog.messages import GroupState
    from replog.replica import Replica

log = logging.getLogger("millrace.node")

#: threads running installs' writes, shared by a worker's replicas. Its queue holds at most one install per
#: replica (a parked replica starts no other): bounded by the replicas the worker hosts
INSTALL_THREADS = 2

_install_pool = LazyPool(INSTALL_THREADS, "millrace-install")


@dataclass
class ParkedInstall:
    """An install whose writes run on an install thread; its replica is parked until they are over."""

    message: InstallCheckpoint
    #: the checkpoint's applied offset: the replog restarts after it
    upto: int
    #: when the task thread took the install (perf_counter), for its log line
    began: float
    #: the writes (:func:`durable_steps`); their error is the install's answer
    steps: Future[None]
    #: the drain's items after the install (and its client appends): handled, in order, once it resumes
    held: list[InboxItem] = field(default_factory=list)
    #: the task thread's own time on the install so far (ms): its checks, and its resume
    task_ms: float = 0.0

    @property
    def written(self) -> bool:
        """The writes are over (done or failed): the replica may resume."""
        return self.steps.done()

    def resumed(self, name: str, installed: Callable[[int], None]) -> list[InboxItem]:
        """Task thread, the writes over: ``installed(upto)`` gives the replica its new state machine (when they
        succeeded), then the copy gets its answer; returns the items that waited, to handle before the inbox's.

        An error (the writes', or ``installed``'s) goes to the copy and the replica goes on, as when its task
        thread wrote.
        """
        began, error = time.perf_counter(), self.steps.exception()
        try:
            if error is None:
                installed(self.upto)
        except Exception as e:
            error = e
        if error is not None:
            self.message.done.set_exception(error)
            return self.held
        resume_ms = (time.perf_counter() - began) * 1e3
        log.warning("%s: installed a checkpoint up to offset %d from %s; replaying from %d (task thread %.1f ms: "
                    "%.1f before, %.1f after; parked %.1f ms)", name, self.upto, self.message.leader, self.upto + 1,
                    self.task_ms + resume_ms, self.task_ms, resume_ms, (began - self.began) * 1e3 - self.task_ms)
        self.message.done.set_result(None)
        return self.held

    def settle(self, name: str) -> None:
        """Closing: the writes end before the disk closes (bounded: a few fsyncs), the copy gets its answer and
        the client appends that waited get the answer the inbox's leftovers get."""
        error = self.steps.exception()
        if error is None:
            self.message.done.set_result(None)
        else:
            self.message.done.set_exception(error)
        for item in self.held:
            if isinstance(item, PendingEntry):
                item.done(-1, None, ReplogError(f"{name}: the replica is closing"))


def refused(install: InstallCheckpoint, replica: Replica, group: GroupState | None, node_id: str) -> bool:
    """Task thread: whether ``install`` is refused (then its copy is answered why).

    Installed only under the driver contract of replog.messages: still following the leader that offered
    it, outside the ISR, and holding no entry beyond the checkpoint, so nothing this replica acknowledged
    is dropped; and only when the copy still waits for it (its store claimed).
    """
    in_isr = group is not None and node_id in group.isr  # (the group's znode as last fed to the state machine)
    why_not = replica.far_horizon_refusal(install.leader, install.epoch, install.prepared.manifest.applied_offset,
                                          in_isr=in_isr)
    if why_not is None and install.prepared.claim():
        return False
    install.done.set_result(why_not or "the copy stopped waiting for its install")
    return True


def durable_steps(epoch_file: EpochFile, marks: MarksFile, store: EntryApplier, replog: Log,
                  install: InstallCheckpoint) -> None:
    """An install thread, the replica parked: the install's writes in its crash order.

    The epoch history first (valid for the old log too, whose entries the checkpoint covers), the
    ``installing`` mark, then the store's atomic swap, then the log's reset, and the marks last. Each
    step is durable before the next starts (each fsyncs), so every crash leaves a prefix of them.
    """
    upto = install.prepared.manifest.applied_offset
    epoch_file.save(install.pairs)
    marks.update(installing=upto)
    store.install_prepared(install.prepared)
    replog.reset(upto + 1)
    marks.update(acked=upto, installing=-1, applied=upto, claimed=-1)


def start(install: InstallCheckpoint, began: float, writes: Callable[[], None],
          wake: Callable[[], None]) -> ParkedInstall:
    """Task thread, the install's checks passed (since ``began``, perf_counter) and its store claimed: run
    ``writes`` on an install thread; ``wake`` is called once they are over (the task thread then resumes
    the replica)."""
    steps = _install_pool.get().submit(writes)
    parked = ParkedInstall(install, install.prepared.manifest.applied_offset, began, steps,
                           task_ms=(time.perf_counter() - began) * 1e3)
    steps.add_done_callback(lambda _f: wake())
    return parked
