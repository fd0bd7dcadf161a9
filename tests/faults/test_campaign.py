"""The fault campaign, short: three seeded runs of the fault classes that main passes (every class:
`tests.faults.campaign.selection.DEFAULT_FAULTS`), and the kept regression seeds. `make faults` runs the full
campaign (100 runs of every class)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.campaign.nemesis import POWER
from tests.faults.campaign.regressions import REGRESSIONS, Regression
from tests.faults.campaign.run import RunConfig, RunResult, run_once
from tests.faults.campaign.selection import DEFAULT_FAULTS

pytestmark = pytest.mark.multihost

#: Seconds of faults per short run (with start-up, heal and check, about a minute per run).
SHORT_DURATION_S = 30.0
#: Appends are idempotent (README "Delivery: exactly once inside a window") and the campaign's clients never
#: re-send a value themselves (each call appends a new one), so a value stored twice can only come from the
#: client library's own retries: a bug. The checker counts duplicates apart from the other findings.
DUPLICATES_ARE_BUGS = True


def assert_safe(r: RunResult) -> None:
    story = "\n".join([*r.story(), f"replay: {r.config.command()}"])
    assert r.ok, story
    if DUPLICATES_ARE_BUGS:
        assert not r.findings.duplicated, story
    print(f"seed {r.config.seed}: {r.findings.acknowledged} acknowledged, {r.findings.unknown} unknown, "
          f"{len(r.findings.duplicated)} duplicated, faults {r.injected}")


def assert_short_run_safe(r: RunResult) -> None:
    """A short run: safe, with faults injected and enough appends for it to mean anything."""
    assert_safe(r)
    assert sum(r.injected.values()) >= 3, r.story()
    assert r.findings.acknowledged >= 50, "too few appends succeeded for the run to mean anything"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_short_campaign(seed: int, tmp_path: Path) -> None:
    r = run_once(RunConfig(seed, SHORT_DURATION_S, DEFAULT_FAULTS), tmp_path)
    assert_short_run_safe(r)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1])
def test_short_secure_campaign(seed: int, tmp_path: Path) -> None:
    """The same short run with security on (`--secure`): mutual TLS, authorization, ZooKeeper digest auth."""
    r = run_once(RunConfig(seed, SHORT_DURATION_S, DEFAULT_FAULTS, secure=True), tmp_path)
    assert_short_run_safe(r)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1])
def test_short_interval_campaign(seed: int, tmp_path: Path) -> None:
    """The same short run in the interval durability mode (`--fsync interval`), power losses included."""
    r = run_once(RunConfig(seed, SHORT_DURATION_S, (*DEFAULT_FAULTS, *POWER), fsync="interval"), tmp_path)
    assert_short_run_safe(r)


@pytest.mark.slow
@pytest.mark.parametrize("reg", REGRESSIONS, ids=[f"seed{r.config.seed}" for r in REGRESSIONS])
def test_kept_regression_seed(reg: Regression, tmp_path: Path) -> None:
    r = run_once(reg.config, tmp_path)
    if reg.xfail and not r.ok:
        pytest.xfail(f"{reg.xfail} (found: {reg.found})")
    assert_safe(r)
