"""A store's column families, and the spare ones a module update puts new PStates and depots in.

Creating a RocksDB column family writes and syncs the MANIFEST, and rocksdict
does it holding the GIL: measured at 10-27 ms on a loaded machine, during
which every thread of the worker (every replica's task thread) stands still.
A module update that adds a PState would stall appends that long on every
replica of every group, at the moment it adds it.

So every store keeps :data:`SPARES` empty column families, created when it
is opened (at deploy, or at a restart), and an update *aliases* a new PState
or depot to a free spare: the switch entry writes ``_meta cf:<name> =
spare:<n>`` (chosen by the leader, replicated, so every replica agrees), and
the store maps the name to the spare's handle. Change sets keep naming column
families by their logical name (``pstate:$$name``). A store with no spare
left creates the family (the stall above, once). Spares used are replaced at
the next open.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import rocksdict

from pstate.errors import rocks_errors


def pstate_cf(name: str) -> str:
    """The column family of PState ``name``."""
    return "pstate:" + name

META = "_meta"
SPARE = "spare:"
SPARES = 4
_ALIAS = b"cf:"
#: the ``_meta`` key range of the aliases
ALIAS, ALIAS_END = _ALIAS, b"cf;"


def spare_names() -> list[str]:
    return [f"{SPARE}{i}" for i in range(SPARES)]


def alias_key(name: str) -> bytes:
    return _ALIAS + name.encode()


def read_aliases(get_range: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """``{logical name: spare}`` from the ``_meta`` items under ``cf:``."""
    return {k[len(_ALIAS):].decode(): v.decode() for k, v in get_range}


class Families:
    """Column-family handles by logical name (aliases resolved), for one open RocksDB."""

    def __init__(self, db: rocksdict.Rdict, path: str, options: Callable[[], rocksdict.Options],
                 names: Iterable[str]) -> None:
        self.db = db
        self.path = path
        self._options = options
        self.cfs: dict[str, Any] = {n: db.get_column_family(n) for n in names}
        self.handles: dict[str, Any] = {n: db.get_column_family_handle(n) for n in names}
        #: the column families that exist under their own name (not aliases)
        self.real: set[str] = set(self.cfs)

    def aliases(self) -> dict[str, str]:
        ro = rocksdict.ReadOptions()
        ro.set_iterate_upper_bound(ALIAS_END)
        return read_aliases(self.cfs[META].items(from_key=_ALIAS, read_opt=ro))

    def free_spares(self, aliases: dict[str, str]) -> list[str]:
        used = set(aliases.values())
        return [s for s in spare_names() if s not in used and s in self.real]

    def ensure(self, names: Iterable[str], aliases: dict[str, str]) -> None:
        """Every name resolvable: through its alias, or an existing family, or (no spare taken) a new one."""
        for name in names:
            target = aliases.get(name, name)
            if target not in self.real:
                with rocks_errors("create column family", self.path):
                    try:
                        self.cfs[target] = self.db.create_column_family(target, self._options())
                    except Exception:  # on disk already (hidden since), just not open here
                        self.cfs[target] = self.db.get_column_family(target)
                    self.handles[target] = self.db.get_column_family_handle(target)
                self.real.add(target)
            self.cfs[name] = self.cfs[target]
            self.handles[name] = self.handles[target]

    def drop(self, names: Iterable[str], aliases: dict[str, str]) -> None:
        for name in names:
            if name not in self.cfs:
                continue
            target = aliases.get(name, name)
            for n in {name, target}:
                self.handles.pop(n, None)
                self.cfs.pop(n, None)
            self.real.discard(target)
            with rocks_errors("drop column family", self.path):
                self.db.drop_column_family(target)

    def close(self) -> None:
        self.handles.clear()
        self.cfs.clear()
        self.real.clear()
