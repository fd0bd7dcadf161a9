"""topology.spark.timeline: marks cost nothing unless asked for, and come back in time order from every process."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from topology.spark import timeline


def test_marks_are_not_written_unless_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "_DIR", None)
    timeline.mark("read_start", 1)
    assert timeline.read_marks(tmp_path) == []


def test_started_marks_reach_this_process_and_the_processes_it_starts(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "_DIR", None)
    monkeypatch.setenv(timeline.ENV, "")  # so that monkeypatch puts the variable back as it was, after start()
    timeline.start(tmp_path / "marks")
    timeline.mark("plan_start")
    child = ("from topology.spark.timeline import mark; mark('read_start', 3); mark('reply', 4096); "
             "mark('read_end', 3)")
    subprocess.run([sys.executable, "-c", child], check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    timeline.mark("plan_end", "2 partitions")
    marks = timeline.read_marks(tmp_path / "marks")
    assert [m.event for m in marks] == ["plan_start", "read_start", "reply", "read_end", "plan_end"]
    assert marks[-1].detail == "2 partitions" and marks[0].detail == ""
    assert {m.pid for m in marks} == {os.getpid(), marks[1].pid} and marks[1].pid != os.getpid()
    assert all(a.at <= b.at for a, b in itertools.pairwise(marks))
