"""Bad input against a real cluster: every case gets a typed error with a gRPC status, nothing dies, nothing changes.

One cluster for the whole file (four worker nodes, the module on three of them,
RF=3). The first tests pin the typed error of each known case; the hypothesis
tests then throw values of every wrong type, unknown names and bad paths at the
client API and random bytes at every method of every service. Each test checks
afterwards that the depots and PStates hold exactly what they held before, that
every group still applies an append (no task thread died), and that no worker
logged a traceback.
"""

from __future__ import annotations

import socket
import string
from collections.abc import Iterator
from typing import Any

import grpc
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conductor.client import Cluster
from conductor.client.errors import ClientError
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.settings import split_hostport
from conductor.wire import admin_pb2, code_pb2
from conductor.wire import millrace_pb2 as pb
from conductor.wire.errors import MillraceError
from conductor.wire.peer_framing import LENGTH, MAX_FRAME_BYTES
from pstate import P
from pstate.errors import InvalidPath, SchemaMismatch
from tests.integration.cluster_helpers import deploy, groups_of, wait_for

MODULE = "Clicks"
FOLLOWERS = ["bob", "cat", "dan"]
#: what a refused input may answer; never UNKNOWN or INTERNAL (a bug), never a dead stream without a status
TYPED = {"INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "PERMISSION_DENIED", "OUT_OF_RANGE",
         "RESOURCE_EXHAUSTED"}
NETWORK = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


class Env:
    """The shared cluster, a client, and the module's leaders' addresses."""

    def __init__(self, dc: DevCluster, cluster: Cluster) -> None:
        self.dc = dc
        self.cluster = cluster
        self.clicks = cluster.depot(MODULE, "*clicks")
        self.raw = cluster.depot(MODULE, "*raw")
        self.visits = cluster.pstate(MODULE, "$$visits")
        self.log_marks = {n: p.log_path.stat().st_size for n, p in dc.nodes.items()}
        #: what the module held once seeded (the last test compares the end of the run with it)
        self.baseline: dict[str, Any] = {}

    def address(self, node: str) -> str:
        return (self.dc.node_dir(node) / "node.address").read_text()

    def leader(self, group: int = 0) -> str:
        st = groups_of(self.dc, MODULE)[group]
        assert st.leader is not None
        return st.leader

    def state(self) -> dict[str, Any]:
        """Everything the module holds, read through the leaders."""
        out: dict[str, Any] = {}
        for depot in (self.clicks, self.raw):
            for task in range(4):
                out[f"{depot.name}/{task}"] = depot.read(task, 0, None, 1 << 30)
        out["$$visits"] = [self.visits.scan(task) for task in range(4)]
        for name in ("*follows", "*posts"):
            for task in range(4):
                out[f"Timeline {name}/{task}"] = self.cluster.depot("Timeline", name).read(task, 0, None, 1 << 30)
        out["$$unread"] = [self.cluster.pstate("Timeline", "$$unread").scan(task) for task in range(4)]
        out["$$timelines"] = [self.cluster.pstate("Timeline", "$$timelines").select(f, P.all()) for f in FOLLOWERS]
        return out

    def new_log(self) -> str:
        text = ""
        for n, p in self.dc.nodes.items():
            with open(p.log_path, "rb") as f:
                f.seek(self.log_marks[n])
                text += f.read().decode(errors="replace")
        return text


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    dc = DevCluster(tmp_path_factory.mktemp("bad-input") / "cluster", nodes=4, session_timeout=4.0,
                    log_level="WARNING")
    dc.start()
    try:
        deploy(dc, MODULE, tasks=4, threads=2)
        deploy(dc, "Timeline", tasks=4, threads=2, module_ref="examples.timeline:Timeline")  # nested schemas, hops
        with Cluster.connect(dc.hosts, timeout_s=20) as cluster:
            e = Env(dc, cluster)
            e.clicks.append_many([{"user": f"u{i}", "id": f"seed{i}"} for i in range(40)])
            e.raw.append_many([f"raw{i}" for i in range(20)])
            timeline = cluster.depot("Timeline", "*follows")
            timeline.append_many([{"author": "ann", "follower": f} for f in FOLLOWERS])
            cluster.depot("Timeline", "*posts").append_many([{"author": "ann", "id": i, "text": "hi"} for i in range(5)])
            e.baseline = e.state()
            yield e
    finally:
        dc.stop()


@pytest.fixture(autouse=True)
def unchanged(env: Env) -> Iterator[None]:
    """Every test here changes no data, kills no task thread and makes no worker log a traceback."""
    before = env.state()
    yield
    assert env.state() == before, "bad input changed the module's data"
    for group in (0, 1):  # every group still appends and applies on its ISR (its task threads live)
        env.raw.append_many([f"alive-{group}-{i}" for i in range(8)], ack="applied")
    text = env.new_log()
    assert "Traceback" not in text and "crashed" not in text, text[-3000:]


def code_of(exc: BaseException) -> str:
    """The gRPC status name a typed error maps to (client side)."""
    return str(getattr(exc, "grpc_code", None) or getattr(exc, "code", None))


def raw_call(env: Env, node: str, method: str, body: bytes, client_stream: bool = False,
             server_stream: bool = False) -> tuple[str, str]:
    """Send `body` as the request of `method` (path "/pkg.Service/Method"); (status name, details)."""
    def identity(b: bytes) -> bytes:
        return b

    with grpc.insecure_channel(env.address(node)) as ch:
        if client_stream and server_stream:
            call: Any = ch.stream_stream(method, request_serializer=identity, response_deserializer=identity)
        elif client_stream:
            call = ch.stream_unary(method, request_serializer=identity, response_deserializer=identity)
        elif server_stream:
            call = ch.unary_stream(method, request_serializer=identity, response_deserializer=identity)
        else:
            call = ch.unary_unary(method, request_serializer=identity, response_deserializer=identity)
        try:
            result = call(iter([body]) if client_stream else body, timeout=10)
            if server_stream:
                list(result)
            return "OK", ""
        except grpc.RpcError as e:
            return e.code().name, e.details() or ""


# ---------------------------------------------------------------------------- the known cases (issue 13, item 8)


def test_a_record_its_partitioner_cannot_take_is_schema_mismatch(env: Env) -> None:
    for call in (lambda: env.clicks.append("hello"), lambda: env.clicks.append_many([{"user": "a"}, "hello"]),
                 lambda: env.clicks.append_async("hello"), lambda: env.clicks.append({"id": 1})):
        with pytest.raises(SchemaMismatch, match=r"\*clicks record.*partitioner"):
            call()


def test_select_with_a_key_of_the_wrong_type_is_schema_mismatch(env: Env) -> None:
    for key in (5, b"u1", 1.5, True, ("u", 1)):
        with pytest.raises(SchemaMismatch, match=r"\$\$visits key: expected str"):
            env.visits.select_one(key)
        with pytest.raises(SchemaMismatch):
            env.visits.select(key)
    assert env.visits.select_one("nobody") is None


def test_a_garbage_protobuf_body_is_invalid_argument_without_a_traceback(env: Env) -> None:
    leader = env.leader()
    code, details = raw_call(env, leader, "/millrace.Client/Append", b"\xff\xff\xff\xff")
    assert code == "INVALID_ARGUMENT" and "not a valid millrace.AppendRequest" in details, details
    code, details = raw_call(env, leader, "/millrace.Client/Select", b"\x0a\x03\xff\xfe\xfd")
    assert code == "INVALID_ARGUMENT" and "bad UTF-8" in details, details
    code, details = raw_call(env, leader, "/millrace.Client/AppendStream", b"\xff\xff", client_stream=True,
                             server_stream=True)
    assert code == "INVALID_ARGUMENT" and "AppendRequest" in details, details


def _append(env: Env, node: str, request: pb.AppendRequest) -> tuple[str, str]:
    return raw_call(env, node, "/millrace.Client/Append", request.SerializeToString())


def test_undecodable_msgpack_is_invalid_argument_with_a_message(env: Env) -> None:
    leader = env.leader(0)
    for bad in (b"\xc1", b"\x92\x01", b"\x01\x02", b"\x81\x91\x01\x02"):  # reserved, short, extra, list key
        code, details = _append(env, leader, pb.AppendRequest(
            module=MODULE, group=0, ack=pb.ACK_APPLIED, appends=[pb.DepotRecords(depot="*raw", task=0,
                                                                                  records=[b"\x01", bad])]))
        assert code == "INVALID_ARGUMENT" and "undecodable bytes" in details, (bad, details)
    code, details = raw_call(env, leader, "/millrace.Client/Select", pb.SelectRequest(
        module=MODULE, pstate="$$visits", task=0, path=b"\xc1", one=True).SerializeToString())
    assert code == "INVALID_ARGUMENT" and "undecodable path: FormatError" in details, details


def test_an_unknown_ack_level_is_refused(env: Env) -> None:
    leader = env.leader(0)
    code, details = _append(env, leader, pb.AppendRequest(
        module=MODULE, group=0, ack=7,  # type: ignore[arg-type]
        appends=[pb.DepotRecords(depot="*raw", task=0, records=[msgpack.packb("x")])]))
    assert code == "INVALID_ARGUMENT" and "unknown ack level 7" in details, details


def peer_link(env: Env, node: str, data: bytes, *, wait_s: float = 0.5) -> str | None:
    """Open a replication link to ``node``, send ``data`` (raw bytes); the node's refusal ("CODE: details"),
    or None if it kept the link open for ``wait_s`` (it took what it was sent)."""
    with Metastore(env.dc.hosts) as ms:
        info = ms.nodes.get(node)
    assert info is not None and info.replication, f"{node} registered no replication address: {info}"
    with socket.create_connection(split_hostport(info.replication), timeout=10) as sock:
        sock.sendall(data)
        sock.settimeout(wait_s)
        try:
            head = sock.recv(LENGTH.size, socket.MSG_WAITALL)
        except TimeoutError:
            return None
        if len(head) < LENGTH.size:
            return ""  # closed without a word
        sock.settimeout(10)
        (n,) = LENGTH.unpack(head)
        return sock.recv(n, socket.MSG_WAITALL).decode()


def framed(frame: pb.PeerFrame) -> bytes:
    data = frame.SerializeToString()
    return LENGTH.pack(len(data)) + data


def test_replication_frames_from_an_unknown_or_non_replica_worker_are_refused(env: Env) -> None:
    st = groups_of(env.dc, MODULE)[0]
    follower = next(r for r in st.replicas if r != st.leader)
    outsider = next(n for n in env.dc.nodes if n not in st.replicas)  # live, registered, not a replica of group 0
    for src in ("nobody", outsider, ""):
        frame = pb.PeerFrame(src=src, dst=follower, messages=[pb.PeerMessage(
            module=MODULE, group=0, replicate=pb.ReplicateMsg(epoch=st.epoch + 5, start=0, apply_offset=-1))])
        reason = peer_link(env, follower, framed(frame))
        assert reason is not None and reason.startswith("PERMISSION_DENIED: ") \
            and "refused replication messages for Clicks/0" in reason, reason
    assert groups_of(env.dc, MODULE)[0].epoch == st.epoch  # the forged epoch changed nothing


def test_a_replica_frame_with_one_message_it_may_not_send_keeps_its_link(env: Env) -> None:
    """Only the refused message is dropped: a peer's link is never cut for the groups it does replicate."""
    groups = [(m, g, st) for m in (MODULE, "Timeline") for g, st in groups_of(env.dc, m).items()]
    case = next(((src, dst, a, b) for a in groups for b in groups for src in a[2].replicas for dst in a[2].replicas
                 if src != dst and dst in b[2].replicas and src not in b[2].replicas), None)
    assert case is not None, f"placement left no group pair to try: {groups}"
    src, dst, (ma, ga, sta), (mb, gb, _stb) = case
    frame = pb.PeerFrame(src=src, dst=dst, messages=[
        pb.PeerMessage(module=ma, group=ga, ack=pb.AckMsg(epoch=sta.epoch - 1, held=-1)),  # stale: ignored
        pb.PeerMessage(module=mb, group=gb, ack=pb.AckMsg(epoch=1, held=-1))])
    assert peer_link(env, dst, framed(frame)) is None


def test_a_replication_frame_that_does_not_decode_or_is_too_long_is_refused(env: Env) -> None:
    node = env.leader(0)
    garbage = b"\xff\xff\xff\xff\x0f"
    reason = peer_link(env, node, LENGTH.pack(len(garbage)) + garbage)
    assert reason is not None and reason.startswith("INVALID_ARGUMENT: ") and "does not decode" in reason, reason
    reason = peer_link(env, node, LENGTH.pack(MAX_FRAME_BYTES + 1))
    assert reason is not None and reason.startswith("INVALID_ARGUMENT: ") and "over the limit" in reason, reason


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.binary(max_size=300))
def test_random_bytes_on_a_replication_link_are_refused_or_ignored(env: Env, data: bytes) -> None:
    """Whatever a link carries, the worker refuses it with a status, waits for more, or takes it: never a crash."""
    reason = peer_link(env, env.leader(0), data, wait_s=0.2)
    assert reason is None or reason.split(":")[0] in TYPED, (data, reason)


# ---------------------------------------------------------------------------- bad input, hypothesis-driven (issue 16)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False),
                    st.text(max_size=20), st.binary(max_size=20))
plain = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=5), inner, max_size=4)),
                     max_leaves=12)


def lacking(field: str) -> st.SearchStrategy[Any]:
    """Values a depot partitioned by ``record[field]`` cannot take: anything but a dict holding `field`."""
    return st.one_of(scalars, st.lists(plain, max_size=4),
                     st.dictionaries(st.text(max_size=5).filter(lambda k: k != field), plain, max_size=4))


not_a_click = lacking("user")
#: values msgpack cannot carry
unencodable = st.one_of(st.integers(min_value=2**64), st.integers(max_value=-(2**63) - 1),
                        st.sets(st.integers(), min_size=1, max_size=3), st.complex_numbers(allow_nan=False),
                        st.builds(object), st.lists(st.builds(object), min_size=1, max_size=2))
not_a_str = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.binary(max_size=10),
                      st.tuples(st.text(max_size=3), st.integers()))


@NETWORK
@given(value=not_a_click, how=st.sampled_from(["append", "many", "async"]))
def test_client_refuses_values_the_depot_cannot_take(env: Env, value: Any, how: str) -> None:
    with pytest.raises(SchemaMismatch) as e:
        if how == "append":
            env.clicks.append(value)
        elif how == "many":
            env.clicks.append_many([{"user": "fine", "id": "x"}, value])
        else:
            env.clicks.append_async(value)
    assert code_of(e.value) == "INVALID_ARGUMENT"


@NETWORK
@given(value=unencodable, depot=st.sampled_from(["*raw", "*clicks"]))
def test_client_refuses_values_msgpack_cannot_carry(env: Env, value: Any, depot: str) -> None:
    d = env.cluster.depot(MODULE, depot)
    record = {"user": "u", "v": value} if depot == "*clicks" else value
    with pytest.raises(ClientError, match="cannot be encoded") as e:
        d.append(record)
    with pytest.raises(ClientError):
        d.append_many(["ok", record] if depot == "*raw" else [record])
    assert code_of(e.value) == "INVALID_ARGUMENT"


@NETWORK
@given(key=not_a_str, one=st.booleans())
def test_pstate_keys_of_every_wrong_type_are_schema_mismatch(env: Env, key: Any, one: bool) -> None:
    with pytest.raises(SchemaMismatch):
        env.visits.select_one(key) if one else env.visits.select(key)


#: every PState of both modules, with the key types it takes (a top-level str, and under it what it holds)
PSTATES = [("Clicks", "$$visits"), ("Timeline", "$$followers"), ("Timeline", "$$timelines"),
           ("Timeline", "$$unread")]


@NETWORK
@given(where=st.sampled_from(PSTATES), key=not_a_str, one=st.booleans())
def test_every_pstate_refuses_top_level_keys_of_the_wrong_type(env: Env, where: tuple[str, str], key: Any,
                                                               one: bool) -> None:
    ps = env.cluster.pstate(*where)
    with pytest.raises(SchemaMismatch, match="key: expected str"):
        ps.select_one(key) if one else ps.select(key)


@NETWORK
@given(sub=st.one_of(st.none(), st.text(max_size=5), st.floats(allow_nan=False), st.binary(max_size=5),
                     st.booleans()), follower=st.sampled_from(FOLLOWERS))
def test_nested_keys_of_the_wrong_type_are_schema_mismatch(env: Env, sub: Any, follower: str) -> None:
    timelines = env.cluster.pstate("Timeline", "$$timelines")  # follower -> post id (int) -> author
    with pytest.raises(SchemaMismatch, match="expected int"):
        timelines.select_one(follower, P.key(sub))
    assert timelines.select_one(follower, P.key(0)) == "ann"


@NETWORK
@given(value=lacking("author"), depot=st.sampled_from(["*follows", "*posts"]))
def test_timeline_depots_refuse_records_without_an_author(env: Env, value: Any, depot: str) -> None:
    with pytest.raises(SchemaMismatch, match="partitioner"):
        env.cluster.depot("Timeline", depot).append(value)


names = st.text(string.ascii_letters + string.digits + "*$_-./ ", min_size=0, max_size=20)


@NETWORK
@given(module=names, depot=names, pstate=names)
def test_unknown_module_depot_and_pstate_names_are_client_errors(env: Env, module: str, depot: str,
                                                                pstate: str) -> None:
    for call in (lambda: env.cluster.depot(module, "*raw"), lambda: env.cluster.pstate(module, "$$visits")):
        if module != MODULE:
            with pytest.raises(ClientError, match="not deployed"):
                call()
    if depot not in ("*clicks", "*raw", "*dead_letters"):
        with pytest.raises(ClientError, match="has no depot"):
            env.cluster.depot(MODULE, depot)
    if pstate != "$$visits":
        with pytest.raises(ClientError, match="has no PState"):
            env.cluster.pstate(MODULE, pstate)


@NETWORK
@given(path=st.one_of(plain, st.just(P.filter(lambda v: True)), st.just(P.view(len))))
def test_bad_paths_are_invalid_path(env: Env, path: Any) -> None:
    with pytest.raises((InvalidPath, SchemaMismatch)):
        env.visits.select("u1", path)


def test_a_huge_record_and_a_huge_batch_with_one_bad_record_change_nothing(env: Env) -> None:
    with pytest.raises((MillraceError, SchemaMismatch, ClientError)) as e:
        env.raw.append(b"x" * (65 << 20))  # above the transport's 64 MiB message limit
    assert code_of(e.value) in TYPED, e.value
    batch: list[Any] = [{"user": f"u{i % 50}", "id": f"big{i}"} for i in range(100_000)]
    batch.append("not a click")
    with pytest.raises(SchemaMismatch):
        env.clicks.append_many(batch)


def _methods() -> list[tuple[str, bool, bool]]:
    out = []
    for module in (pb, admin_pb2, code_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                out.append((f"/{service.full_name}/{m.name}", m.client_streaming, m.server_streaming))
    return out


METHODS = _methods()


def test_random_bytes_to_every_method_of_every_service_get_a_status(env: Env) -> None:
    assert len(METHODS) >= 14  # every RPC; replication links are fuzzed by their own test above
    node = env.leader(0)

    @settings(max_examples=len(METHODS) * 8, deadline=None, suppress_health_check=list(HealthCheck),
              derandomize=True)
    @given(method=st.sampled_from(METHODS), body=st.binary(max_size=200))
    def fuzz(method: tuple[str, bool, bool], body: bytes) -> None:
        name, cs, ss = method
        code, details = raw_call(env, node, name, body, client_stream=cs, server_stream=ss)
        assert code == "OK" or code in TYPED, (name, body, code, details)

    fuzz()


@NETWORK
@given(task=st.integers(0, 2**32 - 1), start=st.integers(0, 2**64 - 1), end=st.integers(0, 2**64 - 1),
       depot=st.sampled_from(["*raw", "*clicks", "*nope", ""]), pstate=st.sampled_from(["$$visits", "$$no", ""]),
       path=st.binary(max_size=40), group=st.integers(0, 2**32 - 1), ack=st.integers(0, 2**31 - 4))
def test_well_formed_requests_with_wild_fields_get_a_status(env: Env, task: int, start: int, end: int, depot: str,
                                                            pstate: str, path: bytes, group: int,
                                                            ack: int) -> None:
    node = env.leader(0)
    calls = [
        ("/millrace.Client/DepotRead", pb.DepotReadRequest(module=MODULE, depot=depot, task=task, start=start,
                                                           end=end)),
        ("/millrace.Client/PartitionInfo", pb.PartitionInfoRequest(module=MODULE, depot=depot, task=task)),
        ("/millrace.Client/Select", pb.SelectRequest(module=MODULE, pstate=pstate, task=task % 8, path=path)),
        ("/millrace.Client/GroupStatus", pb.GroupStatusRequest(module=MODULE, group=group)),
        ("/millrace.Client/Scan", pb.ScanRequest(module=MODULE, pstate=pstate, task=task % 8, start=path, end=path,
                                                 after=path, path=path, limit=task, all_tasks=bool(start % 2))),
        ("/millrace.Client/QueryRun", pb.QueryRunRequest(module=MODULE, group=group % 2, query=depot, calls=path,
                                                         deadline_ms=task)),
        ("/millrace.Client/Progress", pb.ProgressRequest(module=MODULE, group=group, topology=depot)),
        # ack levels beyond the known ones, or records that do not decode: refused before anything is appended
        ("/millrace.Client/Append", pb.AppendRequest(module=MODULE, group=0, ack=3 + ack,  # type: ignore[arg-type]
                                                     appends=[pb.DepotRecords(depot="*raw", task=0,
                                                                              records=[b"x"])])),
        ("/millrace.Client/Append", pb.AppendRequest(module=MODULE, group=0, ack=pb.ACK_APPLIED, appends=[
            pb.DepotRecords(depot="*raw", task=0, records=[b"\xc1" + path])])),
        ("/millrace.Client/Append", pb.AppendRequest(module=MODULE, group=group % 2, appends=[
            pb.DepotRecords(depot=depot or "*raw", task=task, records=[])])),
    ]
    for name, request in calls:
        code, details = raw_call(env, node, name, request.SerializeToString())
        assert code == "OK" or code in TYPED, (name, request, code, details)
    # the Spark source's stream: wild ranges and sizes read what is there or get a status
    stream = pb.DepotStreamRequest(module=MODULE, depot=depot, records=task, first_records=group, max_bytes=ack,
                                   ranges=[pb.DepotRange(task=task, start=start, end=end),
                                           pb.DepotRange(task=task % 8, start=start % 100, end=end % 200)])
    code, details = raw_call(env, node, "/millrace.Client/DepotStream", stream.SerializeToString(), server_stream=True)
    assert code == "OK" or code in TYPED, (stream, code, details)


def test_nothing_changed_and_every_worker_serves_after_all_of_it(env: Env) -> None:
    """Over the whole file: the data seeded at the start, plus only the liveness probes' appends to *raw."""
    now = env.state()
    for key, records in env.baseline.items():
        if key.startswith("*raw/"):
            assert now[key][:len(records)] == records
            assert all(r.startswith("alive-") for r in now[key][len(records):]), now[key]
        else:
            assert now[key] == records, key
    assert all(node.alive() for node in env.dc.nodes.values())
    wait_for(lambda: all(len(st.isr) == 3 for st in groups_of(env.dc, MODULE).values()), 20, "full ISRs")
