"""``millrace.pstate``: a Map PState as a Spark table (batch reads).

    from topology.spark import register
    register(spark)
    counts = (spark.read.format("millrace.pstate")
              .option("cluster", "zk1:2181,zk2:2181").option("module", "WordCount").option("pstate", "$$counts")
              .option("startKey", "a").option("endKey", "n")        # optional: start <= key < end
              .load())

Rows are ``task int, key string, value string``: ``task`` is the task that owns
the key (``task_for_key``, as every PState key is routed), ``key`` is the key
itself when it is a string and its JSON otherwise, ``value`` is the value as
JSON (bytes as base64). ``startKey``/``endKey`` are given as strings and
converted to the PState's key type (int, float, bool; tuple keys as JSON
arrays) when the module's code is importable on the driver.

Why it is shaped this way: a PState lives in one RocksDB per *task group*, not
per task, so one Spark partition per group scans the group's whole key range
exactly once (a scan per task would read every key ``tasks / groups`` times).
Each partition pages through the group's keys with the ``Scan`` call (a page
of at most ``pageSize`` entries and a resume point per reply, see
``pstate/scan.py``) against the group leader, so no reply grows with the PState
and the leader answers from its applied state (a consistent prefix of the
replog per page).
Pages are separate reads: a scan running under concurrent writes sees each
key's value as of its page, like any non-transactional range scan.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from conductor.wire import millrace_pb2 as pb
from pstate import P
from pstate.errors import PStateNotFound
from pstate.query import encode_query
from topology.partitioners import task_for_key
from topology.spark.arrow import to_json
from topology.spark.errors import SourceOptionError
from topology.spark.options import TlsPaths, option, positive_option, required_option, tls_option
from topology.spark.planning import ModuleMeta

SOURCE_NAME = "millrace.pstate"
SCHEMA = "task int, key string, value string"
DEFAULT_PAGE = 20_000


class PStatePartition(InputPartition):
    """One task group's share of a scan: enough to fetch it without ZooKeeper unless the leader moved."""

    def __init__(self, zk_hosts: str, module: str, pstate: str, group: int, tasks: int, start: Any, end: Any,
                 page: int, tls: TlsPaths | None = None) -> None:
        super().__init__(group)
        self.tls = tls
        self.zk_hosts = zk_hosts
        self.module = module
        self.pstate = pstate
        self.group = group
        self.tasks = tasks
        self.start = start
        self.end = end
        self.page = page


def _coerce_key(raw: str | None, key_type: type | None, what: str) -> Any:
    """An option string as a key of the PState's key type (strings stay strings)."""
    if raw is None:
        return None
    if key_type is None or key_type is str:
        return raw
    try:
        if key_type is bool:
            if raw.lower() not in ("true", "false"):
                raise ValueError(raw)
            return raw.lower() == "true"
        if key_type in (int, float):
            return key_type(raw)
        value = json.loads(raw)
        return tuple(value) if isinstance(value, list) else value
    except ValueError:
        raise SourceOptionError(f"option {what}={raw!r} is not a {key_type.__name__} key of this PState") from None


def _key_type(meta: ModuleMeta, pstate: str) -> type | None:
    """The Python type of the PState's keys, if the module code can be loaded here (else keys stay strings)."""
    try:
        from pstate.schema import Map, Scalar

        schema = meta.definition().pstates[pstate].schema
    except Exception:
        return None
    if isinstance(schema, Map):
        k = schema.key
        return k.pytype if isinstance(k, Scalar) else tuple
    return None


class PStateDataSource(DataSource):
    """``spark.read.format("millrace.pstate")``: see the module docstring."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.cluster = required_option(options, "cluster", SOURCE_NAME, "zk1:2181,zk2:2181")
        self.module = required_option(options, "module", SOURCE_NAME, "WordCount")
        self.pstate = required_option(options, "pstate", SOURCE_NAME, "$$counts")
        if not self.pstate.startswith("$$"):
            raise SourceOptionError(f"PState names start with '$$' (e.g. '$${self.pstate}'), got {self.pstate!r}")
        self.start_key = option(options, "startKey")
        self.end_key = option(options, "endKey")
        page = positive_option(options, "pageSize", DEFAULT_PAGE)
        assert page is not None
        self.page = page
        self.tls = tls_option(options, SOURCE_NAME)

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return PStateReader(self, schema)


class PStateReader(DataSourceReader):
    def __init__(self, source: PStateDataSource, schema: StructType) -> None:
        self.src = source
        self.schema = schema

    def partitions(self) -> list[PStatePartition]:
        s = self.src
        with ModuleMeta(s.cluster, s.module, tls=s.tls) as meta:
            kt = _key_type(meta, s.pstate)
            start = _coerce_key(s.start_key, kt, "startKey")
            end = _coerce_key(s.end_key, kt, "endKey")
            # Fail at planning, with the known names, rather than in every Spark task.
            req = pb.SelectRequest(module=s.module, pstate=s.pstate, task=0, path=encode_query(P.count()),
                                   one=True)
            try:
                meta.call(meta.group_of(0), "Select", req)
            except PStateNotFound:
                raise SourceOptionError(f"module {s.module} has no PState {s.pstate!r}; its PStates: "
                                        f"{meta._known('pstates')}") from None
            return [PStatePartition(s.cluster, s.module, s.pstate, g, meta.tasks, start, end, s.page, s.tls)
                    for g in range(meta.groups)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, PStatePartition)
        return _scan(partition, to_arrow_schema(self.schema, timezone="UTC"), self.schema.fieldNames())


def _scan(p: PStatePartition, arrow_schema: pa.Schema, names: list[str]) -> Iterator[pa.RecordBatch]:
    with ModuleMeta(p.zk_hosts, p.module, tls=p.tls) as meta:
        # The group's first task routes the request; the group's store holds the keys of all its tasks (all_tasks).
        task = next(t for t in range(meta.tasks) if meta.group_of(t) == p.group)
        pack = msgpack.Packer(use_bin_type=True).pack
        start = b"" if p.start is None else pack(p.start)
        end = b"" if p.end is None else pack(p.end)
        after = b""
        while True:
            req = pb.ScanRequest(module=p.module, pstate=p.pstate, task=task, all_tasks=True, start=start, end=end,
                                 after=after, limit=p.page)
            reply = meta.call(p.group, "Scan", req)
            pairs: list[Any] = msgpack.unpackb(reply.items, raw=False, strict_map_key=False)
            if pairs:
                yield _batch(pairs, p.tasks, arrow_schema, names)
            if reply.done:
                return
            after = reply.after


def _batch(pairs: list[Any], tasks: int, arrow_schema: pa.Schema, names: list[str]) -> pa.RecordBatch:
    cols: Mapping[str, Any] = {
        "task": pa.array(np.fromiter((task_for_key(_hashable(k), tasks) for k, _v in pairs), dtype=np.int32,
                                     count=len(pairs))),
        "key": pa.array([k if isinstance(k, str) else to_json(k) for k, _v in pairs], type=pa.string()),
        "value": pa.array([to_json(v) for _k, v in pairs], type=pa.string()),
    }
    arrays = [cols[n] if n in cols else pa.nulls(len(pairs), arrow_schema.field(n).type) for n in names]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def _hashable(k: Any) -> Any:
    """msgpack gives tuple keys back as lists; route them as the tuples they were written as."""
    return tuple(_hashable(x) for x in k) if isinstance(k, list) else k
