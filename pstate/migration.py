"""PState migrations in place (Rama's instant migrations): migrate on read, rewrite in the background.

When an update changes a PState's value schema, its stored values stay as
they are at the switch. Two things make that invisible:

* **reads migrate**: every read of the PState goes through a
  :class:`MigratingReader`, which runs the migration function over each
  top-level value it returns (queries, topologies' reads and transforms alike);
* **a background rewrite** (:func:`rewrite_batch`) migrates a bounded batch of
  stored values per replog entry, from a cursor kept in ``_meta`` in the same
  entry. The entries replicate like any other, so followers, restarts and new
  leaders agree on what was rewritten and go on from the cursor.

A value written by the new code is already in the new schema, and nothing
tells it apart from an old one: migration functions must therefore be
idempotent (Rama's rule), returning a migrated value unchanged. Reads migrate
until the group's rewrite is applied to its end; then the PState reads as is.

The ``_meta`` record of a migration is ``[id, cursor, rewritten]``: ``cursor``
is the next key to rewrite, or None once every value was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pstate.engine import Reader, encode_value, pack, unpack
from pstate.errors import SchemaMismatch
from pstate.schema import Schema

META = "_meta"
_RECORD = b"mig:"
#: top-level elements of a PState's column family are the keys in [FIRST_KEY, _SUB)
FIRST_KEY = b"\x02"
_SUB = b"\x03"


@dataclass(frozen=True)
class ActiveMigration:
    """A migration running on a PState: its id, function and the new value schema (to check results)."""

    id: str
    fn: Callable[[Any], Any]
    value_schema: Schema

    def value(self, pstate: str, raw: bytes) -> bytes:
        """A stored value, migrated (re-encoded in the new schema)."""
        old = unpack(raw)
        try:
            new = self.fn(old)
        except Exception as e:
            raise SchemaMismatch(f"{pstate} (migration {self.id})", "a value the migration function accepts",
                                 f"{old!r:.100} ({type(e).__name__}: {e})") from e
        self.value_schema.validate(new, f"{pstate} (migration {self.id} returned)")
        return encode_value(self.value_schema, new)


@dataclass(frozen=True)
class MigrationRecord:
    """What ``_meta`` says of a PState's migration."""

    id: str
    cursor: bytes | None  #: next key to rewrite; None: every value is rewritten
    rewritten: int

    @property
    def done(self) -> bool:
        return self.cursor is None


def record_key(pstate: str) -> bytes:
    return _RECORD + pstate.encode()


def read_record(reader: Reader, pstate: str) -> MigrationRecord | None:
    raw = reader.get(META, record_key(pstate))
    if raw is None:
        return None
    mid, cursor, n = unpack(raw)
    return MigrationRecord(mid, cursor, n)


def records(reader: Reader, pstates: list[str]) -> dict[str, MigrationRecord]:
    found = {p: read_record(reader, p) for p in pstates}
    return {p: r for p, r in found.items() if r is not None}


def write_record(writes: Any, pstate: str, rec: MigrationRecord) -> None:
    """Put ``rec`` in an entry's writes (a :class:`~pstate.changes.Writes`)."""
    writes.put(META, record_key(pstate), pack([rec.id, rec.cursor, rec.rewritten]))


class MigratingReader:
    """``below`` with one PState's top-level values migrated on the way out."""

    def __init__(self, below: Reader, cf: str, pstate: str, migration: ActiveMigration) -> None:
        self.below = below
        self.cf = cf
        self.pstate = pstate
        self.migration = migration

    def get(self, cf: str, key: bytes) -> bytes | None:
        raw = self.below.get(cf, key)
        if raw is None or cf != self.cf or not key.startswith(FIRST_KEY):
            return raw
        return self.migration.value(self.pstate, raw)

    def scan(self, cf: str, lo: bytes, hi: bytes | None, reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        items = self.below.scan(cf, lo, hi, reverse)
        if cf != self.cf:
            return items
        return ((k, self.migration.value(self.pstate, v) if k.startswith(FIRST_KEY) else v) for k, v in items)


def rewrite_batch(reader: Reader, writes: Any, cf: str, pstate: str, migration: ActiveMigration,
                  limit: int) -> MigrationRecord:
    """Rewrite up to ``limit`` stored values from the cursor ``reader`` sees; write values and the new record.

    ``reader`` must be the raw one (applied plus staged state, no migration on
    top), so each value is migrated exactly as stored. Values the function
    leaves unchanged are not written again.
    """
    rec = read_record(reader, pstate)
    if rec is None or rec.id != migration.id:
        rec = MigrationRecord(migration.id, FIRST_KEY, 0)
    if rec.done:
        return rec
    assert rec.cursor is not None
    n = 0
    last = None
    for k, raw in reader.scan(cf, max(rec.cursor, FIRST_KEY), _SUB):
        new = migration.value(pstate, raw)
        if new != raw:
            writes.put(cf, k, new)
        last = k
        n += 1
        if n >= limit:
            break
    cursor = None if n < limit or last is None else last + b"\x00"
    rec = MigrationRecord(migration.id, cursor, rec.rewritten + n)
    write_record(writes, pstate, rec)
    return rec
