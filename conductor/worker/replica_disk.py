"""Opening one replica's disk: its replog, epoch file and storage marks, and whether the storage is intact.

Done at every (re)open, before the replica's state machine exists. The marks
say what this storage acknowledged and applied before it stopped; against the
replog it opens and the store's applied offset they tell an intact storage
(restarted cleanly or not) from one that lost entries it acknowledged, which
must take a new incarnation and rebuild from the leader (:mod:`replog.eligibility`).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path

from replog.eligibility import StorageMarks, check_storage, storage_unsure
from replog.epoch_file import EpochFile
from replog.errors import CorruptStorageMarks
from replog.log import Log
from replog.marks_file import MarksFile

log = logging.getLogger("millrace.node")


@dataclass
class ReplicaDisk:
    """A replica's opened files and what the open found."""

    log: Log
    epoch_file: EpochFile
    marks: MarksFile
    #: why this storage is not intact (it lost entries it acknowledged), None if it is
    storage_lost: str | None
    #: this storage's incarnation (replog.eligibility): new with the directory, or after a loss
    incarnation: int
    #: the applied floor (replog.replica): everything this storage applied, which the store may have lost
    #: with its un-flushed state (no RocksDB WAL); the replica re-applies up to it when it serves
    floor: int
    #: the replog ends within the flush the marks claimed (replog.eligibility.storage_unsure): a power loss
    #: during that flush, or a lost acknowledged tail; the storage takes a new incarnation and registers its log
    unsure: bool = False


def open_disk(name: str, directory: Path, applied: int, segment_bytes: int, boot: int) -> ReplicaDisk:
    """Open the files of the replica ``name`` in ``directory`` whose store holds up to ``applied``, on the
    machine's ``boot`` (conductor.worker.durability.machine_boot: the page-cache rule compares it).

    Its marks are saved (durably, "not clean") before it returns: nothing may be acknowledged before that.
    """
    marks_file = MarksFile(directory / "marks")
    try:
        marks = marks_file.load()
        damaged = None
    except CorruptStorageMarks as e:
        marks, damaged = None, str(e)
    replog = Log.open(directory / "replog", fsync="none", segment_bytes=segment_bytes)
    epoch_file = EpochFile(directory / "epochs")
    lost = damaged or check_storage(marks, log_end=replog.end_offset, applied=applied, boot=boot)
    if applied >= replog.end_offset:
        # The store is ahead of the log: a far-horizon install interrupted between the store swap and
        # the log reset (finish it), or a log that lost entries (the store holds their state).
        if lost is None:
            log.warning("%s: finishing an interrupted checkpoint install: the replog restarts at %d",
                        name, applied + 1)
        replog.reset(applied + 1)
    unsure = lost is None and storage_unsure(marks, log_end=replog.end_offset)
    if unsure:
        assert marks is not None
        log.warning("%s: the replog ends at %d, within the flush its storage marks claimed (up to %d): a power loss "
                    "during that flush, or a disk that dropped what it acknowledged; it takes a new incarnation and "
                    "is elected only as the most up-to-date in-sync replica", name, replog.end_offset, marks.claimed)
    elif lost is not None:
        log.error("%s: this replica's storage lost entries it acknowledged (%s); it takes a new incarnation, "
                  "leaves the ISR before serving anything and rebuilds from the leader", name, lost)
    elif marks is not None and not marks.clean:
        log.info("%s: storage intact after an unclean shutdown (acknowledged up to %d, replog ends at %d)",
                 name, marks.acked, replog.end_offset)
    kept = marks if lost is None else None  # an intact storage keeps its incarnation and applied floor
    incarnation = random.SystemRandom().randrange(1, 1 << 63) if kept is None or unsure else kept.incarnation
    floor = max(applied, kept.applied if kept is not None else -1)
    if floor > applied:
        log.info("%s: the store applied up to %d before it stopped but holds %d: re-applying from the replog",
                 name, floor, applied)
    # Durable before the replica may acknowledge anything; cleared "clean" until a clean close. An unsure storage
    # keeps its claim, so that it opens unsure again until its log passes it.
    marks_file.save(StorageMarks(incarnation, acked=replog.end_offset - 1, applied=floor,
                                 claimed=marks.claimed if unsure and marks is not None else -1))
    return ReplicaDisk(replog, epoch_file, marks_file, lost, incarnation, floor, unsure)
