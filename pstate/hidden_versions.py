"""When a store's memtables are worth flushing for its readers: the old versions its scans step over.

RocksDB keeps every version of a key in the memtable until a flush (an iterator needs them for its view of the
data as it was when it started), and an iterator steps over all of them. A counting topology's hot keys
(WordCount's frequent words) pile up thousands of versions between flushes, and every scan of the PState, as a
query topology on every task makes, pays for them: a group's 1,000 words with 24,000 entries in the memtable
scanned in 600-780 us, and in 300-360 us once flushed (a flush writes each key's newest version only). RocksDB
flushes by itself when a memtable fills (64 MiB), which a few thousand hot keys take a long time to do.

So a scan that read all of a PState reports what it stepped over, and the store flushes once that has cost as
much as a flush: the rent-or-buy rule, which never spends more than twice what the best schedule in hindsight
would have. What a scan stepped over is at least ``entries - keys``: the memtable's entries (RocksDB counts
them; a property read) less the live keys the scan returned, since the memtable holds at most one live version
of each and everything else it holds is an older version or a deletion. Writers pay nothing: a store nobody
scans is never flushed by this rule. The flush is the store's atomic one (every column family in one commit,
:meth:`pstate.store.TaskGroupStore.flush`), so what a crash leaves is exactly what it was. A flush by anyone
(this rule's, retention's, RocksDB's own) empties the memtables and the debt starts again: seen as a memtable
holding fewer entries than at the last scan.
"""

from __future__ import annotations

import threading

#: a flush's cost counted in entries a scan steps over: the store's atomic flush (a checkpoint of every column
#: family, then its removal) took 5-35 ms, about 11 ms in the middle, on 2 loaded cores, and rocksdict holds the GIL
#: through it (the worker's other threads wait); stepping over an old version in the memtable took 14-18 ns (the
#: scans above: 300-420 us for 23,000 of them)
FLUSH_COST_ENTRIES = 1_000_000


class HiddenVersions:
    """One store's debt: the old versions and deletions its whole-PState scans stepped over since its last flush.

    Any thread (queries run on the event loop and on the query threads): a lock guards the counts.
    """

    def __init__(self, flush_cost: int = FLUSH_COST_ENTRIES) -> None:
        assert flush_cost > 0, flush_cost
        self.flush_cost = flush_cost
        self._lock = threading.Lock()
        #: entries stepped over since the memtables were last seen empty (at least)
        self.debt = 0
        #: the memtable's entries of each column family at its last scan
        self._entries: dict[str, int] = {}
        #: a flush was asked for and has not finished: nobody asks again meanwhile
        self._flushing = False

    def scanned(self, cf: str, entries: int, keys: int) -> bool:
        """A scan read all of column family ``cf`` and returned ``keys`` live keys while its active memtable held
        ``entries``: True when a flush is due now (the caller flushes, then calls :meth:`flushed` in any case)."""
        assert entries >= 0 and keys >= 0, (entries, keys)
        with self._lock:
            if entries < self._entries.get(cf, 0):  # flushed since (all column families at once): a fresh start
                self._entries.clear()
                self.debt = 0
            self._entries[cf] = entries
            self.debt += max(0, entries - keys)
            if self._flushing or self.debt < self.flush_cost:
                return False
            self._flushing = True
            return True

    def flushed(self) -> None:
        """The flush :meth:`scanned` asked for is over (done or failed): the debt starts again."""
        with self._lock:
            self._entries.clear()
            self.debt = 0
            self._flushing = False
