"""The entry port: each kind of request builds the change set it should, on a real store with the group's code.

One replica of a one-group module, stepped by hand as its task thread would:
build through :class:`EntryPort`, stage at the next offset, apply (feeding the
dataflow). Each test checks what the entry writes once applied.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from conductor.worker.replica_store import ReplicaStore
from pstate import Map, outbox
from pstate.changes import ChangeSet
from pstate.store import META
from topology import Module
from topology.dataflow.group import GroupDataflow
from topology.entries.port import EntryPort
from topology.entries.requests import (
    MICROBATCH_OPS,
    BatchChange,
    BatchCommit,
    CodeSwitch,
    DepotAppend,
    EntryRequest,
    InboundHops,
    MigrationBatch,
    OutboxTrim,
)
from topology.group_code import CODE_KEY, MIGRATE, SWITCH, GroupCode, ModuleCode
from topology.module import Migration

PID = 0x5EED


def plus(n: Any, k: int) -> int:
    return int(n or 0) + k


def as_text(v: Any) -> str:
    return str(v)


def version(migrate: bool) -> Any:
    class M(Module):
        name = "M"

        def define(self, m: Any) -> None:
            m.depot("*events")
            m.depot("*raw")
            if migrate:
                m.pstate("$$counts", Map(str, str), migration=Migration("as-text", as_text))
            else:
                m.pstate("$$counts", Map(str, int))

            @m.stream("*events")
            def count(ctx: Any, r: Any) -> int:
                ctx.update("$$counts", r, plus, 1)
                return 1

    return M.build()


DEFS = {"v1": version(False), "v2": version(True)}


def pack(v: Any) -> bytes:
    return msgpack.packb(v, use_bin_type=True)


class Leader:
    """One leader replica: its store, code, dataflow and entry port; entries built, staged, applied in order."""

    def __init__(self, path: Path) -> None:
        module = ModuleCode("M", "v1", "v2", DEFS.__getitem__)
        for v, d in DEFS.items():
            module.add(v, d)  # prepared, as `conductor update` does
        self.code = GroupCode(module, tasks=1, groups=1, group=0)
        self.rs = ReplicaStore.open_versioned(path, self.code)
        assert self.code.runner is not None
        self.flow = GroupDataflow(self.rs.current, self.code.runner, trim_min=1)
        self.code.flow = self.flow
        self.flow.lead(epoch=1)
        self.port = EntryPort(self.rs.current, self.code)
        self.end = 0

    def build(self, request: EntryRequest) -> tuple[Any, Any]:
        return self.port.build(request)

    def commit(self, builder: Any) -> ChangeSet:
        """Stage ``builder`` at the log end and apply it (with the dataflow, as a leader does)."""
        offset, self.end = self.end, self.end + 1
        payload = self.rs.stage(offset, builder)
        self.rs.apply_entries([(offset, 1, payload)], self.flow)
        return ChangeSet.decode(payload)

    def counts(self, key: str) -> Any:
        return self.rs.store.select_one("$$counts", key)

    def depot(self, name: str) -> list[Any]:
        return [v for _o, v in self.rs.store.depot(name).read(0, 0, None, 1 << 20)]


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    lead = Leader(tmp_path / "state")
    yield lead
    lead.rs.close()


def test_a_depot_append_appends_the_records_and_runs_the_topologies(leader: Leader) -> None:
    builder, (firsts, acks) = leader.build(DepotAppend([("*events", 0, [pack("a"), pack("a"), pack("b")])]))
    assert firsts == [0] and acks == {"count": [1, 1, 1]}
    leader.commit(builder)
    assert leader.depot("*events") == ["a", "a", "b"]
    assert (leader.counts("a"), leader.counts("b")) == (2, 1)


def test_a_retried_producer_sequence_gets_the_original_reply_and_appends_nothing(leader: Leader) -> None:
    request = DepotAppend([("*raw", 0, [pack({"id": 1})])], producer=PID, sequence=1)
    builder, first = leader.build(request)
    leader.commit(builder)
    retry, again = leader.build(DepotAppend([("*raw", 0, [pack({"id": 1})])], producer=PID, sequence=1))
    assert again == first == ([0], {}) and len(retry) == 0 and leader.port.retries_answered == 1
    leader.commit(retry)
    assert leader.depot("*raw") == [{"id": 1}]
    with pytest.raises(ValueError, match="reused sequence 1"):
        leader.build(DepotAppend([("*raw", 0, [pack(1)]), ("*raw", 0, [pack(2)])], producer=PID, sequence=1))


def test_a_batch_commit_interprets_every_op_once(leader: Leader) -> None:
    first, _ = leader.build(DepotAppend([("*events", 0, [pack("b"), pack("b"), pack("c")])]))
    leader.commit(first)
    changes = [BatchChange("$$counts", 0, pack("a"), "set", pack(5)),
               BatchChange("$$counts", 0, pack("b"), "add", pack(3)),
               BatchChange("$$counts", 0, pack("c"), "remove", b""),
               BatchChange("*raw", 0, b"", "append", pack({"id": 7}))]
    assert {c.op for c in changes} == set(MICROBATCH_OPS)
    builder, skipped = leader.build(BatchCommit("ledger", 0, changes))
    assert not skipped and (builder.topology, builder.batch_id) == ("ledger", 0)
    leader.commit(builder)
    assert (leader.counts("a"), leader.counts("b"), leader.counts("c")) == (5, 5, None)
    assert leader.depot("*raw") == [{"id": 7}]
    # a replayed batch (a driver restarted from its checkpoint) builds nothing and is answered skipped
    assert leader.build(BatchCommit("ledger", 0, changes)) == (None, True)
    assert leader.counts("b") == 5


def test_an_unknown_microbatch_op_is_a_value_error_for_that_request(leader: Leader) -> None:
    with pytest.raises(ValueError, match="unknown microbatch change op 'multiply'"):
        leader.build(BatchCommit("ledger", 1, [BatchChange("$$counts", 0, pack("a"), "multiply", pack(2))]))
    builder, skipped = leader.build(BatchCommit("ledger", 1, []))  # the replica goes on: the next one builds
    assert builder is not None and not skipped


def test_a_microbatch_append_to_a_depot_with_topologies_is_a_hop_then_an_inbound_entry_then_a_trim(
        leader: Leader) -> None:
    builder, _ = leader.build(BatchCommit("ledger", 0, [BatchChange("*events", 0, b"", "append", pack("x"))]))
    leader.commit(builder)
    assert leader.depot("*events") == [] and outbox.bounds(leader.rs.store.applied_reader(), 0).pending == 1
    assert leader.flow.outgoing(10) == []  # a group's hops to itself are queued here, never sent
    assert leader.flow.inbound_due(10)
    inbound, result = leader.build(InboundHops(10))
    assert inbound is not None and result is None
    leader.commit(inbound)
    assert leader.depot("*events") == ["x"] and leader.counts("x") == 1  # the record ran through its topology
    assert outbox.inbox_position(leader.rs.store.applied_reader(), 0) == 1
    leader.flow.outgoing(20)
    trim, _ = leader.build(OutboxTrim())
    assert trim is not None
    leader.commit(trim)
    assert outbox.bounds(leader.rs.store.applied_reader(), 0).pending == 0
    assert leader.build(OutboxTrim()) == (None, None)  # nothing left to trim


def test_a_code_switch_then_migration_batches(leader: Leader) -> None:
    first, _ = leader.build(DepotAppend([("*events", 0, [pack("a"), pack("a")])]))
    leader.commit(first)
    assert leader.build(MigrationBatch(10)) == (None, None)  # v1 declares no migration
    switch, result = leader.build(CodeSwitch("v2"))
    assert result is None and switch.topology == SWITCH + "v2"
    cs = leader.commit(switch)
    assert cs.batch_id == 1  # tagged with its own offset when staged
    assert leader.rs.store.applied_reader().get(META, CODE_KEY) == b"v2" and leader.code.applied == "v2"
    assert leader.build(CodeSwitch("v2")) == (None, None)  # the group builds with v2 already
    batch, _ = leader.build(MigrationBatch(10))
    assert batch is not None and batch.topology == MIGRATE
    leader.commit(batch)
    assert leader.counts("a") == "2"
    assert leader.build(MigrationBatch(10)) == (None, None)  # rewritten to the end


def test_a_request_of_no_known_kind_is_a_bug(leader: Leader) -> None:
    with pytest.raises(TypeError, match="not an entry request"):
        leader.build(object())  # type: ignore[arg-type]
