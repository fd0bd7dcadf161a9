"""Test hosts (network namespaces joined by a bridge) do what the multi-host and fault tests rely on:
paths work, the faults cut exactly what they say, and nothing is left behind however the owner ends."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from conductor.cli_views import pid_running
from tests.netns import Host, HostNetwork, claim_file, ip_json, namespace_pids, our_leftovers, sweep_stale

pytestmark = pytest.mark.multihost

REPO = Path(__file__).resolve().parents[2]
PORT = 7000  # every host is its own network stack: the same port is free on each
#: Prints each UDP datagram it receives on argv[1]:argv[2], one per line, flushed.
UDP_RECEIVER = ("import socket, sys\n"
                "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                "s.bind((sys.argv[1], int(sys.argv[2])))\n"
                "while True:\n"
                "    print(s.recv(100).decode(), flush=True)\n")
UDP_SEND = ("import socket, sys\n"
            "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))\n")
#: Builds a network, starts a process (with a child) in its first host, prints what it made, then waits.
OWNER = ("import json, sys, time\n"
         "from tests.netns import HostNetwork\n"
         "net = HostNetwork(['a', 'b']).start()\n"
         "p = net['a'].spawn('sleeper', ['sh', '-c', 'sleep 300 & sleep 300'], sys.argv[1])\n"
         "print(json.dumps({'tag': net.tag, 'subnet': net.subnet, 'pid': p.pid}), flush=True)\n"
         "time.sleep(300)\n")

Build = Callable[[Sequence[str]], HostNetwork]


def listen(host: Host, tmp_path: Path) -> None:
    """A TCP server on host.address:PORT, waited for from the host namespace."""
    host.spawn("listener", [sys.executable, "-m", "http.server", str(PORT), "--bind", host.address],
               tmp_path / f"{host.label}-listener.log")
    deadline = time.monotonic() + 20
    while not host_ns_connects(host.address, PORT):
        assert time.monotonic() < deadline, f"no listener on {host} after 20 s"
        time.sleep(0.05)


def host_ns_connects(address: str, port: int, timeout_s: float = 1.0) -> bool:
    try:
        socket.create_connection((address, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def eventually(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.1)


def leftovers_of(tag: str) -> list[str]:
    netnses, links = our_leftovers()
    return [n for n in [*netnses, *links] if n.startswith(tag)]


def test_hosts_reach_each_other_and_the_host_namespace(host_network: Build, tmp_path: Path) -> None:
    net = host_network(["a", "b", "c"])
    a, b, c = net["a"], net["b"], net["c"]
    assert len({a.address, b.address, c.address, net.gateway}) == 4
    listen(b, tmp_path)
    assert a.can_connect(b.address, PORT) and c.can_connect(b.address, PORT)
    assert host_ns_connects(b.address, PORT)
    with socket.socket() as server:  # the host namespace, as the hosts see it: the bridge's address
        assert net.gateway is not None
        server.bind((net.gateway, 0))
        server.listen()
        assert a.can_connect(net.gateway, server.getsockname()[1])
    for h in (a, b, c):  # nothing inside a host can send beyond its /24
        assert ip_json("-n", h.netns, "route", "show", "default") == []


def test_link_down_cuts_a_host_off_and_up_restores_it(host_network: Build, tmp_path: Path) -> None:
    net = host_network(["a", "b", "c"])
    a, b, c = net["a"], net["b"], net["c"]
    listen(a, tmp_path)
    listen(b, tmp_path)
    net.link_down(b)
    assert not a.can_connect(b.address, PORT), "a reached b while b's link was down"
    assert not b.can_connect(a.address, PORT), "b reached a while b's link was down"
    assert not host_ns_connects(b.address, PORT), "the host namespace reached b while b's link was down"
    assert c.can_connect(a.address, PORT), "the other hosts must keep their paths"
    net.link_up(b)
    # every path comes back, each in its own time: a neighbour entry the probes above left failed is resolved
    # again only when it is next used (make test failed once on the host namespace's, under load)
    eventually(lambda: a.can_connect(b.address, PORT), 10, "a reaches b after its link is back up")
    eventually(lambda: b.can_connect(a.address, PORT), 10, "b reaches a after its link is back up")
    eventually(lambda: host_ns_connects(b.address, PORT), 10, "the host namespace reaches b after its link is back up")


def test_a_cut_drops_only_the_path_between_two_hosts(host_network: Build, tmp_path: Path) -> None:
    net = host_network(["a", "b", "c"])
    a, b, c = net["a"], net["b"], net["c"]
    for h in (a, b, c):
        listen(h, tmp_path)
    net.cut(a, b)
    assert net.cuts == {("a", "b"), ("b", "a")}
    started = time.monotonic()
    assert not a.can_connect(b.address, PORT, timeout_s=1.0)
    assert time.monotonic() - started >= 1.0, "a cut path drops packets silently: the connect must time out"
    assert not b.can_connect(a.address, PORT)
    assert a.can_connect(c.address, PORT) and c.can_connect(b.address, PORT) and b.can_connect(c.address, PORT)
    assert host_ns_connects(a.address, PORT) and host_ns_connects(b.address, PORT)
    net.heal(a, b)
    assert net.cuts == set()
    assert a.can_connect(b.address, PORT) and b.can_connect(a.address, PORT)


def test_a_one_way_cut_drops_what_one_side_sends(host_network: Build, tmp_path: Path) -> None:
    net = host_network(["a", "b"])
    a, b = net["a"], net["b"]
    listen(a, tmp_path)
    listen(b, tmp_path)
    a.spawn("udp", [sys.executable, "-u", "-c", UDP_RECEIVER, a.address, str(PORT)], tmp_path / "a-udp.log")
    b.spawn("udp", [sys.executable, "-u", "-c", UDP_RECEIVER, b.address, str(PORT)], tmp_path / "b-udp.log")
    time.sleep(0.5)  # the receivers bind
    net.cut(a, b, both_ways=False)
    assert net.cuts == {("a", "b")}
    for src, dst, word in ((a, b, "from-a"), (b, a, "from-b")):
        for _ in range(3):
            assert src.run([sys.executable, "-c", UDP_SEND, dst.address, str(PORT), word]).returncode == 0
    eventually(lambda: "from-b" in (tmp_path / "a-udp.log").read_text(), 10, "b's datagrams reach a")
    assert "from-a" not in (tmp_path / "b-udp.log").read_text(), "a's datagrams to b must be dropped"
    # TCP needs both directions: a's answers to b are dropped, so b cannot connect to a either.
    assert not a.can_connect(b.address, PORT) and not b.can_connect(a.address, PORT)


def test_partition_and_isolate(host_network: Build, tmp_path: Path) -> None:
    net = host_network(["a", "b", "c", "d"])
    a, b, c, d = (net[x] for x in "abcd")
    for h in (a, b, c, d):
        listen(h, tmp_path)
    net.partition([a], [b, c])  # d is in no group: it keeps every path
    assert net.cuts == {("a", "b"), ("b", "a"), ("a", "c"), ("c", "a")}
    assert b.can_connect(c.address, PORT) and d.can_connect(a.address, PORT) and d.can_connect(b.address, PORT)
    assert not a.can_connect(b.address, PORT) and not c.can_connect(a.address, PORT)
    net.heal_all()
    net.isolate(d, [a])  # e.g. a worker cut from the ZooKeeper servers only
    assert net.cuts == {("d", "a"), ("a", "d")}
    assert not d.can_connect(a.address, PORT) and d.can_connect(b.address, PORT)
    net.link_down(c)
    net.heal_all()
    assert net.cuts == set()
    assert d.can_connect(a.address, PORT)
    eventually(lambda: d.can_connect(c.address, PORT), 10, "heal_all brings downed links back up")


def test_teardown_removes_everything_even_when_the_body_raises(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="test body failed"), HostNetwork(["a", "b"]) as net:
        tag, subnet = net.tag, net.subnet
        sleeper = net["a"].spawn("sleeper", ["sh", "-c", "sleep 300 & sleep 300"], tmp_path / "sleeper.log")
        eventually(lambda: len(namespace_pids(net["a"].netns)) >= 2, 10, "the sleeper and its child run")
        pids = namespace_pids(net["a"].netns)
        assert sleeper.pid in pids and len(leftovers_of(tag)) == 5  # 2 namespaces, 2 veths, 1 bridge
        raise RuntimeError("test body failed")
    assert leftovers_of(tag) == []
    assert [p for p in pids if pid_running(p)] == []
    # the /24 stays claimed by this process (its unreachable route keeps late packets home) until it exits
    assert subnet is not None and json.loads(claim_file(subnet).read_text())["pid"] == os.getpid()


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """Another process that built a network with a process in it: (the process, what it made)."""
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "sleeper.log")], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        made = json.loads(proc.stdout.readline())
        assert len(leftovers_of(made["tag"])) == 5 and pid_running(made["pid"])
        yield proc, made
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sweep_stale()


def assert_all_gone(made: dict[str, Any]) -> None:
    assert leftovers_of(made["tag"]) == []
    assert not pid_running(made["pid"])
    assert not claim_file(made["subnet"]).exists()
    assert [r for r in ip_json("-4", "route", "show", "table", "all") if r["dst"] == made["subnet"]] == []


def test_sigterm_of_the_owner_removes_everything(owner: tuple[subprocess.Popen[str], dict[str, Any]]) -> None:
    proc, made = owner
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert_all_gone(made)


def test_a_later_run_sweeps_what_a_killed_owner_left(owner: tuple[subprocess.Popen[str], dict[str, Any]]) -> None:
    proc, made = owner
    proc.kill()  # SIGKILL: no handler runs
    proc.wait(timeout=30)
    assert len(leftovers_of(made["tag"])) == 5 and pid_running(made["pid"])
    assert made["subnet"] in sweep_stale()
    assert_all_gone(made)


def test_without_root_building_fails_with_the_reason() -> None:
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    r = subprocess.run([*nobody, sys.executable, "-c", "from tests.netns import HostNetwork\nHostNetwork(['a']).start()"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "NamespacesUnavailable: cannot build test hosts" in r.stderr and "need root" in r.stderr, r.stderr
