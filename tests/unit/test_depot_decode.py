"""millrace.depot's vectorized msgpack -> Arrow decoder against the general (msgpack + pyarrow) path.

The fast path must produce exactly the columns the general path would, or
give the batch up (and then the general path decides, errors included). Every
test runs twice: with FlatDecoder's C kernel (topology/spark/_flat.c) in front
of the numpy decoder, and with the numpy decoder alone (an install without the
kernel, and what decides wherever the kernel gives up).
"""

from __future__ import annotations

import importlib
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DoubleType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from conductor.wire import millrace_pb2 as pb
from topology.spark import arrow
from topology.spark.arrow import FlatDecoder, Raw, RowBuilder, unpack_reply
from topology.spark.errors import MillraceSourceError, ValueSchemaMismatch

SCHEMA = StructType([
    StructField("task", IntegerType()), StructField("offset", LongType()), StructField("epoch", LongType()),
    StructField("s", StringType()), StructField("i", LongType()), StructField("j", IntegerType()),
    StructField("h", ShortType()), StructField("b", ByteType()), StructField("d", DoubleType()),
    StructField("f", BooleanType()), StructField("a_rather_long_field_name", StringType()),
])
FIELDS = ["s", "i", "j", "h", "b", "d", "f", "a_rather_long_field_name", "extra", "x"]


@pytest.fixture(autouse=True, params=["kernel", "numpy"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "numpy":
        monkeypatch.setattr(arrow, "_flat", None)  # FlatDecoders made from here on have no kernel
    return str(request.param)


def general(rb: RowBuilder, raw: list[bytes]) -> dict[str, pa.Array] | type[Exception]:
    try:
        return rb._general(0, 0, raw)
    except Exception as e:  # the kind of error is what is compared
        return type(e)


def same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
                                    for x, y in zip(a, b, strict=True))


def packed(raw: list[bytes]) -> Raw:
    """The records as a node's packed DepotRead reply carries them, unpacked the way the source does."""
    lengths = np.array([len(r) for r in raw], "<u4").tobytes()
    return unpack_reply(pb.DepotReadReply(packed=b"".join(raw), lengths=lengths))


def same_batch(rb: RowBuilder, raw: list[bytes]) -> pa.RecordBatch | type[Exception]:
    """The batch of a list reply, after checking a packed reply of the same records gives exactly the same."""
    out = []
    for form in (raw, packed(raw)):
        try:
            out.append(rb.batch(3, 100, 7, form))
        except Exception as e:
            out.append(type(e))
    assert out[0] == out[1] if isinstance(out[0], type) else out[0].equals(out[1])
    return out[0]


def check(rb: RowBuilder, raw: list[bytes]) -> bool:
    """True if the fast path decoded the batch (and matched the general path), False if it gave up."""
    same_batch(rb, raw)
    fast = rb.flat.decode(raw)
    if fast is None:
        return False
    want = general(rb, raw)
    assert isinstance(want, dict), f"fast path decoded a batch the general path rejects ({want})"
    for name, arr in zip(rb.fields, fast, strict=True):
        arr.validate(full=True)
        assert arr.type == want[name].type, name
        assert arr.null_count == want[name].null_count, name
        assert same(arr.to_pylist(), want[name].to_pylist()), name
    batch = rb.batch(3, 100, 7, raw)
    assert batch.schema == rb.arrow_schema
    assert batch.column("offset").to_pylist() == list(range(100, 100 + len(raw)))
    return True


def test_uniform_records_take_the_fast_path_and_match() -> None:
    rb = RowBuilder(SCHEMA, json_value=False)
    recs = [{"s": f"u{i % 1000}", "i": i * 7919 - 10**6, "j": -i, "h": i % 30000, "b": i % 100 - 50,
             "d": i / 3 if i % 2 else i, "f": i % 3 == 0, "a_rather_long_field_name": "é" * (i % 40),
             "extra": [1, 2] if i % 2 else None} for i in range(5000)]
    # "extra" holds a non-empty list: not skippable, so the fast path gives up; without it, it must decode
    assert not check(rb, [msgpack.packb(r) for r in recs])
    for r in recs:
        r["extra"] = b"\x00\x01" if r["i"] % 2 else 1.5
    assert check(rb, [msgpack.packb(r) for r in recs])


@pytest.mark.parametrize("seed", range(4))
def test_random_batches_match_the_general_path_or_fall_back(seed: int) -> None:
    rng = random.Random(seed)

    def scalar() -> Any:
        return rng.choice([
            None, True, False, rng.randrange(-2**63, 2**63), rng.randrange(2**63, 2**64), rng.randrange(-40, 200),
            rng.randrange(-2**31, 2**31), rng.random() * 1e9, float(rng.randrange(-2**54, 2**54)), "",
            "".join(rng.choice("ab€😀\x00") for _ in range(rng.randrange(40))), "y" * rng.choice([31, 32, 256, 70000]),
            b"\xff\x00", [], {}, [1], {"k": 1}, msgpack.ExtType(1, (2**70).to_bytes(10, "big", signed=True)),
        ])

    typed = {"s": lambda: rng.choice(["u1", "€", "", "x" * 40]), "i": lambda: rng.randrange(-2**63, 2**63),
             "j": lambda: rng.randrange(-2**31, 2**31), "h": lambda: rng.randrange(-2**15, 2**15),
             "b": lambda: rng.randrange(-128, 128), "d": lambda: rng.choice([rng.random(), rng.randrange(-99, 99)]),
             "f": lambda: rng.random() < 0.5, "a_rather_long_field_name": lambda: "v" * rng.randrange(3),
             "extra": scalar, "x": scalar}
    rb = RowBuilder(SCHEMA, json_value=False)
    fast = 0
    for _ in range(300):
        messy = rng.random() < 0.5
        uniform = rng.random() < 0.5
        keys = rng.sample(FIELDS, rng.randrange(len(FIELDS) + 1))
        recs = []
        for _r in range(rng.randrange(1, 40)):
            ks = keys if uniform else rng.sample(FIELDS, rng.randrange(len(FIELDS) + 1))
            recs.append({k: scalar() if messy and rng.random() < 0.1 else None if rng.random() < 0.05
                         else typed[k]() for k in ks})
        raw = [msgpack.packb(r, use_bin_type=True, use_single_float=rng.random() < 0.2) for r in recs]
        if rng.random() < 0.05:
            raw[rng.randrange(len(raw))] = msgpack.packb(rng.choice([1, "x", [1], None, {1: 2}]))
        fast += check(rb, raw)
    assert fast > 50  # the fast path is not vacuous


def test_map16_records_and_map_headers() -> None:
    rb = RowBuilder(SCHEMA, json_value=False)
    recs = [{"s": "a", "i": n, **{f"k{k}": k for k in range(20)}} for n in range(10)]
    assert check(rb, [msgpack.packb(r) for r in recs])


def test_what_the_fast_path_refuses_still_fails_or_decodes_the_general_way() -> None:
    rb = RowBuilder(SCHEMA, json_value=False)
    assert rb.flat.decode([b"\x81\xa1s\xa2\xff\xfe"]) is None  # invalid UTF-8
    with pytest.raises(UnicodeDecodeError):
        rb.batch(0, 0, 1, [b"\x81\xa1s\xa2\xff\xfe"])
    dup = b"\x82\xa1i\x01\xa1i\x02"  # {"i": 1, "i": 2}: msgpack keeps the last
    assert rb.flat.decode([dup]) is None
    assert rb.batch(0, 0, 1, [dup]).column("i").to_pylist() == [2]
    with pytest.raises(ValueSchemaMismatch, match="offset 5"):
        rb.batch(0, 5, 1, [msgpack.packb({"j": 2**40})])
    with pytest.raises(ValueSchemaMismatch):
        rb.batch(0, 0, 1, [msgpack.packb({"s": 1})])


def test_schemas_with_other_types_use_the_general_path() -> None:
    assert not FlatDecoder([pa.field("t", pa.timestamp("us"))]).usable
    assert not FlatDecoder([pa.field("v", pa.float32())]).usable
    assert FlatDecoder([pa.field("v", pa.float64()), pa.field("s", pa.string())]).usable
    assert not RowBuilder(StructType([StructField("task", IntegerType()), StructField("value", StringType())]),
                          json_value=True).flat.usable


def test_corrupt_records_never_crash_the_fast_path() -> None:
    rng = random.Random(7)
    rb = RowBuilder(SCHEMA, json_value=False)
    good = [msgpack.packb({"s": "abc", "i": rng.randrange(-2**40, 2**40), "d": 1.5, "x": "y" * 40}) for _ in range(20)]
    for _ in range(500):
        raw = list(good)
        k = rng.randrange(len(raw))
        b = bytearray(raw[k])
        if rng.random() < 0.5:
            del b[rng.randrange(len(b)):]
        else:
            b[rng.randrange(len(b))] = rng.randrange(256)
        raw[k] = bytes(b)
        if raw[k]:
            check(rb, raw)


def test_packed_replies_decode_like_lists_on_the_json_path_and_check_their_lengths() -> None:
    rb = RowBuilder(StructType([StructField("task", IntegerType()), StructField("offset", LongType()),
                                StructField("epoch", LongType()), StructField("value", StringType())]),
                    json_value=True)
    raw = [msgpack.packb(r) for r in ({"a": 1}, "x", [1, b"\x00"], None, 2**63)]
    batch = same_batch(rb, raw)
    assert isinstance(batch, pa.RecordBatch)
    assert batch.column("value").to_pylist() == ['{"a":1}', '"x"', '[1,"AA=="]', "null", "9223372036854775808"]
    bad = pb.DepotReadReply(packed=b"abc", lengths=np.array([1, 1], "<u4").tobytes())
    with pytest.raises(MillraceSourceError, match="disagree on the protocol"):
        unpack_reply(bad)
    assert list(unpack_reply(pb.DepotReadReply(records=[b"\x01", b"\x02"]))) == [b"\x01", b"\x02"]


def test_a_compacted_reply_carries_each_records_own_offset() -> None:
    """A key-compacted partition's reply has gaps: rows get the offsets it lists, and errors name them."""
    rb = RowBuilder(SCHEMA, json_value=False)
    raw = [msgpack.packb({"s": f"u{i}", "i": i}) for i in range(3)]
    batch = rb.batch(2, 10, 7, raw, np.array([10, 14, 15], dtype=np.int64))
    assert batch.column("offset").to_pylist() == [10, 14, 15]
    assert batch.column("i").to_pylist() == [0, 1, 2]
    with pytest.raises(ValueSchemaMismatch, match="offset 14"):
        rb.batch(2, 10, 7, [raw[0], msgpack.packb({"j": 2**40})], np.array([10, 14], dtype=np.int64))


def test_every_int_encoding_decodes_on_the_fast_path() -> None:
    """Each msgpack int format (fixints, uint 8-64, int 8-64) in one uniform batch: the fast path's shifted
    words and sign extension give what msgpack gives; a uint64 past int64 makes it give the batch up."""
    rb = RowBuilder(SCHEMA, json_value=False)
    values = [0, 5, 127, -1, -32, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, -33, -128, -129,
              -2**15, -2**15 - 1, -2**31, -2**31 - 1, -2**63]
    raw = [msgpack.packb({"s": "é" if v % 3 == 0 else "ab", "i": v, "b": v % 100 - 50}) for v in values]
    assert check(rb, raw)
    assert not check(rb, [*raw, msgpack.packb({"s": "", "i": 2**63, "b": 0})])


def test_a_workers_first_batch_imports_no_pandas() -> None:
    """``pa.array`` over a numpy array imports pandas on its first call: 0.25-0.3 s of CPU on a new Spark Python
    worker's first batch. The fast path builds its arrays over numpy's memory instead."""
    code = ("import sys, msgpack\n"
            "from tests.unit.test_depot_decode import SCHEMA, packed\n"
            "from topology.spark.arrow import RowBuilder\n"
            "before = 'pandas' in sys.modules\n"
            "rb = RowBuilder(SCHEMA, json_value=False)\n"
            "b = rb.batch(0, 0, 1, packed([msgpack.packb({'s': 'x', 'i': i, 'd': 0.5, 'f': True}) for i in range(9)]))\n"
            "assert b.column('i').to_pylist() == list(range(9))\n"
            "print(before, 'pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[2])
    before, after = out.stdout.split()
    assert after == before, out.stdout  # (pyspark itself may have imported it: then there is nothing to see)


def test_the_kernel_is_built() -> None:
    """CI must test the kernel: `make` (an editable install) builds it; an install without a C compiler skips it."""
    assert importlib.import_module("topology.spark._flat"), "topology/spark/_flat.c is not built: run `make`"


def ascii_or_not(rng: random.Random, i: int) -> list[bytes]:
    """A batch of records with strings of every length class; every fourth batch has one non-ASCII string."""
    recs = [{"s": rng.choice(["u1", "", "x" * 40, "y" * 300]) if i % 2 else f"u{k}", "i": k * 7919 - 10**6,
             "d": rng.choice([0.5, k, None]), "f": k % 3 == 0, "x": rng.choice(["abc", 1, None])}
            for k in range(rng.randrange(1, 300))]
    if i % 4 == 0:
        recs[rng.randrange(len(recs))][rng.choice(["s", "x"])] = "é"
    return [msgpack.packb(r, use_single_float=i % 3 == 0) for r in recs]


def test_the_kernel_decodes_ascii_records_exactly_as_the_numpy_decoder(decoder: str) -> None:
    """Where the kernel decodes a batch, the numpy decoder gives the same columns; a non-ASCII string anywhere (a
    skipped field's too) makes the kernel give the batch up to the numpy decoder."""
    if decoder == "numpy":
        return
    rng = random.Random(11)
    rb = RowBuilder(SCHEMA, json_value=False)
    assert rb.flat.kernel is not None
    decoded = 0
    for i in range(60):
        raw = packed(ascii_or_not(rng, i))
        assert isinstance(raw, pa.BinaryArray)
        bounds = np.frombuffer(raw.buffers()[1], np.int32, len(raw) + 1)
        kernel = rb.flat.kernel.decode(raw.buffers()[2], bounds, len(raw), int(bounds[-1]))
        assert (kernel is None) == (i % 4 == 0), i  # (every fourth batch has a non-ASCII string)
        rb.flat.kernel, keep = None, rb.flat.kernel
        numpy_only = rb.flat.decode(raw)
        rb.flat.kernel = keep
        assert numpy_only is not None
        if kernel is not None:
            decoded += 1
            for a, b in zip(kernel, numpy_only, strict=True):
                a.validate(full=True)
                assert a.equals(b)
    assert decoded > 20


def test_the_kernel_checks_its_buffers(decoder: str) -> None:
    if decoder == "numpy":
        return
    flat = importlib.import_module("topology.spark._flat")
    assert FlatDecoder([pa.field("s", pa.string())] * 2).kernel is None  # a name twice: the numpy decoder's index
    assert FlatDecoder([pa.field(f"c{i}", pa.int64()) for i in range(65)]).kernel is None
    k = FlatDecoder([pa.field("s", pa.string())]).kernel
    assert k is not None
    data = msgpack.packb({"s": "ab"})
    bounds = np.array([0, len(data)], np.int32)
    args = [data, bounds, k.names, k.name_off, k.kinds, k.lo, k.hi, np.empty(1, np.int64), np.empty(1),
            np.empty(2, np.int32), np.empty(len(data) + 8, np.uint8), np.empty(1, np.bool_), np.empty(2, np.int64)]
    assert flat.decode(*args)
    for i, short in ((10, np.empty(len(data) + 7, np.uint8)), (0, data[:-1]), (2, k.names[:-1]),
                     (8, np.empty(0))):
        with pytest.raises(ValueError):
            flat.decode(*args[:i], short, *args[i + 1:])
    with pytest.raises(TypeError):  # outputs must be writable
        flat.decode(*args[:7], bytes(8), *args[8:])


def test_the_kernel_never_misreads_corrupt_records(decoder: str) -> None:
    """C reads client bytes here: flipped, dropped and inserted bytes anywhere in ASCII batches (so the kernel
    does not give them up for their strings) must decode as the general path does, or be given up; never a
    crash or a read past a record."""
    rng = random.Random(29)
    rb = RowBuilder(SCHEMA, json_value=False)
    decoded = 0
    for i in range(1_500):
        recs = [{"s": rng.choice(["", "ab", "x" * 31, "y" * 300]), "i": rng.randrange(-2**40, 2**40),
                 "d": rng.choice([1.5, 7, None]), "f": rng.random() < 0.5, "x": rng.choice(["y", 3, None])}
                for _ in range(rng.randrange(1, 12))]
        raw = [bytearray(msgpack.packb(r, use_single_float=i % 2 == 0)) for r in recs]
        for _ in range(rng.randrange(1, 4)):
            b = raw[rng.randrange(len(raw))]
            if not b:
                continue
            at, what = rng.randrange(len(b)), rng.random()
            if what < 0.4:
                b[at] = rng.randrange(256)
            elif what < 0.6:
                del b[at:]
            elif what < 0.8:
                del b[at]
            else:
                b.insert(at, rng.randrange(256))
        records = [bytes(b) for b in raw]
        if all(records):
            decoded += check(rb, records)
    assert decoded > 100  # (most corruptions are given up; many still decode, e.g. a changed digit)
