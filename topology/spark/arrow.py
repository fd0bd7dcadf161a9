"""Decoding depot records into Arrow batches: the general msgpack path and the vectorized :class:`FlatDecoder`."""

from __future__ import annotations

import base64
import functools
import json
import struct
from collections.abc import Sequence
from types import ModuleType
from typing import Any, TypeAlias

import msgpack
import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StringType, StructType

from topology.spark.errors import MillraceSourceError, ValueSchemaMismatch

_flat: ModuleType | None
try:  # FlatDecoder's one-pass kernel, built by setup.py where a C compiler is; else the numpy decoder does it all
    import topology.spark._flat as _flat
except ImportError:  # pragma: no cover - an install without the extension
    _flat = None

META_COLUMNS = ("task", "offset", "epoch")


def _json_default(o: Any) -> Any:
    if isinstance(o, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(o)).decode("ascii")
    if isinstance(o, set | frozenset):
        return sorted(o, key=repr)
    raise TypeError(f"a value of type {type(o).__name__} cannot be written as JSON")


def _json_safe(o: Any) -> Any:
    """Slow path for what the JSON encoder refuses (e.g. tuple map keys): keys become strings."""
    if isinstance(o, dict):
        return {k if isinstance(k, str) else json.dumps(_json_safe(k), default=_json_default): _json_safe(v)
                for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_json_safe(x) for x in o]
    return o


def _make_json_encoder() -> Any:
    """The C JSON encoder called directly: saves ~1 us per record over ``json.dumps`` (Python pays per call)."""
    try:
        from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - CPython always has it
        c_make_encoder = None
    if c_make_encoder is None:  # pragma: no cover
        enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_json_default)
        return enc.encode
    c = c_make_encoder(None, _json_default, encode_basestring, None, ":", ",", False, False, True)

    def encode(o: Any) -> str:
        return "".join(c(o, 0))

    return encode


_TO_JSON = _make_json_encoder()


def to_json(value: Any) -> str:
    """A record as compact JSON (bytes as base64, non-string map keys as their JSON)."""
    try:
        s: str = _TO_JSON(value)
        return s
    except (TypeError, ValueError):
        return json.dumps(_json_safe(value), ensure_ascii=False, separators=(",", ":"), default=_json_default)


_BIGINT_EXT = 1  # pstate's msgpack ext type for ints beyond 64 bits (signed big-endian bytes)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _BIGINT_EXT:
        return int.from_bytes(data, "big", signed=True)
    return msgpack.ExtType(code, data)


#: a reply's records: a list of bytes, or one Arrow binary array over a packed reply's buffer (no copy per record)
Raw: TypeAlias = Sequence[bytes] | pa.BinaryArray


def unpack_reply(reply: Any) -> Raw:
    """The records of a ``DepotReadReply``, packed (``packed`` + ``lengths``) or not (``records``), or of a
    ``DepotStreamReply`` (always packed; no records: no lengths)."""
    if not reply.lengths:
        return reply.records if hasattr(reply, "records") else []
    lengths = np.frombuffer(reply.lengths, "<u4")
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = reply.packed
    if offsets[-1] != len(data) or len(data) >= 1 << 31:
        raise MillraceSourceError(f"depot reply holds {len(data)} packed bytes but its lengths add up to "
                                  f"{offsets[-1]}; the node and this client disagree on the protocol")
    return pa.BinaryArray.from_buffers(pa.binary(), len(lengths),
                                       [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])


def decode_records(raw: Raw) -> list[Any]:
    """Many msgpack records in one C call: prefix their concatenation with a msgpack array32 header.

    Decodes the store's own encoding too (big ints as ext type 1), so records
    served as stored bytes, without a re-encode on the node, read the same.
    """
    if not len(raw):
        return []
    if isinstance(raw, pa.BinaryArray):
        bounds = np.frombuffer(raw.buffers()[1], np.int32, len(raw) + 1, offset=4 * raw.offset)
        body = raw.buffers()[2].slice(int(bounds[0]), int(bounds[-1] - bounds[0]))
        blob = b"".join([b"\xdd", struct.pack(">I", len(raw)), body])
    else:
        blob = b"".join([b"\xdd", struct.pack(">I", len(raw)), *raw])
    records: list[Any] = msgpack.unpackb(blob, raw=False, strict_map_key=False, use_list=True, ext_hook=_ext_hook)
    return records


def _msgpack_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per msgpack type byte: kind, header size, fixed payload size, size of the big-endian length/value.

    ``kind``: 0 = not handled here (a non-empty container, 0xc1), 1 nil, 2 bool, 3 int, 4 float, 5 str,
    6 = other scalars (bin, ext, empty map/array) that can only be skipped. ``hdr``: bytes before the
    payload (type byte, length, ext type). ``nbytes``: for str/bin/ext the size of the length after the
    type byte; for ints and floats the size of the value (0: the value is the type byte itself).
    """
    kind = np.zeros(256, np.int8)
    hdr = np.ones(256, np.int64)
    fixed = np.zeros(256, np.int64)
    nbytes = np.zeros(256, np.int64)
    kind[0x00:0x80] = 3  # positive fixint
    kind[0xE0:0x100] = 3  # negative fixint
    kind[0xA0:0xC0] = 5  # fixstr
    fixed[0xA0:0xC0] = np.arange(32)
    kind[[0x80, 0x90]] = 6  # empty map / array
    kind[0xC0] = 1
    kind[[0xC2, 0xC3]] = 2
    for t, nb, k in ((0xCC, 1, 3), (0xCD, 2, 3), (0xCE, 4, 3), (0xCF, 8, 3), (0xD0, 1, 3), (0xD1, 2, 3),
                     (0xD2, 4, 3), (0xD3, 8, 3), (0xCA, 4, 4), (0xCB, 8, 4)):
        kind[t], fixed[t], nbytes[t] = k, nb, nb
    for t, nb, k in ((0xD9, 1, 5), (0xDA, 2, 5), (0xDB, 4, 5), (0xC4, 1, 6), (0xC5, 2, 6), (0xC6, 4, 6)):
        kind[t], hdr[t], nbytes[t] = k, 1 + nb, nb  # str / bin 8, 16, 32: length, payload
    for t, nb in ((0xC7, 1), (0xC8, 2), (0xC9, 4)):
        kind[t], hdr[t], nbytes[t] = 6, 2 + nb, nb  # ext 8, 16, 32: length, ext type, payload
    for t, size in ((0xD4, 1), (0xD5, 2), (0xD6, 4), (0xD7, 8), (0xD8, 16)):
        kind[t], hdr[t], fixed[t] = 6, 2, size  # fixext: ext type, payload
    return kind, hdr, fixed, nbytes


_MP_KIND, _MP_HDR, _MP_FIXED, _MP_NBYTES = _msgpack_tables()
_MP_SIZE = _MP_HDR + _MP_FIXED  # an item's size, but for the length field of str / bin / ext


_NIL, _BOOL, _INT, _FLOAT, _STR, _OTHER = 1, 2, 3, 4, 5, 6


_VAR_LENGTH = np.zeros(256, bool)
_VAR_LENGTH[[0xD9, 0xDA, 0xDB, 0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9]] = True


_SIGNED = np.zeros(256, bool)
_SIGNED[[0xD0, 0xD1, 0xD2, 0xD3]] = True


#: per type byte, the right shift that leaves a big-endian word's first nb bytes (0 where nb is 0: unused)
_MP_SHIFT = np.where(_MP_NBYTES > 0, 64 - 8 * _MP_NBYTES, 0).astype(np.uint64)


#: per type byte, the size of a fixed-size item, or minus its header for str / bin / ext (its length follows)
_MP_SIZE_OR_VAR = np.where(_VAR_LENGTH, -_MP_HDR, _MP_SIZE)


_INT_BOUNDS = {pa.int8(): 1 << 7, pa.int16(): 1 << 15, pa.int32(): 1 << 31, pa.int64(): 1 << 63}


#: numpy's type of each integer column (``DataType.to_pandas_dtype`` would import pandas: 0.3 s, in a new worker)
_INT_DTYPES = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64}


_EXACT_IN_DOUBLE = 1 << 53


class _Fallback(Exception):
    """The batch holds something the vectorized decoder does not handle: decode it record by record."""


class _Items:
    """msgpack items starting at ``pos``: type byte, kind, total size (header sizes and numbers on demand).

    ``words`` views the buffer as a big-endian uint64 at every byte offset, so the 8 bytes after a type
    byte (a length or a number) are one gather, not eight.
    """

    def __init__(self, buf: np.ndarray, words: np.ndarray, pos: np.ndarray) -> None:
        t = np.take(buf, pos).astype(np.intp)
        self.t = t
        self.buf = buf
        self.pos = pos
        self.words = words
        self.kind = np.take(_MP_KIND, t)
        if not self.kind.all():
            raise _Fallback
        self.size = np.take(_MP_SIZE_OR_VAR, t)
        var = self.size < 0
        if var.any():
            at = np.nonzero(var)[0]
            self.size[at] = np.take(_MP_HDR, t[at]) + self._unsigned(at).astype(np.int64)

    @functools.cached_property
    def nb(self) -> np.ndarray:
        return np.take(_MP_NBYTES, self.t)

    def hdr(self) -> np.ndarray:
        return np.take(_MP_HDR, self.t)

    def _unsigned(self, at: np.ndarray) -> np.ndarray:
        """The nb-byte big-endian unsigned number after the type byte of the items at `at` (nb > 0)."""
        word = self.words[self.pos[at] + 1].astype(np.uint64)
        return word >> (np.uint64(64) - self.nb[at].astype(np.uint64) * np.uint64(8))  # type: ignore[no-any-return]

    def ints(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(int64 value, fits) of integer items; fits is False for a uint64 beyond the int64 range (None: all fit).

        Every item's word is read and shifted, fixints too (then replaced by
        their type byte): cheaper than picking the others out and back in.
        """
        t = self.t
        fixed = np.where(t >= 0xE0, t - 256, t)  # fixints: the type byte is the value
        nb = self.nb
        if not nb.any():
            return fixed, None
        word = self.words[self.pos + 1].astype(np.uint64)
        shift = np.take(_MP_SHIFT, t)
        val = (word >> shift).view(np.int64)
        signed = np.take(_SIGNED, t)
        if signed.any():  # int 8-64: the word as int64, shifted arithmetically, is the value sign-extended
            val = np.where(signed, word.view(np.int64) >> shift.view(np.int64), val)
        val = np.where(nb == 0, fixed, val)
        big = t == 0xCF
        return val, (~(big & (val < 0)) if big.any() else None)  # uint64 at or beyond 1 << 63

    def floats(self) -> np.ndarray:
        """float64 values of float32/float64 items (garbage elsewhere: callers pick the floats)."""
        word = self.words[self.pos + 1].astype(np.uint64)
        f64 = word.view(np.float64)
        with np.errstate(invalid="ignore"):  # bit patterns of non-float items may be signalling NaNs
            f32 = (word >> np.uint64(32)).astype(np.uint32).view(np.float32).astype(np.float64)
        return np.where(self.t == 0xCA, f32, f64)  # type: ignore[no-any-return]


def _name_words(name: bytes) -> list[tuple[int, np.uint64, np.uint64]]:
    """A key name as (offset, mask, big-endian value) per 8-byte chunk, to compare with `words` gathers."""
    out = []
    for off in range(0, max(len(name), 1), 8):
        chunk = name[off:off + 8]
        mask = ((1 << (8 * len(chunk))) - 1) << (64 - 8 * len(chunk)) if chunk else 0
        out.append((off, np.uint64(mask), np.uint64(int.from_bytes(chunk.ljust(8, b"\0"), "big"))))
    return out


def _strings(buf: np.ndarray, first: np.ndarray, lengths: np.ndarray, valid: np.ndarray | None = None,
             nulls: int = 0) -> pa.StringArray:
    """A string array of the byte ranges [first, first + length) of `buf`, checked to be UTF-8."""
    n = len(first)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 1 << 31:
        raise _Fallback
    chars = np.take(buf, _byte_index(first, lengths, offsets[:-1], total))
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    arr = pa.StringArray.from_buffers(n, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(chars), bitmap, nulls)
    if total and chars.max() >= 0x80:  # not all ASCII (which is UTF-8, the offsets being ours)
        try:
            arr.validate(full=True)  # UTF-8, which msgpack's strict decoding insists on (for every str, keys too)
        except pa.ArrowInvalid:
            raise _Fallback from None
    return arr


def _byte_index(first: np.ndarray, lengths: np.ndarray, out_at: np.ndarray, total: int) -> np.ndarray:
    """Where in the buffer each byte of the ranges [first, first + length), back to back, comes from.

    A running sum of steps: 1 within a range, a jump to the next range's
    first byte where it starts (one pass over the bytes, none per range).
    """
    step = np.ones(total, np.int64)
    if total == 0:
        return step
    keep = lengths > 0
    if not keep.all():  # empty ranges take no byte: their jumps would land where the next range's does
        first, lengths, out_at = first[keep], lengths[keep], out_at[keep]
    jumps = np.empty(len(first), np.int64)
    jumps[0] = first[0]
    np.subtract(first[1:], first[:-1] + lengths[:-1] - 1, out=jumps[1:])
    step[out_at] = jumps
    return np.cumsum(step, out=step)


def _numbers(values: np.ndarray, typ: pa.DataType, null: np.ndarray | None = None) -> pa.Array:
    """An Arrow array over a numpy array's memory (booleans packed to bits), null where ``null`` is True.

    Not ``pa.array``: its first call with a numpy array imports pandas (0.25-0.3 s of CPU in every new Spark
    Python worker, on its first batch).
    """
    assert (values.dtype == bool) == pa.types.is_boolean(typ) and values.ndim == 1, (values.dtype, typ)
    assert values.dtype == bool or values.dtype.itemsize * 8 == typ.bit_width, (values.dtype, typ)
    data = np.packbits(values, bitorder="little") if values.dtype == bool else np.ascontiguousarray(values)
    if null is None or not null.any():
        return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(data)], null_count=0)
    bitmap = pa.py_buffer(np.packbits(~null, bitorder="little"))
    return pa.Array.from_buffers(typ, len(values), [bitmap, pa.py_buffer(data)], null_count=int(null.sum()))


def _same_bytes(buf: np.ndarray, words: np.ndarray, pos: np.ndarray, k: int) -> bool:
    """Whether the k bytes at every ``pos`` are those at ``pos[0]``: a gather of the 8-byte words there (of
    single bytes for k <= 2, 6x cheaper each than a word's)."""
    if k <= 2:
        return all(_all_same(np.take(buf, pos + j if j else pos)) for j in range(k))
    for off in range(0, k, 8):
        w = words[pos + off if off else pos].astype(np.uint64)
        if k - off < 8:
            w >>= np.uint64(64 - 8 * (k - off))
        if not _all_same(w):
            return False
    return True


def _all_same(a: np.ndarray) -> bool:
    return bool((a == a[0]).all())


def _check_skipped_strings(items: _Items) -> None:
    """Strings the columns do not take (other fields' values) must still be UTF-8, as msgpack would insist."""
    at = np.nonzero(items.kind == _STR)[0]
    if len(at):
        hdr = np.take(_MP_HDR, items.t[at])
        _strings(items.buf, items.pos[at] + hdr, items.size[at] - hdr)


class FlatDecoder:
    """msgpack dict records straight to Arrow columns, vectorized with numpy: no Python object per record.

    Handles ``valueSchema`` fields of type string, tinyint..bigint, double and
    boolean over records that are maps of scalars, stepping through the k-th
    key/value pair of every record at once (when every record has the same keys
    in the same order, as records appended by one program do, a key is checked
    once per batch). The first thing it does not handle exactly as
    ``pa.array(records, type=struct)`` would (a record that is not a map, a
    nested or big-int value, a value that would need a conversion, a key given
    twice, invalid UTF-8) makes it give the batch up; the caller then decodes
    it the general way (and fails there, with the usual error, if a record does
    not fit). Same columns either way, only slower.
    """

    def __init__(self, fields: Sequence[pa.Field]) -> None:
        self.fields = list(fields)
        self.index = {f.name: i for i, f in enumerate(self.fields)}
        self.names = [(len(f.name.encode()), _name_words(f.name.encode())) for f in self.fields]
        self.usable = bool(self.fields) and all(
            pa.types.is_string(f.type) or f.type in _INT_BOUNDS or pa.types.is_float64(f.type)
            or pa.types.is_boolean(f.type) for f in self.fields)
        one_name_each = len(self.index) == len(self.fields) <= 64  # (the kernel takes the first of a name given twice)
        self.kernel = _Kernel(self.fields) if self.usable and one_name_each and _flat is not None else None

    def decode(self, raw: Raw) -> list[pa.Array] | None:
        """One Arrow array per field, or None when the batch needs the general decoder."""
        if not self.usable or not len(raw):
            return None
        try:
            return self._decode(raw)
        except (_Fallback, IndexError):  # IndexError: malformed records, which the general path reports
            return None

    def _decode(self, raw: Raw) -> list[pa.Array]:
        n = len(raw)
        # contiguous bytes and offsets: a packed reply already is; a list takes one C++ pass
        packed = raw if isinstance(raw, pa.BinaryArray) else pa.array(raw, type=pa.binary())
        if packed.offset != 0:
            raise _Fallback
        bounds32 = np.frombuffer(packed.buffers()[1], np.int32, n + 1)
        size = int(bounds32[-1])
        if bounds32[0] != 0 or size == 0:
            raise _Fallback
        if self.kernel is not None:
            cols = self.kernel.decode(packed.buffers()[2], bounds32, n, size)
            if cols is not None:
                return cols
        bounds = bounds32.astype(np.int64)
        buf = np.zeros(size + 16, np.uint8)  # padded: a word gather 8 bytes past the last type byte stays inside
        buf[:size] = np.frombuffer(packed.buffers()[2], np.uint8, size)
        words = np.ndarray((size + 8,), dtype=">u8", buffer=buf, strides=(1,))
        starts, ends = bounds[:-1], bounds[1:]
        if (ends <= starts).any():
            raise _Fallback
        h = np.take(buf, starts)  # every record must be a map: fixmap, map16 or map32
        h0 = int(h[0])
        tried = (h0 & 0xF0) == 0x80 and _all_same(h)  # the usual: every record a fixmap of as many keys
        if tried:
            same = self._same_keys(buf, words, starts + 1, ends, h0 & 0x0F)
            if same is not None:
                return [self._column(f.type, buf, words, n, same.get(i), None)
                        for i, f in enumerate(self.fields)]
        h = h.astype(np.int64)
        count = np.where((h & 0xF0) == 0x80, h & 0x0F, -1)
        pos = starts + 1
        for code, nb in ((0xDE, 2), (0xDF, 4)):
            m = h == code
            if m.any():
                count[m] = (words[starts[m] + 1].astype(np.uint64) >> np.uint64(64 - 8 * nb)).astype(np.int64)
                pos[m] += nb
        if (count < 0).any():
            raise _Fallback
        if not tried and _all_same(count):
            same = self._same_keys(buf, words, pos, ends, int(count[0]))
            if same is not None:
                return [self._column(f.type, buf, words, n, same.get(i), None)
                        for i, f in enumerate(self.fields)]
        return self._any_keys(buf, words, pos, ends, count)

    def _same_keys(self, buf: np.ndarray, words: np.ndarray, pos: np.ndarray, ends: np.ndarray,
                   count: int) -> dict[int, _Items] | None:
        """Each field's values when every record has the same keys in the same order; None if they differ."""
        found: dict[int, _Items] = {}
        for _e in range(count):
            t0 = int(buf[pos[0]])
            if not 0xA0 <= t0 <= 0xBF or not _same_bytes(buf, words, pos, 1 + (t0 & 0x1F)):
                return None  # not all the same short key (fixstr)
            klen = t0 & 0x1F
            vpos = pos + (1 + klen)
            if (vpos >= ends).any():
                raise _Fallback
            k0 = int(pos[0]) + 1
            items = _Items(buf, words, vpos)
            pos = vpos + items.size
            if (pos > ends).any():
                raise _Fallback
            try:
                i = self.index.get(buf[k0:k0 + klen].tobytes().decode())
            except UnicodeDecodeError:
                raise _Fallback from None
            if i is None:
                _check_skipped_strings(items)
            else:
                if i in found:
                    raise _Fallback  # a key twice in one record (the general decoder keeps the last)
                found[i] = items
        if not (pos == ends).all():
            raise _Fallback
        return found

    def _any_keys(self, buf: np.ndarray, words: np.ndarray, pos: np.ndarray, ends: np.ndarray,
                  count: np.ndarray) -> list[pa.Array]:
        """Records with keys in any order, any subset: find each field's value in each record."""
        n = len(pos)
        where = np.full((len(self.fields), n), -1, np.int64)  # each field's value position per record; -1: absent
        hits = [0] * len(self.fields)
        everyone = np.arange(n)
        for e in range(int(count.max())):
            active = everyone[count > e]
            p = pos[active]
            end = ends[active]
            key = _Items(buf, words, p)
            if not (key.kind == _STR).all():
                raise _Fallback
            vpos = p + key.size
            if (vpos >= end).any():
                raise _Fallback
            kstart = p + key.hdr()
            klen = vpos - kstart
            _strings(buf, kstart, klen)  # keys must be UTF-8 too
            first_words = words[kstart].astype(np.uint64)
            matched = np.zeros(len(p), bool)
            for i, (length, chunks) in enumerate(self.names):
                _off, mask, want = chunks[0]
                hit = np.nonzero((klen == length) & ((first_words & mask) == want))[0]
                for off, mask, want in chunks[1:]:  # long names: only where the key is that long
                    hit = hit[(words[kstart[hit] + off].astype(np.uint64) & mask) == want]
                if len(hit):
                    where[i, active[hit]] = vpos[hit]
                    hits[i] += len(hit)
                    matched[hit] = True
            values = _Items(buf, words, vpos)
            if not matched.all():
                skipped = np.nonzero(~matched)[0]
                _check_skipped_strings(_Items(buf, words, vpos[skipped]))
            nxt = vpos + values.size
            if (nxt > end).any():
                raise _Fallback
            pos[active] = nxt
        if not (pos == ends).all():
            raise _Fallback
        out = []
        for i, f in enumerate(self.fields):
            present = np.nonzero(where[i] >= 0)[0]
            if len(present) != hits[i]:
                raise _Fallback  # a key twice in one record (the general decoder keeps the last)
            items = _Items(buf, words, where[i][present]) if len(present) else None
            out.append(self._column(f.type, buf, words, n, items, None if len(present) == n else present))
        return out

    @staticmethod
    def _column(typ: pa.DataType, buf: np.ndarray, words: np.ndarray, n: int, items: _Items | None,
                present: np.ndarray | None) -> pa.Array:
        """The Arrow array of one field: `items` are its values in the records `present` (None: all)."""
        if items is None:
            return pa.nulls(n, typ)
        set_ = items.kind != _NIL
        dense = present is None and bool(set_.all())  # a non-null value in every record
        if dense:
            rows = None
            kinds = items.kind
            mask = None
            nulls = 0
        else:
            rows = (np.arange(n) if present is None else present)[set_]
            kinds = items.kind[set_]
            mask = np.ones(n, bool)
            mask[rows] = False
            nulls = n - len(rows)

        def spread(values: np.ndarray, dtype: Any) -> np.ndarray:
            """Per-item values as one per record (zero where null)."""
            if rows is None:
                return values.astype(dtype, copy=False)
            out = np.zeros(n, dtype)
            out[rows] = values[set_]
            return out

        if pa.types.is_string(typ):
            if not (kinds == _STR).all():
                raise _Fallback
            hdr = items.hdr()
            return _strings(buf, spread(items.pos + hdr, np.int64), spread(items.size - hdr, np.int64),
                            None if mask is None else ~mask, nulls)
        if pa.types.is_boolean(typ):
            if not (kinds == _BOOL).all():
                raise _Fallback
            return _numbers(spread(items.t == 0xC3, bool), typ, mask)
        ints, fits = items.ints()
        sel_ints = ints if rows is None else ints[set_]
        sel_fits = None if fits is None else fits if rows is None else fits[set_]
        if pa.types.is_float64(typ):
            whole = kinds != _FLOAT
            if not ((kinds == _FLOAT) | (kinds == _INT)).all() or (sel_fits is not None and not sel_fits[whole].all()) \
                    or (np.abs(sel_ints[whole]) >= _EXACT_IN_DOUBLE).any():
                raise _Fallback  # pyarrow refuses ints a double cannot hold exactly
            doubles = np.where(items.kind == _FLOAT, items.floats(), ints.astype(np.float64))
            return _numbers(spread(doubles, np.float64), typ, mask)
        bound = _INT_BOUNDS[typ]
        if not (kinds == _INT).all() or (sel_fits is not None and not sel_fits.all()) \
                or ((sel_ints < -bound) | (sel_ints >= bound)).any():
            raise _Fallback
        return _numbers(spread(ints, _INT_DTYPES[typ]), typ, mask)


class _Kernel:
    """FlatDecoder's fields for its C kernel (``_flat.c``: one pass, a third of the numpy decoder's CPU). It gives up
    on non-ASCII strings and on what the numpy decoder gives up on; the numpy decoder then decides."""

    def __init__(self, fields: Sequence[pa.Field]) -> None:
        self.fields = list(fields)
        encoded = [f.name.encode() for f in self.fields]
        self.names = np.frombuffer(b"".join(encoded) + bytes(8), np.uint8)  # padded: the kernel reads words
        self.name_off = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(e) for e in encoded], out=self.name_off[1:])
        self.kinds = np.array([0 if pa.types.is_string(f.type) else 1 if f.type in _INT_BOUNDS
                               else 2 if pa.types.is_float64(f.type) else 3 for f in self.fields], np.int8)
        bound = [_INT_BOUNDS.get(f.type, 1) for f in self.fields]
        self.lo = np.array([-b for b in bound], np.int64)
        self.hi = np.array([b - 1 for b in bound], np.int64)

    def decode(self, data: pa.Buffer, bounds: np.ndarray, n: int, size: int) -> list[pa.Array] | None:
        """The columns of the n records data[bounds[r]:bounds[r + 1]], or None (the numpy decoder decides)."""
        nf = len(self.fields)
        ivals = np.empty((nf, n), np.int64)
        fvals = np.empty((nf, n), np.float64)
        soffs = np.empty((nf, n + 1), np.int32)
        chars = np.empty((nf, size + 8), np.uint8)
        valid = np.empty((nf, n), np.bool_)
        counts = np.empty(2 * nf, np.int64)
        assert _flat is not None
        if not _flat.decode(data, bounds, self.names, self.name_off, self.kinds, self.lo, self.hi,
                            ivals, fvals, soffs, chars, valid, counts):
            return None
        out: list[pa.Array] = []
        for i, f in enumerate(self.fields):
            nvalid = int(counts[nf + i])
            if nvalid == 0:
                out.append(pa.nulls(n, f.type))
            elif self.kinds[i] == 0:
                bitmap = None if nvalid == n else pa.py_buffer(np.packbits(valid[i], bitorder="little"))
                out.append(pa.StringArray.from_buffers(n, pa.py_buffer(soffs[i]),
                                                       pa.py_buffer(chars[i, :counts[i]]), bitmap, n - nvalid))
            else:
                null = None if nvalid == n else ~valid[i]
                if self.kinds[i] == 1:
                    out.append(_numbers(ivals[i].astype(_INT_DTYPES[f.type], copy=False), f.type, null))
                elif self.kinds[i] == 2:
                    out.append(_numbers(fvals[i], f.type, null))
                else:
                    out.append(_numbers(ivals[i] != 0, f.type, null))
        return out


class RowBuilder:
    """Turns a reply's records into one Arrow record batch in exactly the schema Spark expects.

    Columns named task / offset / epoch get the metadata (wherever they are);
    ``value`` gets the JSON of the record when no ``valueSchema`` was given;
    every other column is a field of the (dict) record.
    """

    def __init__(self, schema: StructType, json_value: bool) -> None:
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.names = schema.fieldNames()
        self.json_value = json_value and "value" in self.names and isinstance(schema["value"].dataType, StringType)
        self.fields = [n for n in self.names if n not in META_COLUMNS and not (self.json_value and n == "value")]
        self.struct = pa.struct([self.arrow_schema.field(n) for n in self.fields]) if self.fields else None
        self.flat = FlatDecoder([self.arrow_schema.field(n) for n in self.fields])

    def batch(self, task: int, first: int, epoch: int, raw: Raw, offsets: np.ndarray | None = None) -> pa.RecordBatch:
        """The rows of one reply: records dense from ``first``, or at ``offsets`` (a key-compacted partition)."""
        n = len(raw)
        assert offsets is None or len(offsets) == n, (n, offsets)
        at = np.arange(first, first + n, dtype=np.int64) if offsets is None else offsets
        cols: dict[str, pa.Array] = {
            "task": _numbers(np.full(n, task, dtype=np.int32), pa.int32()),
            "offset": _numbers(at.astype(np.int64, copy=False), pa.int64()),
            "epoch": _numbers(np.full(n, epoch, dtype=np.int64), pa.int64()),
        }
        flat = None if self.json_value else self.flat.decode(raw)
        if flat is not None:
            cols.update(zip(self.fields, flat, strict=True))
        else:
            cols.update(self._general(task, at, raw))
        arrays = [cols[name] if name in cols else pa.nulls(n, self.arrow_schema.field(name).type)
                  for name in self.names]
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)

    def _general(self, task: int, at: np.ndarray, raw: Raw) -> dict[str, pa.Array]:
        """Every record decoded to Python objects, then converted by pyarrow (JSON, or what FlatDecoder skips)."""
        cols: dict[str, pa.Array] = {}
        records = decode_records(raw)
        if self.json_value:
            enc = to_json
            cols["value"] = pa.array([enc(r) for r in records], type=pa.string())
        if self.struct is not None:
            try:
                structs = pa.array(records, type=self.struct)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
                raise self._mismatch(task, at, records) from None
            for f, arr in zip(self.fields, _children(structs), strict=True):
                cols[f] = arr
        return cols

    def _mismatch(self, task: int, at: np.ndarray, records: list[Any]) -> ValueSchemaMismatch:
        """Find the first record that does not convert, to name it (slow path, only on error)."""
        assert self.struct is not None
        for i, r in enumerate(records):
            if not isinstance(r, dict):
                return ValueSchemaMismatch(
                    f"record at task {task} offset {at[i]} is a {type(r).__name__} ({_short(r)}), but option "
                    f"valueSchema needs dict records; drop valueSchema to read it as JSON in column `value`")
            try:
                pa.array([r], type=self.struct)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
                bad = [f.name for f in self.struct if not _fits(r.get(f.name), f.type)]
                return ValueSchemaMismatch(
                    f"record at task {task} offset {at[i]} does not fit valueSchema {self.struct}: field(s) "
                    f"{bad} of {_short(r)} ({e}); fix valueSchema, or read `value` as JSON without it")
        return ValueSchemaMismatch(f"records of task {task} from offset {at[0] if len(at) else '-'} do not fit "
                                   f"valueSchema {self.struct}")


def _children(structs: pa.StructArray) -> list[pa.Array]:
    """Child arrays of a struct array, with top-level nulls (a None record) pushed down."""
    if structs.null_count:
        flat: list[pa.Array] = structs.flatten()
        return flat
    return [structs.field(i) for i in range(structs.type.num_fields)]


def _fits(value: Any, typ: pa.DataType) -> bool:
    try:
        pa.array([value], type=typ)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return False


def _short(r: Any) -> str:
    s = repr(r)
    return s if len(s) <= 120 else s[:117] + "..."
