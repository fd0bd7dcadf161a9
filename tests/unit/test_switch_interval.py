"""The worker's GIL switch interval setting: parsed in seconds within its bounds, from every settings source,
and applied to the process by the worker's entry point only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conductor.settings import SettingsError, resolve
from conductor.worker.__main__ import SETTINGS, main
from conductor.worker.switch_interval import (
    DEFAULT,
    MAX_SECONDS,
    MIN_SECONDS,
    apply_switch_interval,
    parse_switch_interval,
)

REQUIRED_FLAGS = {"zk": "127.0.0.1:1", "node_id": "n1", "data_dir": "/tmp/unused"}


def test_the_interval_is_seconds_within_its_bounds() -> None:
    assert parse_switch_interval("0.001") == 0.001
    assert parse_switch_interval(str(MIN_SECONDS)) == MIN_SECONDS
    assert parse_switch_interval(str(MAX_SECONDS)) == MAX_SECONDS
    for bad in ("0", "-0.001", "0.00001", "0.5", "1", "5ms", "nan"):
        with pytest.raises(ValueError):
            parse_switch_interval(bad)
    assert MIN_SECONDS <= DEFAULT <= MAX_SECONDS


def test_the_worker_reads_the_interval_from_its_settings_sources(tmp_path: Path) -> None:
    assert resolve(REQUIRED_FLAGS, SETTINGS, "worker", None, {})["switch_interval"] == DEFAULT
    env = {"MILLRACE_SWITCH_INTERVAL": "0.002"}
    assert resolve(REQUIRED_FLAGS, SETTINGS, "worker", None, env)["switch_interval"] == 0.002
    config = tmp_path / "millrace.toml"
    config.write_text("[worker]\nswitch_interval = 0.0005\n")
    assert resolve(REQUIRED_FLAGS, SETTINGS, "worker", config, {})["switch_interval"] == 0.0005
    with pytest.raises(SettingsError, match=r"\$MILLRACE_SWITCH_INTERVAL: '2' is not a valid switch_interval"):
        resolve(REQUIRED_FLAGS, SETTINGS, "worker", None, {"MILLRACE_SWITCH_INTERVAL": "2"})


def test_applying_the_interval_sets_the_process_wide_value() -> None:
    before = sys.getswitchinterval()
    try:
        apply_switch_interval(0.002)
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)


def test_the_worker_refuses_an_interval_out_of_bounds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = sys.getswitchinterval()
    with pytest.raises(SystemExit) as exit_:
        main(["--zk", "127.0.0.1:1", "--node-id", "n1", "--data-dir", str(tmp_path), "--switch-interval", "1"])
    assert exit_.value.code == 2
    assert "--switch-interval: '1' is not a valid switch_interval" in capsys.readouterr().err
    assert sys.getswitchinterval() == before, "nothing is applied before every setting is valid"
