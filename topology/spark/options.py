"""The options of ``millrace.depot`` (and the parsing ``millrace.pstate`` shares): validated once, typed."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from topology.spark.errors import SourceOptionError

SOURCE_NAME = "millrace.depot"


BASE_SCHEMA = "task int, offset long, epoch long"


JSON_SCHEMA = BASE_SCHEMA + ", value string"


DEFAULT_RECORDS_PER_PARTITION = 1_000_000


#: one reply is one Arrow batch (``fetch.ARROW_BATCH_ROWS``): the node serves a request while the one before is
#: decoded, and Spark gets the first rows sooner (measured: 32,768 waited longer for replies, same CPU)
DEFAULT_RECORDS_PER_REQUEST = 8_192


DEFAULT_MAX_BYTES_PER_REQUEST = 16 << 20


EARLIEST = -2


LATEST = -1


def option(options: Mapping[str, str], name: str) -> str | None:
    """Options arrive case-insensitive from Spark but as plain dicts from tests and helpers."""
    low = name.lower()
    for k, v in options.items():
        if k.lower() == low:
            return v
    return None


#: the TLS file paths a read passes to its executors (ca, cert, key): they read the same files on their machine
TlsPaths = tuple[str, str, str]


def tls_option(options: Mapping[str, str], source: str) -> TlsPaths | None:
    """``tlsCa``, ``tlsCert`` and ``tlsKey`` (PEM paths, the same on every executor's machine), or none."""
    given = {n: option(options, n) for n in ("tlsCa", "tlsCert", "tlsKey")}
    if not any(given.values()):
        return None
    missing = [n for n, v in given.items() if not v]
    if missing:
        raise SourceOptionError(f"{source}: give all of tlsCa, tlsCert and tlsKey for a secured cluster "
                                f"(missing {', '.join(missing)}); see docs/security.md")
    ca, cert, key = (str(given[n]).strip() for n in ("tlsCa", "tlsCert", "tlsKey"))
    return ca, cert, key


def required_option(options: Mapping[str, str], name: str, source: str, example: str) -> str:
    v = option(options, name)
    if v is None or not v.strip():
        raise SourceOptionError(f"{source} needs option {name!r}, e.g. .option({name!r}, {example!r})")
    return v.strip()


def positive_option(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = option(options, name)
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n <= 0:
        raise SourceOptionError(f"option {name} must be a whole number > 0, got {raw!r}")
    return n


@dataclass(frozen=True)
class DepotOptions:
    """The validated options of one ``millrace.depot`` read."""

    cluster: str
    module: str
    depot: str
    starting_offsets: str | dict[int, int] = "earliest"
    max_records_per_trigger: int | None = None
    value_schema: str | None = None
    records_per_partition: int = DEFAULT_RECORDS_PER_PARTITION
    min_partitions: int | None = None
    records_per_request: int = DEFAULT_RECORDS_PER_REQUEST
    max_bytes_per_request: int = DEFAULT_MAX_BYTES_PER_REQUEST
    #: mutual TLS with these files (None: plaintext)
    tls: TlsPaths | None = None
    #: start at each task's first record at or after this time (ms; instead of startingOffsets)
    starting_timestamp: int | None = None
    #: batch reads: end before these offsets (``latest``: each task's applied end), or before this time (ms)
    ending_offsets: str | dict[int, int] = "latest"
    ending_timestamp: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> DepotOptions:
        cluster = required_option(options, "cluster", SOURCE_NAME, "zk1:2181,zk2:2181")
        module = required_option(options, "module", SOURCE_NAME, "Clicks")
        depot = required_option(options, "depot", SOURCE_NAME, "*clicks")
        if not depot.startswith("*"):
            raise SourceOptionError(f"depot names start with '*' (e.g. '*{depot}'), got {depot!r}")
        raw_start = (option(options, "startingOffsets") or "earliest").strip()
        starting: str | dict[int, int]
        if raw_start.lower() in ("earliest", "latest"):
            starting = raw_start.lower()
        else:
            starting = _parse_starting_json(raw_start)
        value_schema = option(options, "valueSchema")
        if value_schema is not None and not value_schema.strip():
            raise SourceOptionError("option valueSchema is empty; give a DDL string like 'user string, n long' "
                                    "or leave it out to get the record as JSON in column `value`")
        mrpt = positive_option(options, "maxRecordsPerTrigger", None)
        rpp = positive_option(options, "recordsPerPartition", DEFAULT_RECORDS_PER_PARTITION)
        minp = positive_option(options, "minPartitions", None)
        rpr = positive_option(options, "recordsPerRequest", DEFAULT_RECORDS_PER_REQUEST)
        mbr = positive_option(options, "maxBytesPerRequest", DEFAULT_MAX_BYTES_PER_REQUEST)
        assert rpp is not None and rpr is not None and mbr is not None
        if mbr > 48 << 20:
            raise SourceOptionError(f"maxBytesPerRequest must be at most {48 << 20} (gRPC messages are capped "
                                    f"at 64 MiB), got {mbr}")
        start_ts, end_ts = _time_option(options, "startingTimestamp"), _time_option(options, "endingTimestamp")
        if start_ts is not None and option(options, "startingOffsets") is not None:
            raise SourceOptionError("give startingOffsets or startingTimestamp, not both")
        raw_end = (option(options, "endingOffsets") or "latest").strip()
        if end_ts is not None and option(options, "endingOffsets") is not None:
            raise SourceOptionError("give endingOffsets or endingTimestamp, not both")
        ending = "latest" if raw_end.lower() == "latest" else _parse_starting_json(raw_end, "endingOffsets")
        return cls(cluster, module, depot, starting, mrpt, value_schema.strip() if value_schema else None,
                   rpp, minp, rpr, mbr, tls_option(options, SOURCE_NAME), start_ts, ending, end_ts)

    @property
    def bounded(self) -> bool:
        """True when the read names an end (``endingOffsets``/``endingTimestamp``): batch reads only."""
        return self.ending_timestamp is not None or self.ending_offsets != "latest"

    def schema_ddl(self) -> str:
        return f"{BASE_SCHEMA}, {self.value_schema}" if self.value_schema else JSON_SCHEMA


def _time_option(options: Mapping[str, str], name: str) -> int | None:
    """A time option: whole milliseconds since the epoch (as Kafka's source takes them)."""
    raw = option(options, name)
    if raw is None:
        return None
    try:
        ms = int(raw.strip())
    except ValueError:
        ms = -1
    if not 0 <= ms < 1 << 63:
        raise SourceOptionError(f"option {name} is a time in milliseconds since the epoch, e.g. "
                                f"{name}=1767225600000 for 2026-01-01T00:00:00Z; got {raw!r}")
    return ms


def _parse_starting_json(raw: str, name: str = "startingOffsets") -> dict[int, int]:
    hint = (f'{name} must be "earliest", "latest" or JSON like {{"0": 120, "1": -2}} '
            "(task -> offset; -2 = earliest, -1 = latest)")
    if name == "endingOffsets":
        hint = 'endingOffsets must be "latest" or JSON like {"0": 120, "1": -1} (task -> offset; -1 = latest)'

    try:
        doc = json.loads(raw)
    except ValueError:
        raise SourceOptionError(f"{hint}; got {raw!r}") from None
    if not isinstance(doc, dict):
        raise SourceOptionError(f"{hint}; got {raw!r}")
    out: dict[int, int] = {}
    for k, v in doc.items():
        if isinstance(v, dict):  # accept our own streaming offset format too
            v = v.get("offset")
        try:
            task = int(k)
        except ValueError:
            raise SourceOptionError(f"{hint}; key {k!r} is not a task number") from None
        if not isinstance(v, int) or isinstance(v, bool) or v < -2:
            raise SourceOptionError(f"{hint}; offset {v!r} for task {k} is not an offset >= -2")
        out[task] = v
    return out
