"""A power loss of a stopped worker's machine, as ``replication.fsync=interval`` sees it (docs/replication.md,
"Durability modes").

A killed process loses nothing it wrote: the kernel keeps its page cache and writes it back. A power loss (a
kernel crash, a reboot) loses what was written since the last fsync, acknowledged or not, and the machine comes
back under another boot id. The fault tests cannot cut a machine's power, so after a SIGKILL they do to the files
what the power loss would have done: every group's last replog segment loses its unsynced tail (some bytes, torn
mid-frame as likely as not), and the storage marks are rewritten as the last *synced* version would read: the
acknowledged mark and the applied floor no further than the shortened log (their page-cache writes are gone
too), not clean, and written
under another boot (the documented ``MRMARKS4`` record, replog.marks_file). Only the page-cache rule
(replog.eligibility.check_storage) can then tell the storage lost what it acknowledged: the other marks agree
with the log.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from conductor.worker.durability import machine_boot
from replog.batch import scan_frames
from replog.marks_file import MarksFile
from replog.segment import SEGMENT_NAME


@dataclass(frozen=True)
class PageCacheLoss:
    """What one group directory lost: the bytes cut, the log end before and after, the highest offset it had
    acknowledged (the marks' page-cache value), the boot it now reads."""

    group_dir: Path
    cut_bytes: int
    end_before: int
    end_after: int
    acked_before: int
    boot: int

    @property
    def lost_acknowledged(self) -> bool:
        """Whether the cut took entries this replica had acknowledged."""
        return self.end_after <= self.acked_before


def other_boot() -> int:
    """A boot id that is not this machine's (what the page-cache rule sees after a reboot)."""
    now = machine_boot()
    while (boot := random.getrandbits(64)) in (0, now):
        pass
    return boot


def _log_end(segment: Path, data: bytes) -> int:
    frames = scan_frames(data).frames
    m = SEGMENT_NAME.match(segment.name)
    assert m is not None, f"{segment} is not a replog segment"
    return frames[-1].base_offset + frames[-1].entry_count if frames else int(m.group(1))


def lose_page_cache(group_dir: Path, cut_bytes: int, boot: int) -> PageCacheLoss:
    """Emulate the power loss on one replica's directory (its worker stopped): ``cut_bytes`` off its last
    segment's end (at most the whole segment), marks as last synced, under ``boot``. The marks must say the
    replica acknowledged from the page cache (``volatile``): in ``always`` mode no such loss can happen."""
    last = max((p for p in (group_dir / "replog").glob("*.log") if SEGMENT_NAME.match(p.name)), default=None)
    assert last is not None, f"{group_dir} has no replog segment"
    data = last.read_bytes()
    end_before = _log_end(last, data)
    cut = min(cut_bytes, len(data))
    with last.open("r+b") as f:
        f.truncate(len(data) - cut)
    end_after = _log_end(last, data[:len(data) - cut])
    marks_file = MarksFile(group_dir / "marks")
    marks = marks_file.load()
    assert marks is not None and marks.volatile, f"{group_dir}: marks {marks} do not say it acked from the page cache"
    # (the last synced marks were written when the synced log reached at least as far as what they name)
    top = end_after - 1
    marks_file.save(replace(marks, acked=min(marks.acked, top), applied=min(marks.applied, top), clean=False,
                            boot=boot))
    marks_file.close()
    return PageCacheLoss(group_dir, cut, end_before, end_after, marks.acked, boot)


def lose_machine_page_cache(module_dir: Path, cut: Callable[[int], int]) -> list[PageCacheLoss]:
    """Every group directory under ``module_dir`` (one worker's, for one module) loses ``cut(size)`` bytes of
    its last segment of ``size`` bytes (the machine's page cache holds every group's tail), all under one new
    boot. Groups whose marks do not say ``volatile`` (nothing acknowledged from the page cache yet) are left
    alone."""
    boot = other_boot()
    out = []
    for gdir in sorted(d for d in module_dir.iterdir() if d.is_dir() and (d / "marks").exists()):
        marks = MarksFile(gdir / "marks").load()
        if marks is not None and marks.volatile:
            last = max((p for p in (gdir / "replog").glob("*.log") if SEGMENT_NAME.match(p.name)), default=None)
            if last is not None:
                out.append(lose_page_cache(gdir, cut(last.stat().st_size), boot))
    return out
