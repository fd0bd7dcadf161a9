"""Cheap checks of bench.lifecycle's building blocks (the benchmark itself starts a cluster)."""

from __future__ import annotations

import pytest

from bench.lifecycle import step_at, stretch_maxima
from bench.lifecycle_app import MODULE, REF, SOURCES, Ack, Writer, artifact
from conductor.shipping import check_locally


def test_every_version_is_a_reproducible_artifact_that_defines_the_module() -> None:
    shas = {v: artifact(v).sha256 for v in SOURCES}
    assert len(set(shas.values())) == len(SOURCES) and artifact("v1").sha256 == shas["v1"]
    assert set(check_locally(artifact("v2"), REF).pstates) == {"$$counts", "$$last"}
    assert check_locally(artifact("v3"), REF).pstates["$$counts"].migration is not None
    assert check_locally(artifact("v1"), REF).name == MODULE


def test_the_bad_version_fails_only_where_its_define_says(monkeypatch: pytest.MonkeyPatch) -> None:
    check_locally(artifact("bad"), REF)
    monkeypatch.setattr("sys.argv", ["worker", "--node-id", "n2"])
    with pytest.raises(RuntimeError, match="n2 refuses this version"):
        check_locally(artifact("bad"), REF)


def test_gaps_and_steps_are_read_from_timestamps() -> None:
    w = Writer(depot=None)
    w.acks = [Ack(t, {}, 1) for t in (1.0, 1.01, 1.05, 1.06, 2.0)]
    assert [round(g) for g in w.gaps_ms(1.0, 1.1)] == [10, 40, 10]
    steps = [(0.0, "start"), (1.02, "ship"), (1.9, "switch")]
    assert [step_at(steps, t) for t in (0.5, 1.02, 1.5, 3.0)] == ["start", "ship", "ship", "switch"]


def test_the_floor_is_the_largest_gap_of_each_stretch_as_long_as_the_window() -> None:
    assert stretch_maxima([1.0, 5.0, 2.0, 2.0, 9.0], 2) == [2.0, 5.0, 5.0, 9.0]
    assert stretch_maxima([3.0, 1.0], 10) == [3.0]  # a window longer than the steady phase: one stretch
