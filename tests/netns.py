"""Test hosts: network namespaces joined by a bridge, each one a stand-in for a machine.

A `HostNetwork` builds N namespaces, each with one veth into a bridge in the
host namespace and its own address in a private /24 (the bridge has `.1`, so a
test in the host namespace reaches every host and every host reaches it). It
starts processes inside a host, takes a host's link down and up (a machine
lost), cuts the path between two hosts, isolates a host from some others and
splits hosts into partitions. Everything it makes, it removes by name: on
`close()`, when the test fails, at exit, on SIGTERM, and a later run sweeps what
an owner killed with SIGKILL left behind.

Why iproute2 subprocesses and not pyroute2: the `ip` commands are what was
checked to work on these machines and what a person types to reproduce a
failure from its log; a network of five hosts costs about forty calls of ~3 ms;
and starting a process inside a namespace needs `ip netns exec` (or setns,
which Python 3.11's `os` lacks) either way. pyroute2 would add a dependency whose
namespace support forks helper processes and whose API changed in 0.9.

Safety: hosts have no default route, so nothing inside a namespace can send to
an address outside its /24. In the host namespace, each claimed /24 also gets an
`unreachable` route (a higher metric than the bridge's), kept until the owning
process exits, so a client still retrying an address after its network was
closed fails locally instead of sending it to the default gateway.

Names: every namespace, veth and bridge starts with ``mr<pid>t<seq>`` (the
owner's pid, then the network's number in that process), short enough for
Linux's 15-character interface names; claims of /24s are files in
``/run/millrace-netns`` with the owner's pid and start time.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from conductor.devcluster import ChildProcess

STATE_DIR = Path("/run/millrace-netns")
#: The /24s test hosts use: 10.231.<k>.0/24 for k in 1..254, one per network.
SUBNET_BLOCK = ipaddress.IPv4Network("10.231.0.0/16")
#: Metric of the host namespace's unreachable route for a claimed /24 (the bridge's own route has 0).
GUARD_METRIC = 4231
#: The device, in every host, that routes of cut paths lead to: a tun device nobody reads, which drops
#: every packet silently, as a lost path does (a `blackhole` route would fail the sender at once with
#: EINVAL, which no real partition does).
SINK = "sink0"
MAX_HOSTS = 99  # the host's index is two digits of a 15-character interface name
NAME_RE = re.compile(r"^mr(\d+)t[0-9a-z]{1,2}(?:b|[vn]\d{1,2})$")
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"
#: Connects to (address, port) from inside a namespace; exit status 0 if it connected.
_PROBE = ("import socket, sys\n"
          "try:\n"
          "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()\n"
          "except OSError:\n"
          "    sys.exit(1)\n")


class NamespacesUnavailable(RuntimeError):
    """Test hosts cannot be built on this machine; the message says which command failed and why."""


class IpCommandFailed(RuntimeError):
    """An `ip` command failed while changing a network that exists."""


def _ip(*args: str, ok_errors: Sequence[str] = ()) -> str:
    """Run `ip ARGS`; its output. Errors whose message contains one of `ok_errors` are not errors (they
    make removal idempotent: the thing is already gone)."""
    r = subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=30)
    if r.returncode != 0 and not any(e in r.stderr for e in ok_errors):
        raise IpCommandFailed(f"`ip {' '.join(args)}` failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def ip_json(*args: str) -> list[dict[str, Any]]:
    """`ip -j ARGS` parsed (iproute2 prints nothing at all for an empty list of namespaces)."""
    out = _ip("-j", *args).strip()
    return json.loads(out) if out else []


#: What `ip` says when the thing to remove is already gone.
_GONE = ("Cannot find device", "No such file or directory", "No such process")


# ---- process identity and leftovers of dead owners ------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/PID/stat); None if it does not run. Together
    with the pid it names a process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def _owner_alive(pid: int, start_time: str | None = None) -> bool:
    now = _start_time(pid)
    return now is not None and (start_time is None or now == start_time)


def namespace_pids(netns: str) -> list[int]:
    out = _ip("netns", "pids", netns, ok_errors=_GONE)
    return [int(p) for p in out.split()]


def _kill_namespace(netns: str, timeout_s: float = 10.0) -> None:
    """SIGKILL every process inside `netns` (they were all started by this helper's owners), until none is
    left: a namespace with live processes outlives `ip netns del`, and so does its veth."""
    deadline = time.monotonic() + timeout_s
    while pids := namespace_pids(netns):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise IpCommandFailed(f"processes {pids} in namespace {netns} survived SIGKILL for {timeout_s}s")
        time.sleep(0.02)


def _remove(netnses: Iterable[str], links: Iterable[str]) -> None:
    """Remove namespaces (their processes first) and host-side links, by name; what is gone already is fine."""
    netnses, links = list(netnses), list(links)
    for ns in netnses:
        _kill_namespace(ns)
    for link in links:  # veths before bridges: deleting one end of a veth deletes both, synchronously
        if not link.endswith("b"):
            _ip("link", "del", link, ok_errors=_GONE)
    for ns in netnses:
        _ip("netns", "del", ns, ok_errors=_GONE)
    for link in links:
        if link.endswith("b"):
            _ip("link", "del", link, ok_errors=_GONE)


def our_leftovers() -> tuple[list[str], list[str]]:
    """Every namespace and host-namespace link named like a test host's, whoever owns it."""
    netnses = [n["name"] for n in ip_json("netns", "list")]
    links = [link["ifname"] for link in ip_json("link", "show")]
    return [n for n in netnses if NAME_RE.match(n)], [link for link in links if NAME_RE.match(link)]


def _owner_pid(name: str) -> int:
    m = NAME_RE.match(name)
    assert m is not None, name
    return int(m.group(1))


def sweep_stale() -> list[str]:
    """Remove what earlier runs left behind whose owner no longer runs: namespaces (and the processes in
    them), veths, bridges, and /24 claims with their unreachable routes. Returns what it removed."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with _state_lock():
        return _sweep_locked()


def _sweep_locked() -> list[str]:
    claims = _claims()
    started = {int(c["pid"]): c["start_time"] for c in claims}
    netnses, links = our_leftovers()
    dead = [n for n in [*netnses, *links] if not _owner_alive(_owner_pid(n), started.get(_owner_pid(n)))]
    _remove([n for n in netnses if n in dead], [link for link in links if link in dead])
    for claim in claims:
        if not _owner_alive(int(claim["pid"]), claim["start_time"]):
            _release_claim(claim["subnet"])
            dead.append(claim["subnet"])
    return dead


# ---- /24 claims ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _state_lock() -> Iterator[None]:
    with open(STATE_DIR / "lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def claim_file(subnet: str) -> Path:
    """Where the claim of `subnet` (owner pid and start time) is kept."""
    return STATE_DIR / (subnet.replace("/", "_") + ".json")


def _claims() -> list[dict[str, str]]:
    out = []
    for p in STATE_DIR.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads(p.read_text()))
    return out


def _release_claim(subnet: str) -> None:
    _ip("route", "del", "unreachable", subnet, "metric", str(GUARD_METRIC), ok_errors=_GONE)
    claim_file(subnet).unlink(missing_ok=True)


#: /24s this process claimed whose network was closed: reused by its next network, released at exit.
_free_subnets: list[str] = []
_process_subnets: list[str] = []


def _claim_subnet() -> str:
    if _free_subnets:
        return _free_subnets.pop()
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with _state_lock():
        _sweep_locked()
        claimed = {c["subnet"] for c in _claims()}
        routed = [ipaddress.IPv4Network(r["dst"], strict=False) for r in ip_json("-4", "route", "show", "table", "all")
                  if r["dst"] != "default"]
        for sub in list(SUBNET_BLOCK.subnets(new_prefix=24))[1:-1]:
            if str(sub) not in claimed and not any(sub.overlaps(r) for r in routed):
                me = os.getpid()
                claim_file(str(sub)).write_text(json.dumps(
                    {"subnet": str(sub), "pid": me, "start_time": _start_time(me)}))
                _ip("route", "add", "unreachable", str(sub), "metric", str(GUARD_METRIC))
                _process_subnets.append(str(sub))
                return str(sub)
    raise NamespacesUnavailable(f"every /24 of {SUBNET_BLOCK} is claimed or routed on this machine")


# ---- hosts and the network ----------------------------------------------------------------------------


@dataclass
class Host:
    """One test host: a namespace with one address, and the processes started in it."""

    label: str
    netns: str
    address: str
    veth: str  #: the host-namespace end of its link (the bridge port)
    processes: list[ChildProcess] = field(default_factory=list)

    @property
    def exec_prefix(self) -> list[str]:
        """Prepend to a command line to run it inside this host (it execs, so the pid is the command's)."""
        return ["ip", "netns", "exec", self.netns]

    def spawn(self, name: str, cmd: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> ChildProcess:
        """Start `cmd` inside this host in its own process group (so teardown kills its children too)."""
        p = ChildProcess(name, [*self.exec_prefix, *cmd], Path(log_path), env or {})
        self.processes.append(p.start())
        return p

    def run(self, cmd: Sequence[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run `cmd` inside this host to completion; its exit status is the caller's to check."""
        return subprocess.run([*self.exec_prefix, *cmd], capture_output=True, text=True, timeout=timeout_s,
                              check=False)

    def can_connect(self, address: str, port: int, timeout_s: float = 1.0) -> bool:
        """Whether a TCP connection from this host to (address, port) opens within `timeout_s`."""
        r = self.run([sys.executable, "-c", _PROBE, address, str(port), str(timeout_s)], timeout_s + 30)
        return r.returncode == 0

    def kill_processes(self) -> None:
        """SIGKILL every process group started here, and reap them."""
        for p in self.processes:
            if p.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in self.processes:
            if p.proc is not None:
                p.proc.wait(timeout=10)

    def __str__(self) -> str:
        return f"{self.label} ({self.address} in {self.netns})"


_seq = count()
_live: set[HostNetwork] = set()
_hooks_lock = threading.Lock()
_hooks_installed = False
_hooks_pid = os.getpid()


class HostNetwork:
    """Test hosts named by `labels`, joined by one bridge; use as a context manager or call close().

    Path faults are routes inside the namespaces into a sink that drops packets silently:
    - `cut(a, b)` drops everything between a and b; `cut(a, b, both_ways=False)` only what a sends to b.
      One-way is about packets, not connections: b's packets still reach a, but a's answers (SYN-ACKs,
      ACKs, RSTs) to b are dropped, so no TCP connection between them opens or makes progress in either
      direction; b's data may reach a's application while b retransmits, unacknowledged, until it times
      out. Datagrams (UDP) from b to a still arrive.
    - `isolate(h, others)` cuts h from each of `others` (default: every other host); `partition(g1, g2, ...)`
      cuts every pair of hosts in different groups. The host namespace (where the test runs) keeps reaching
      every host; `link_down(h)` is what cuts h from it too: the bridge port goes down, so h is lost to
      everyone, silently, like a machine whose network died.
    """

    def __init__(self, labels: Sequence[str]) -> None:
        if not 1 <= len(labels) <= MAX_HOSTS or len(set(labels)) != len(labels):
            raise ValueError(f"give 1..{MAX_HOSTS} distinct host labels, got {list(labels)}")
        seq = next(_seq)
        if seq >= len(_BASE36) ** 2:
            raise NamespacesUnavailable(f"this process already made {seq} networks; names allow {len(_BASE36) ** 2}")
        self.tag = f"mr{os.getpid()}t{_BASE36[seq // 36] if seq >= 36 else ''}{_BASE36[seq % 36]}"
        self.labels = list(labels)
        self.bridge = f"{self.tag}b"
        self.subnet: str | None = None
        #: the bridge's address: the host namespace as the hosts see it
        self.gateway: str | None = None
        self.hosts: dict[str, Host] = {}
        self._cuts: set[tuple[str, str]] = set()
        self._down: set[str] = set()
        self._closed = False

    # -- building and removing --

    def start(self) -> HostNetwork:
        """Build the bridge and every host; on any failure remove what was made and raise
        NamespacesUnavailable with the failing command and the reason."""
        _install_exit_hooks()
        _live.add(self)
        try:
            self._build()
        except (IpCommandFailed, OSError) as e:
            hint = "" if os.geteuid() == 0 else " (test hosts need root: network namespaces, veths and bridges)"
            try:
                self.close()
            except (IpCommandFailed, OSError) as cleanup:
                hint += f"; removing what was made failed too ({cleanup}), a later run sweeps it"
            raise NamespacesUnavailable(f"cannot build test hosts: {e}{hint}") from e
        return self

    def _build(self) -> None:
        self.subnet = _claim_subnet()
        net = ipaddress.ip_network(self.subnet)
        prefix = net.prefixlen
        self.gateway = str(net.network_address + 1)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{prefix}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, label in enumerate(self.labels, start=1):
            h = Host(label, f"{self.tag}n{i}", str(net.network_address + 1 + i), f"{self.tag}v{i}")
            self.hosts[label] = h
            _ip("netns", "add", h.netns)
            _ip("link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
            _ip("link", "set", h.veth, "master", self.bridge, "up")
            _ip("-n", h.netns, "addr", "add", f"{h.address}/{prefix}", "dev", "eth0")
            _ip("-n", h.netns, "link", "set", "eth0", "up")
            _ip("-n", h.netns, "link", "set", "lo", "up")
            _ip("-n", h.netns, "tuntap", "add", "dev", SINK, "mode", "tun")
            _ip("-n", h.netns, "link", "set", SINK, "up")

    def close(self) -> None:
        """Kill every process in the hosts, remove namespaces, veths and the bridge (by name); idempotent.
        The /24 stays claimed (with its unreachable route) for this process's next network, until exit."""
        if self._closed:
            return
        self._closed = True
        indexes = range(1, len(self.labels) + 1)  # by name: also what a failed start made only partly
        try:
            for h in self.hosts.values():
                h.kill_processes()
        finally:
            try:  # kills whatever still runs in the namespaces too
                _remove([f"{self.tag}n{i}" for i in indexes], [*(f"{self.tag}v{i}" for i in indexes), self.bridge])
            finally:
                _live.discard(self)
                if self.subnet is not None:
                    _free_subnets.append(self.subnet)

    def __enter__(self) -> HostNetwork:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __getitem__(self, label: str) -> Host:
        return self.hosts[label]

    # -- faults --

    def link_down(self, host: Host) -> None:
        """The machine is lost to the network: its bridge port goes down, packets to and from it vanish."""
        _ip("link", "set", host.veth, "down")
        self._down.add(host.label)

    def link_up(self, host: Host) -> None:
        _ip("link", "set", host.veth, "up")
        self._down.discard(host.label)

    def cut(self, a: Host, b: Host, *, both_ways: bool = True) -> None:
        """Drop what `a` sends to `b` (and, both ways, what `b` sends to `a`); see the class docstring for
        what one way means to TCP."""
        if a.label == b.label:
            raise ValueError(f"cannot cut {a} from itself")
        for src, dst in ((a, b), (b, a)) if both_ways else ((a, b),):
            _ip("-n", src.netns, "route", "replace", f"{dst.address}/32", "dev", SINK)
            self._cuts.add((src.label, dst.label))

    def heal(self, a: Host, b: Host) -> None:
        """Restore the path between `a` and `b`, in both directions."""
        for src, dst in ((a, b), (b, a)):
            _ip("-n", src.netns, "route", "del", f"{dst.address}/32", "dev", SINK, ok_errors=_GONE)
            self._cuts.discard((src.label, dst.label))

    def isolate(self, host: Host, others: Iterable[Host] | None = None) -> None:
        """Cut `host` from each of `others` (default: every other host), both ways; e.g. a worker cut from
        the ZooKeeper servers only."""
        for o in (others if others is not None else self.hosts.values()):
            if o.label != host.label:
                self.cut(host, o)

    def partition(self, *groups: Iterable[Host]) -> None:
        """Split hosts into groups that reach only their own group (hosts in no group keep every path)."""
        gs = [list(g) for g in groups]
        for i, g in enumerate(gs):
            for other in gs[i + 1:]:
                for a in g:
                    for b in other:
                        self.cut(a, b)

    def heal_all(self) -> None:
        """Heal every cut and bring every downed link back up."""
        for src, dst in sorted(self._cuts):
            self.heal(self.hosts[src], self.hosts[dst])
        for label in sorted(self._down):
            self.link_up(self.hosts[label])

    @property
    def cuts(self) -> set[tuple[str, str]]:
        """(from, to) label pairs whose packets are dropped now."""
        return set(self._cuts)


# ---- exit hooks ---------------------------------------------------------------------------------------


def close_all() -> None:
    """Close every open network of this process and release its /24 claims (at exit or on SIGTERM).
    A forked child that inherited them leaves them to the process that made them."""
    if os.getpid() != _hooks_pid:
        return
    for net in list(_live):
        with contextlib.suppress(Exception):
            net.close()
    for subnet in _process_subnets:
        with contextlib.suppress(Exception):
            _release_claim(subnet)
    _process_subnets.clear()
    _free_subnets.clear()


def _on_sigterm(previous: signal._HANDLER) -> signal._HANDLER:
    def handler(signum: int, frame: FrameType | None) -> None:
        close_all()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
    return handler


def _install_exit_hooks() -> None:
    global _hooks_installed, _hooks_pid
    with _hooks_lock:
        if _hooks_installed:
            return
        _hooks_installed = True
        _hooks_pid = os.getpid()
        atexit.register(close_all)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _on_sigterm(signal.getsignal(signal.SIGTERM)))
