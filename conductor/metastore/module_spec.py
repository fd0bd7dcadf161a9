"""The deployable description of a module: what code, how many tasks, how replicated.

A ``ModuleSpec`` is what ``conductor deploy`` sends and what the metastore keeps
at ``/millrace/modules/<module>``. It is validated *before* anything touches
ZooKeeper, because a half-created module with a nonsense replication factor is
much harder to clean up than a refused command. Every error names the bad
field and says how to fix it, since these messages reach operators verbatim
through the CLI.

Dynamic options (``conductor set-option``) live in ``options`` as strings (the
CLI hands us strings and ZooKeeper stores JSON); ``option()`` returns the typed,
defaulted value so callers never parse them again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from conductor.metastore.depot_options import (
    CHECK_INTERVAL_MS,
    COMPACTION,
    DEFAULT_CHECK_INTERVAL_MS,
    DEFAULT_DELETE_RETENTION_MS,
    DELETE_RETENTION_MS,
    RETENTION_BYTES,
    RETENTION_MS,
    depot_settings,
    split_depot_option,
)
from replog.config import (
    DEFAULT_SEGMENT_BYTES,
    FSYNC_MODES,
    MAX_ENTRY_BYTES_CEILING,
    OPTION_NAMES,
    SEGMENT_BYTES_OPTION,
    OptionRuleError,
    ReplicationConfig,
    check_options,
)

# Names become znode path segments and appear in logs and metrics labels, so
# they must be free of "/" and whitespace; 64 characters keeps paths readable.
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
# "package.module:Class" (the class may be nested: "pkg.mod:Outer.Inner").
MODULE_REF_RE = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
)
#: a code version: the sha256 of the module's code artifact, in lowercase hex
CODE_VERSION_RE = re.compile(r"^[0-9a-f]{64}$")
#: the version of a module deployed without shipped code: its class on the workers' path
PATH_VERSION = "path:"

MIN_ISR = "replication.min.isr"
MAX_TIME_LAG_MS = "replication.max.time.lag.millis"
DEPOT_APPEND_TIMEOUT_MS = "replication.depot.append.timeout.millis"
MAX_NEAR_SYNC_MESSAGE_LAG = "replication.max.near.sync.message.lag"
SEGMENT_BYTES = SEGMENT_BYTES_OPTION
MIGRATION_BATCH_KEYS = "migration.batch.keys"
MIGRATION_BATCH_INTERVAL_MS = "migration.batch.interval.millis"
MAX_RECORD_BYTES = "replication.max.record.bytes"
MAX_ENTRY_BYTES = "replication.max.entry.bytes"
#: how fast the replicas a reassignment adds on one worker copy their leaders' checkpoints (far horizon), all
#: of that worker's copies of the module together (conductor.worker.throttle); read at every chunk
REASSIGN_COPY_BYTES_PER_S = "reassignment.copy.bytes.per.second"
#: bench.reassign on 2 shared cores: 64 MiB/s per copy (4 copies at once) put an ack="applied" writer's p99 at
#: 2.8-4.6x its steady one; 16 MiB/s per worker keeps it under 2x
DEFAULT_REASSIGN_COPY_BYTES_PER_S = 16 * 1024 * 1024
FSYNC = "replication.fsync"
FLUSH_MS = "replication.flush.ms"


class SpecError(ValueError):
    """Base of every module-spec validation error (a ``ValueError``: the input was bad)."""


class InvalidSpec(SpecError):
    """A field of the spec is out of range or malformed."""

    def __init__(self, field_name: str, value: object, why: str) -> None:
        self.field = field_name
        self.value = value
        super().__init__(f"invalid module spec: {field_name}={value!r}: {why}")


class UnknownOption(SpecError):
    """The option name is not one the runtime understands; a typo must not be silently stored."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown module option {name!r}; known options: {', '.join(sorted(KNOWN_OPTIONS))}")


class InvalidOption(SpecError):
    """A known option got a value it cannot take."""

    def __init__(self, name: str, value: str, why: str) -> None:
        self.name = name
        self.value = value
        super().__init__(f"invalid value {value!r} for option {name}: {why}")


class NotEnoughNodes(SpecError):
    """The cluster has fewer live nodes than the spec needs; replicas of a group never share a node."""

    def __init__(self, module: str, needed: int, live: list[str], what: str) -> None:
        self.module = module
        self.needed = needed
        self.live = list(live)
        super().__init__(
            f"cannot place module {module}: {what} needs {needed} distinct live node(s) but only "
            f"{len(self.live)} are live {self.live}; start more worker nodes or lower it"
        )


def _positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise InvalidOption(name, raw, "must be a whole number") from None
    if value <= 0:
        raise InvalidOption(name, raw, "must be greater than 0")
    return value


def _non_negative_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise InvalidOption(name, raw, "must be a whole number") from None
    if value < 0:
        raise InvalidOption(name, raw, "must be 0 (no bound) or more")
    return value


def _flag(name: str, raw: str) -> int:
    if raw not in ("0", "1"):
        raise InvalidOption(name, raw, "must be 0 (off) or 1 (on)")
    return int(raw)
def _fsync_mode(name: str, raw: str) -> int:
    """``always`` or ``interval`` (the options carry the mode's code, replog.config.FSYNC_MODES)."""
    if raw not in FSYNC_MODES:
        raise InvalidOption(name, raw, f"must be one of {', '.join(FSYNC_MODES)} (docs/replication.md, "
                            "\"Durability modes\")")
    return FSYNC_MODES[raw]


def _entry_size(name: str, raw: str) -> int:
    value = _positive_int(name, raw)
    if value > MAX_ENTRY_BYTES_CEILING:
        raise InvalidOption(name, raw, f"must be at most {MAX_ENTRY_BYTES_CEILING:,} (half the transport's "
                            "message limit, so every entry can be replicated)")
    return value


@dataclass(frozen=True)
class OptionDef:
    """One known dynamic option: its parser and its default (which may depend on the spec)."""

    name: str
    parse: Callable[[str, str], int]
    default: Callable[[ModuleSpec], int]
    doc: str


#: replication defaults come from the state machine's own config, so they are defined once
_REPLICATION_DEFAULTS = ReplicationConfig()


def _replication_default(name: str) -> Callable[[ModuleSpec], int]:
    value = getattr(_REPLICATION_DEFAULTS, OPTION_NAMES[name])
    return lambda s: int(value)


def _default_min_isr(spec: ModuleSpec) -> int:
    return ReplicationConfig(replication_factor=spec.replication_factor).effective_min_isr


#: the options a module spec carries that reach the replication state machines (ConfigChanged)
REPLICATION_OPTIONS = (MIN_ISR, MAX_TIME_LAG_MS, DEPOT_APPEND_TIMEOUT_MS, MAX_NEAR_SYNC_MESSAGE_LAG,
                       MAX_RECORD_BYTES, MAX_ENTRY_BYTES, FSYNC, FLUSH_MS)

KNOWN_OPTIONS: dict[str, OptionDef] = {
    o.name: o
    for o in (
        OptionDef(MIN_ISR, _positive_int, _default_min_isr,
                  "replicas that must hold an entry before it is applied"),
        OptionDef(MAX_TIME_LAG_MS, _positive_int, _replication_default(MAX_TIME_LAG_MS),
                  "an ISR member that has not confirmed an entry for this long moves to the OSR"),
        OptionDef(DEPOT_APPEND_TIMEOUT_MS, _positive_int, _replication_default(DEPOT_APPEND_TIMEOUT_MS),
                  "how long a depot append waits for its ack before failing (above the max lag, so a "
                  "follower loss delays appends instead of failing them)"),
        OptionDef(MAX_NEAR_SYNC_MESSAGE_LAG, _positive_int, _replication_default(MAX_NEAR_SYNC_MESSAGE_LAG),
                  "followers further behind than this many entries use far-horizon catchup"),
        OptionDef(SEGMENT_BYTES, _positive_int, lambda s: DEFAULT_SEGMENT_BYTES,
                  "replog segment size; retention deletes whole segments, so it is also the granularity "
                  "of the replog's disk use"),
        OptionDef(MIGRATION_BATCH_KEYS, _positive_int, lambda s: 200,
                  "PState values a migration rewrites per replog entry (a bounded pause of the task thread)"),
        OptionDef(MIGRATION_BATCH_INTERVAL_MS, _positive_int, lambda s: 50,
                  "at most one migration batch per task group this often"),
        OptionDef(REASSIGN_COPY_BYTES_PER_S, _positive_int, lambda s: DEFAULT_REASSIGN_COPY_BYTES_PER_S,
                  "bytes per second the replicas a reassignment adds on one worker copy from their leaders "
                  "(far horizon; a budget all of the worker's copies of the module share), so writers keep their "
                  "latency; a change applies to copies in progress"),
        OptionDef(MAX_RECORD_BYTES, _entry_size, _replication_default(MAX_RECORD_BYTES),
                  "largest record an append may carry; larger ones fail with EntryTooLarge"),
        OptionDef(MAX_ENTRY_BYTES, _entry_size, _replication_default(MAX_ENTRY_BYTES),
                  "largest replog entry one append may become (records, topology effects, hop messages); "
                  "larger ones fail with EntryTooLarge before anything is logged"),
        # depot retention (conductor/metastore/depot_options.py): these may also name one depot, as in
        # depot.retention.bytes.*clicks
        OptionDef(RETENTION_MS, _non_negative_int, lambda s: 0,
                  "records older than this many milliseconds are trimmed (0: no bound by age; *dead_letters "
                  "keeps 7 days unless set)"),
        OptionDef(RETENTION_BYTES, _non_negative_int, lambda s: 0,
                  "a depot partition is trimmed to at most this many bytes of records (0: no bound by size)"),
        OptionDef(COMPACTION, _flag, lambda s: 0,
                  "1: keep only the latest record of each key (the depot's hash_by key); offsets never change"),
        OptionDef(DELETE_RETENTION_MS, _positive_int, lambda s: DEFAULT_DELETE_RETENTION_MS,
                  "with compaction, a key's tombstone is deleted this many milliseconds after it was compacted"),
        OptionDef(CHECK_INTERVAL_MS, _positive_int, lambda s: DEFAULT_CHECK_INTERVAL_MS,
                  "how often a leader checks its depots' retention and compacts (a bounded entry each time)"),
        OptionDef(FSYNC, _fsync_mode, _replication_default(FSYNC),
                  "always: every ISR member fsyncs an entry before it is acknowledged; interval: acknowledged "
                  "from the page cache, fsynced every replication.flush.ms (survives any minority losing power)"),
        OptionDef(FLUSH_MS, _positive_int, _replication_default(FLUSH_MS),
                  "interval mode: the longest an acknowledged entry stays in the page cache only"),
    )
}


def option_def(key: str) -> OptionDef | None:
    """The definition of option ``key`` (a per-depot option, ``depot.retention.ms.*clicks``, is its base's)."""
    return KNOWN_OPTIONS.get(split_depot_option(key)[0])


@dataclass(frozen=True)
class ModuleSpec:
    """A module deployment: code reference, partitioning, placement and dynamic options.

    ``threads`` is the number of task groups (the unit of replication); task
    ``t`` belongs to group ``t % threads``. ``workers`` is how many distinct
    nodes the module's replicas are spread over (at least the replication factor).
    ``code`` is the version of the code artifact workers run (its sha256, see
    ``/millrace/modules/<m>/versions``); None means the code is on every
    worker's import path (modules deployed by tests from this repository).
    """

    name: str
    module_ref: str
    tasks: int
    threads: int
    workers: int
    replication_factor: int
    options: dict[str, str] = field(default_factory=dict)
    code: str | None = None
    #: the version the module was deployed with, once an update changed ``code`` (None: ``code`` is it): a
    #: replica that replays its replog from the start runs it until the first switch entry
    initial_code: str | None = None
    #: the module name the code declares, when the module runs under another (``conductor restore --as NAME``); None:
    #: ``name`` is it. Workers check the code against it.
    defined_as: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise a ``SpecError`` describing the first problem; cluster-independent checks only."""
        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
            raise InvalidSpec("name", self.name, "use 1-64 letters, digits, '_', '-' or '.', starting with a letter")
        if not isinstance(self.module_ref, str) or not MODULE_REF_RE.match(self.module_ref):
            raise InvalidSpec("module_ref", self.module_ref, "expected 'package.module:ClassName'")
        for fname in ("tasks", "threads", "workers", "replication_factor"):
            value = getattr(self, fname)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidSpec(fname, value, "must be a whole number of at least 1")
        if self.tasks < self.threads:
            raise InvalidSpec("tasks", self.tasks,
                              f"fewer tasks than threads ({self.threads}) would leave task groups empty; "
                              "use tasks >= threads")
        if self.workers < self.replication_factor:
            raise InvalidSpec("workers", self.workers,
                              f"replicas of a group never share a node, so replication factor "
                              f"{self.replication_factor} needs at least that many workers")
        if self.code is not None and not (isinstance(self.code, str) and CODE_VERSION_RE.match(self.code)):
            raise InvalidSpec("code", self.code, "a code version is the artifact's sha256 in lowercase hex")
        if self.initial_code is not None and not (
                isinstance(self.initial_code, str) and (CODE_VERSION_RE.match(self.initial_code) or (
                    self.initial_code.startswith(PATH_VERSION)
                    and MODULE_REF_RE.match(self.initial_code[len(PATH_VERSION):])))):
            raise InvalidSpec("initial_code", self.initial_code, f"a code version, or {PATH_VERSION}pkg.mod:Class")
        if self.defined_as is not None and not (isinstance(self.defined_as, str) and NAME_RE.match(self.defined_as)):
            raise InvalidSpec("defined_as", self.defined_as, "a module name, as the code declares it")
        if not isinstance(self.options, dict):
            raise InvalidSpec("options", self.options, "must be a mapping of option name to string value")
        for key, value in self.options.items():
            self._check_option(key, value)
        try:  # what each value means, and the values together (defaults included): replog.config's rules
            check_options(self.effective_options(), self.replication_factor)
        except OptionRuleError as e:
            raise InvalidOption(e.name, self.options.get(e.name, f"{e.value} (default)"), e.why) from None

    def _check_option(self, key: str, value: str) -> int:
        definition = option_def(key)
        if definition is None:
            raise UnknownOption(key)
        if not isinstance(value, str):
            raise InvalidOption(key, repr(value), "option values are strings (as typed on the command line)")
        parsed = definition.parse(key, value)
        if key in (MAX_RECORD_BYTES, MAX_ENTRY_BYTES):
            other = MAX_ENTRY_BYTES if key == MAX_RECORD_BYTES else MAX_RECORD_BYTES
            record, entry = (parsed, self.option(other)) if key == MAX_RECORD_BYTES else (self.option(other), parsed)
            if record > entry:
                raise InvalidOption(key, value, f"{MAX_RECORD_BYTES} ({record:,}) must not exceed "
                                    f"{MAX_ENTRY_BYTES} ({entry:,})")
        return parsed

    # ---- options -------------------------------------------------------------------------

    def option(self, key: str) -> int:
        """The typed value of a known option: the stored one, else its default for this spec."""
        definition = option_def(key)
        if definition is None:
            raise UnknownOption(key)
        if key in self.options:
            return definition.parse(key, self.options[key])
        return definition.default(self)

    def replication_config(self) -> ReplicationConfig:
        """What the replicas of this module run with: the replication factor and the replication options.

        min-ISR is passed only when set: unset, each configuration's is its replica count minus one
        (``replog.reassignment.min_isr_for``), so a reassignment that changes the replication factor runs
        the original's and the target's own min-ISR (Rama's default), not the spec's old one."""
        values = {OPTION_NAMES[k]: self.option(k) for k in REPLICATION_OPTIONS if k != MIN_ISR}
        return ReplicationConfig(replication_factor=self.replication_factor,
                                 min_isr=self.option(MIN_ISR) if MIN_ISR in self.options else None, **values)

    def depot_settings(self, depot: str) -> dict[str, int]:
        """``depot``'s retention and compaction settings (see conductor/metastore/depot_options.py)."""
        return depot_settings(self.options, depot, lambda k, v: self._check_option(k, v))

    def effective_options(self) -> dict[str, int]:
        """Every known option with its effective value (what the option rules check)."""
        return {key: self.option(key) for key in sorted(KNOWN_OPTIONS)}

    def shown_options(self) -> dict[str, int | str]:
        """:meth:`effective_options` as an operator types them (what `conductor status` shows)."""
        return {key: self.shown_option(key) for key in self.effective_options()}

    def shown_option(self, key: str) -> int | str:
        """:meth:`option` as an operator types it (replication.fsync's word, not its code); per-depot keys too."""
        value = self.option(key)
        return {code: word for word, code in FSYNC_MODES.items()}[value] if key == FSYNC else value

    def with_option(self, key: str, value: str) -> ModuleSpec:
        """A copy with one option set; validates it so a bad value never reaches ZooKeeper."""
        return replace(self, options={**self.options, key: str(value)})

    # ---- code versions ----------------------------------------------------------------------

    @property
    def version(self) -> str:
        """The code version the module runs (or is switching to): ``code``, or ``path:<module_ref>``."""
        return self.code if self.code is not None else PATH_VERSION + self.module_ref

    @property
    def initial_version(self) -> str:
        """The version its replicas start from: the one deployed, before any switch entry."""
        return self.initial_code if self.initial_code is not None else self.version

    # ---- partitioning ---------------------------------------------------------------------

    def group_of(self, task: int) -> int:
        """The task group that owns ``task``."""
        if not 0 <= task < self.tasks:
            raise ValueError(f"task {task} is outside 0..{self.tasks - 1} of module {self.name}")
        return task % self.threads

    def tasks_of(self, group: int) -> list[int]:
        """The tasks of task group ``group``."""
        if not 0 <= group < self.threads:
            raise ValueError(f"task group {group} is outside 0..{self.threads - 1} of module {self.name}")
        return list(range(group, self.tasks, self.threads))

    def check_placeable(self, live_nodes: list[str]) -> None:
        """Raise ``NotEnoughNodes`` unless this spec fits on the live nodes."""
        if self.replication_factor > len(live_nodes):
            raise NotEnoughNodes(self.name, self.replication_factor, live_nodes,
                                 f"replication factor {self.replication_factor}")
        if self.workers > len(live_nodes):
            raise NotEnoughNodes(self.name, self.workers, live_nodes, f"workers={self.workers}")

    # ---- JSON -----------------------------------------------------------------------------

    def to_json(self) -> bytes:
        """Canonical JSON (sorted keys) so equal specs give equal bytes in ZooKeeper."""
        doc = {
            "name": self.name,
            "moduleRef": self.module_ref,
            "tasks": self.tasks,
            "threads": self.threads,
            "workers": self.workers,
            "replicationFactor": self.replication_factor,
            "options": dict(sorted(self.options.items())),
        }
        if self.code is not None:
            doc["code"] = self.code
        if self.initial_code is not None:
            doc["initialCode"] = self.initial_code
        if self.defined_as is not None:
            doc["definedAs"] = self.defined_as
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> ModuleSpec:
        """Parse and validate; a malformed document raises ``InvalidSpec`` naming what is wrong."""
        try:
            doc: Any = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidSpec("json", raw[:80], f"not valid JSON ({e})") from None
        if not isinstance(doc, Mapping):
            raise InvalidSpec("json", doc, "expected a JSON object")
        missing = [k for k in ("name", "moduleRef", "tasks", "threads", "workers", "replicationFactor")
                   if k not in doc]
        if missing:
            raise InvalidSpec("json", sorted(doc), f"missing field(s) {missing}")
        return cls(
            name=doc["name"],
            module_ref=doc["moduleRef"],
            tasks=doc["tasks"],
            threads=doc["threads"],
            workers=doc["workers"],
            replication_factor=doc["replicationFactor"],
            options=dict(doc.get("options") or {}),
            code=doc.get("code"),
            initial_code=doc.get("initialCode"),
            defined_as=doc.get("definedAs"),
        )
