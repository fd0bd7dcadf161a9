"""Settings of server processes: flag > environment > config file ([section], then top level) > default, and
bind/advertised addresses that other machines can use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conductor.settings import REQUIRED, Listen, Setting, SettingsError, hostport, parse_port, resolve

SETTINGS = [
    Setting("zk", REQUIRED),
    Setting("host", "127.0.0.1"),
    Setting("port", 0, parse_port),
    Setting("log_level", "WARNING"),
]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "millrace.toml"
    path.write_text(text)
    return path


def test_each_source_wins_over_the_ones_below_it(tmp_path: Path) -> None:
    config = write(tmp_path, 'zk = "file-top:2181"\nport = 1\nhost = "10.0.0.9"\n'
                             '[worker]\nport = 2\nlog_level = "INFO"\n')
    env = {"MILLRACE_PORT": "3", "MILLRACE_ZK": "env:2181"}
    got = resolve({"port": "4", "zk": None, "host": None, "log_level": None}, SETTINGS, "worker", config, env)
    assert got == {"zk": "env:2181", "host": "10.0.0.9", "port": 4, "log_level": "INFO"}
    got = resolve({}, SETTINGS, "worker", config, env)
    assert got["port"] == 3, "the environment beats the file"
    got = resolve({}, SETTINGS, "worker", config, {})
    assert got == {"zk": "file-top:2181", "host": "10.0.0.9", "port": 2, "log_level": "INFO"}, \
        "the process's own section beats the file's top level"
    got = resolve({}, SETTINGS, "conductor", config, {})
    assert got["port"] == 1 and got["log_level"] == "WARNING", "another section's keys do not apply"


def test_the_config_file_can_come_from_the_environment(tmp_path: Path) -> None:
    config = write(tmp_path, '[worker]\nzk = "from-file:2181"\n')
    got = resolve({}, SETTINGS, "worker", None, {"MILLRACE_CONFIG": str(config)})
    assert got["zk"] == "from-file:2181" and got["host"] == "127.0.0.1" and got["port"] == 0


def test_missing_and_malformed_settings_say_where_to_give_them(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"missing zk \(give --zk, set \$MILLRACE_ZK, or write `zk = \.\.\.`"):
        resolve({}, SETTINGS, "worker", None, {})
    with pytest.raises(SettingsError, match=r"\$MILLRACE_PORT: '99999' is not a valid port"):
        resolve({"zk": "z:1"}, SETTINGS, "worker", None, {"MILLRACE_PORT": "99999"})
    bad = write(tmp_path, "zk = \n")
    with pytest.raises(SettingsError, match="is not valid TOML"):
        resolve({}, SETTINGS, "worker", bad, {})
    with pytest.raises(SettingsError, match="cannot read the config file"):
        resolve({}, SETTINGS, "worker", tmp_path / "absent.toml", {})


def test_a_wildcard_bind_needs_an_advertised_address() -> None:
    assert Listen.of(None, None) == Listen("127.0.0.1", "127.0.0.1")
    assert Listen.of("10.1.2.3", None) == Listen("10.1.2.3", "10.1.2.3")
    assert Listen.of("0.0.0.0", "node1.example") == Listen("0.0.0.0", "node1.example")
    with pytest.raises(SettingsError, match="give --advertise"):
        Listen.of("0.0.0.0", None)
    with pytest.raises(SettingsError, match="not an address other machines can reach"):
        Listen.of("10.1.2.3", "0.0.0.0")
    listen = Listen.of("[::]", "fd00::5")
    assert listen.bind(7000) == "[::]:7000" and listen.advertised(7000) == "[fd00::5]:7000"
    assert hostport("node1", 1) == "node1:1"


def test_the_worker_refuses_a_wildcard_bind_without_an_advertised_address(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "conductor.worker", "--zk", "127.0.0.1:1", "--node-id", "n1",
                        "--data-dir", str(tmp_path), "--host", "0.0.0.0"], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 2
    assert "give --advertise with this machine's address" in r.stderr
