"""Reactive subscriptions on a real RF=3 cluster: exactly once across a leader kill, fan-out, slow readers."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from conductor.client import Cluster
from conductor.client.subscriptions import Change
from conductor.devcluster import DevCluster
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from pstate.diffs import RESYNC, fold, unpack_event
from tests.integration.cluster_helpers import deploy, groups_of, wait_for
from topology.partitioners import task_for_key

SESSION_TIMEOUT = 4.0
WORD_COUNT = "examples.word_count:WordCount"


@pytest.fixture
def dc(tmp_path: Path) -> Iterator[DevCluster]:
    cluster = DevCluster(tmp_path / "cluster", nodes=3, session_timeout=SESSION_TIMEOUT)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_a_subscription_sees_every_change_exactly_once_across_a_leader_kill(dc: DevCluster) -> None:
    deploy(dc, "WordCount", tasks=4, threads=2, module_ref=WORD_COUNT)
    with Cluster.connect(dc.hosts, timeout_s=30) as cluster:
        spec = cluster._module("WordCount").spec
        group = spec.group_of(task_for_key("cat", spec.tasks))
        changes: list[Change] = []
        sub = cluster.pstate("WordCount", "$$counts").subscribe("cat", lambda ch: changes.append(
            Change(ch.kind, ch.offset, ch.epoch, ch.diffs, ch.value)))
        sub.wait_ready()
        sentences = cluster.depot("WordCount", "*sentences")
        stop = threading.Event()

        def append() -> None:
            while not stop.is_set():
                sentences.append("cat", ack="applied")

        appender = threading.Thread(target=append, daemon=True)
        appender.start()
        try:
            wait_for(lambda: (sub.value or 0) > 150, 60, "changes to flow")
            victim = groups_of(dc, "WordCount")[group].leader
            assert victim is not None
            dc.nodes[victim].kill()
            wait_for(lambda: groups_of(dc, "WordCount")[group].leader not in (None, victim), SESSION_TIMEOUT + 5,
                     "a new leader")
            n = sub.value
            wait_for(lambda: sub.value > n + 150, 60, "changes after the failover")
        finally:
            stop.set()
            appender.join(60)
        final = cluster.pstate("WordCount", "$$counts").select_one("cat")
        wait_for(lambda: sub.value == final, 30, "the subscription to catch up with the applied count")
        sub.close()
        assert sub.streams >= 2, "the subscription must have resumed on the new leader"
        assert changes[0].kind == "value"
        values = [changes[0].value or 0]
        offsets = [changes[0].offset]
        epochs = {changes[0].epoch}
        for ch in changes[1:]:
            assert ch.kind == "diffs", f"no resync expected across a failover, got {ch.kind} at {ch.offset}"
            for kind, keys, v in ch.diffs:
                assert (kind, keys) == ("set", []) and v == values[-1] + 1, (ch.offset, values[-1], ch.diffs)
                values.append(v)
            offsets.append(ch.offset)
            epochs.add(ch.epoch)
        assert offsets == sorted(set(offsets)), "every applied entry's diffs exactly once, in offset order"
        assert values == list(range(values[0], final + 1)), "every change of the key exactly once"
        assert len(epochs) >= 2, "diffs served by both leaderships"


def test_a_thousand_subscribers_on_one_key_all_receive_each_diff(dc: DevCluster) -> None:
    deploy(dc, "WordCount", tasks=4, threads=2, module_ref=WORD_COUNT)
    with Cluster.connect(dc.hosts, timeout_s=30) as cluster:
        counts = cluster.pstate("WordCount", "$$counts")
        received = [0] * 1000

        def counter(i: int) -> object:
            def cb(ch: Change) -> None:
                if ch.kind == "diffs":
                    received[i] += len(ch.diffs)
            return cb

        subs = [counts.subscribe("dog", counter(i)) for i in range(1000)]
        for s in subs:
            s.wait_ready(60)
        sentences = cluster.depot("WordCount", "*sentences")
        for _ in range(20):
            sentences.append("dog", ack="applied")
        wait_for(lambda: all(s.value == 20 for s in subs), 60, "every subscriber at the last value")
        assert received == [20] * 1000
        for s in subs:
            s.close()
    board = subprocess.run([sys.executable, "-m", "examples.leaderboard", "--zk", dc.hosts, "--top", "3", "--once", "0.5"],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert "dog" in board and "20" in board, board


@pytest.mark.slow
def test_a_subscriber_that_stops_reading_is_resynchronised_and_the_leader_stays_bounded(dc: DevCluster) -> None:
    deploy(dc, "WordCount", tasks=4, threads=2, module_ref=WORD_COUNT)
    with Cluster.connect(dc.hosts, timeout_s=30) as cluster:
        spec = cluster._module("WordCount").spec
        leader = groups_of(dc, "WordCount")[0].leader
        assert leader is not None
        address = cluster._leader_address("WordCount", 0, True)
        # a small receive window (no BDP probing): the reader's stall reaches the leader after a few events
        channel = grpc.insecure_channel(address, options=[("grpc.http2.bdp_probe", 0),
                                                          ("grpc.http2.lookahead_bytes", 64 << 10)])
        stream = pbg.ClientStub(channel).Subscribe(pb.SubscribeRequest(
            module="WordCount", pstate="$$counts", task=0, whole=True, from_offset=-1), timeout=240)
        first = next(stream)  # the value; then the stream is not read while the leader applies MBs of diffs
        assert first.events
        value = unpack_event(first.events[0])[2]
        pid = dc.nodes[leader].pid
        rss0 = _rss_kib(pid)
        rng = random.Random(7)
        sentences = cluster.depot("WordCount", "*sentences")
        produced = 0
        for _ in range(150):
            batch = [" ".join(f"w{rng.randrange(10**9)}" for _ in range(400)) for _ in range(10)]
            sentences.append_many(batch, ack="applied")
            produced += sum(len(s) for s in batch)
        grown_mib = (_rss_kib(pid) - rss0) / 1024
        final = {k: v for t in range(spec.tasks) if spec.group_of(t) == 0
                 for k, v in cluster.pstate("WordCount", "$$counts").scan(t)}
        got = 0
        resyncs = 0
        try:
            for msg in stream:  # reading again: what the leader kept, then the resync
                for raw in msg.events:
                    kind, _offset, payload = unpack_event(raw)
                    if kind == RESYNC:
                        value, resyncs = payload, resyncs + 1
                    else:
                        value = fold(value, payload)
                    if kind != RESYNC:
                        got += len(raw)
                if resyncs and value == final:
                    break
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e
        stream.cancel()
        channel.close()
        assert resyncs and value == final, "the slow subscriber gets the current value in a resync (then diffs)"
        # what reached the reader besides the resync: the subscriber's bounded queue and gRPC's flow-control windows
        assert produced > 2 * got, f"the leader kept {got} bytes of events for a stalled reader of {produced}"
        assert grown_mib < 200, f"the leader grew by {grown_mib:.0f} MiB"
