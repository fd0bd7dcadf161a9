"""Settings of a server process: where it binds, what it advertises, and the precedence of their sources.

A worker on a machine of a cluster must *bind* one address (often every
interface, ``0.0.0.0``) and *advertise* another: the address other machines,
clients and Spark executors reach it at, which it registers in ZooKeeper.
Kafka calls these ``listeners`` and ``advertised.listeners``; Millrace calls
them ``--host`` and ``--advertise``.

Every setting comes from, in this order (the first that has it wins):

1. a command-line flag (``--advertise 10.0.0.11``),
2. an environment variable (``MILLRACE_ADVERTISE=10.0.0.11``),
3. a TOML config file (``--config FILE`` or ``MILLRACE_CONFIG``): a key of the
   process's section (``[worker]``, ``[conductor]``, ``[dev]``), else a
   top-level key (so ``zk = "..."`` is written once for every process),
4. the default: loopback, so a single-machine cluster needs no settings.

Why flags beat the environment beat the file: a file is the machine's standing
configuration, the environment is how a service manager or container changes
it per instance, and a flag is what a person typed just now. This module
imports nothing of the project, so every layer can use it (like
:mod:`conductor.runtime_env`).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The default bind and advertised address of every server process: one machine, reachable only from itself.
LOOPBACK = "127.0.0.1"
#: Bind addresses that mean "every interface": they name no machine, so they cannot be advertised.
WILDCARDS = frozenset({"0.0.0.0", "::"})
CONFIG_ENV = "MILLRACE_CONFIG"
ENV_PREFIX = "MILLRACE_"


class SettingsError(ValueError):
    """A setting is missing or malformed; the message names where it was read from and how to fix it."""


class _Required:
    def __repr__(self) -> str:
        return "required"


#: The default of a setting that has none: resolving it fails unless one of the sources gives it.
REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Setting:
    """One setting: its name (the TOML key; the flag and variable are derived from it), default and parser."""

    name: str
    default: Any
    parse: Callable[[str], Any] = str
    help: str = ""

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def address_settings(what: str) -> list[Setting]:
    """``host`` and ``advertise`` of a process that serves `what`."""
    return [
        Setting("host", LOOPBACK, help=f"address to bind {what} on (0.0.0.0: every interface)"),
        Setting("advertise", None, help="address other machines reach this process at, registered in ZooKeeper "
                                        "(default: --host; required when --host is 0.0.0.0)"),
    ]


def add_arguments(parser: argparse.ArgumentParser, settings: Sequence[Setting]) -> None:
    """Add ``--config`` and one flag per setting; a flag's own default is None so that `resolve` can tell
    "not given" from "given"."""
    parser.add_argument("--config", type=Path, default=None,
                        help=f"TOML config file (also ${CONFIG_ENV}); flags beat environment variables beat the file")
    for s in settings:
        if s.parse is parse_bool:  # a switch: given or not (the environment and the file say true or false)
            parser.add_argument(s.flag, dest=s.name, action="store_true", default=None,
                                help=f"{s.help} (${s.env}=1)".strip())
            continue
        default = "" if s.default is None or s.default is REQUIRED else f"; default {s.default}"
        parser.add_argument(s.flag, dest=s.name, default=None,
                            help=f"{s.help} (${s.env}{default})".strip())


def load_config(path: Path | None, environ: Mapping[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """The config file's table and its name for messages; empty if there is none."""
    env = os.environ if environ is None else environ
    source = path if path is not None else (Path(env[CONFIG_ENV]) if env.get(CONFIG_ENV) else None)
    if source is None:
        return {}, ""
    try:
        with open(source, "rb") as f:
            return tomllib.load(f), str(source)
    except OSError as e:
        raise SettingsError(f"cannot read the config file {source}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"config file {source} is not valid TOML: {e}") from None


def resolve(flags: Mapping[str, Any], settings: Sequence[Setting], section: str, config: Path | None = None,
            environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Each setting's value by precedence: flag, environment variable, ``[section]`` of the config file, the
    file's top level, default. `flags` maps setting names to what the command line gave (None: not given)."""
    env = os.environ if environ is None else environ
    table, source = load_config(config, env)
    own = table.get(section, {})
    if not isinstance(own, dict):
        raise SettingsError(f"config file {source}: [{section}] must be a table")
    out: dict[str, Any] = {}
    missing = []
    for s in settings:
        given = flags.get(s.name)
        if given is not None:
            raw, where = given, s.flag
        elif env.get(s.env):
            raw, where = env[s.env], f"${s.env}"
        elif s.name in own:
            raw, where = own[s.name], f"{source} [{section}] {s.name}"
        elif s.name in table and not isinstance(table[s.name], dict):
            raw, where = table[s.name], f"{source} {s.name}"
        elif s.default is REQUIRED:
            missing.append(s)
            continue
        else:
            out[s.name] = s.default
            continue
        try:
            out[s.name] = s.parse(str(raw))
        except ValueError as e:
            raise SettingsError(f"{where}: {raw!r} is not a valid {s.name} ({e})") from None
    if missing:
        raise SettingsError("missing " + "; ".join(
            f"{s.name} (give {s.flag}, set ${s.env}, or write `{s.name} = ...` in the config file)" for s in missing))
    return out


@dataclass(frozen=True)
class Listen:
    """Where a server binds (`host`) and the address it gives others (`advertise`)."""

    host: str = LOOPBACK
    advertise: str = LOOPBACK

    @classmethod
    def of(cls, host: str | None, advertise: str | None) -> Listen:
        """Check a bind and an advertised address; the advertised one defaults to the bind address, except for
        a wildcard bind, which names no machine."""
        bind = _unbracket((host or LOOPBACK).strip())
        adv = _unbracket((advertise or "").strip())
        if not adv:
            if bind in WILDCARDS:
                raise SettingsError(f"--host {bind} binds every interface, so it names no address other machines "
                                    "can reach: give --advertise with this machine's address (or name)")
            adv = bind
        if adv in WILDCARDS:
            raise SettingsError(f"--advertise {adv} is not an address other machines can reach; give this "
                                "machine's address or host name")
        return cls(bind, adv)

    def bind(self, port: int) -> str:
        return hostport(self.host, port)

    def advertised(self, port: int) -> str:
        return hostport(self.advertise, port)


def _unbracket(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def hostport(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets (as gRPC and kazoo expect)."""
    h = _unbracket(host)
    try:
        is_v6 = ipaddress.ip_address(h).version == 6
    except ValueError:
        is_v6 = False
    return f"[{h}]:{port}" if is_v6 else f"{h}:{port}"


def split_hostport(address: str) -> tuple[str, int]:
    """``hostport``'s inverse: ("::1", 7000) from "[::1]:7000"; ValueError for an address without a port."""
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{address!r} is not HOST:PORT")
    return _unbracket(host), int(port)


def parse_port(raw: str) -> int:
    port = int(raw)
    if not 0 <= port <= 65535:
        raise ValueError("a port is 0..65535 (0: any free port)")
    return port


def parse_bool(raw: str) -> bool:
    """A switch's value from the environment or a config file: 1/true/yes/on or 0/false/no/off."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("write true or false")


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost): safe without TLS."""
    h = _unbracket(host.strip())
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def parse_seconds(raw: str) -> float:
    value = float(raw)
    if value < 0:
        raise ValueError("seconds cannot be negative")
    return value

