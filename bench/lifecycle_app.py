"""Versions of one module and a writer that times its acknowledgements: what bench.lifecycle and the update
tests (tests/integration/test_update.py) run.

Each version is the same package, ``mr_life``, with different code, built as a
wheel-like zip artifact (what ``conductor update --code FILE`` ships):

* ``v1``: ``*events`` counted into ``$$counts`` (weight 1); the topology's ack value is 1;
* ``v2``: weight 10, and a new PState ``$$last`` (each key's last record number); ack value 10;
* ``bad``: ``v2`` whose ``define()`` raises on worker ``n2`` only;
* ``v3``: ``v1`` with ``$$counts`` migrated from ints to records ``{"n": count, "was": old}``.
"""

from __future__ import annotations

import io
import itertools
import threading
import time
import zipfile
from dataclasses import dataclass, field
from typing import Any

from topology.artifact import Artifact

MODULE = "Life"
REF = "mr_life.app:Life"

_HEAD = '''
import sys

from pstate import Map, Record
from topology import Migration, Module, hash_by


def by_key(record):
    return record["key"]


def add(n, k):
    return (n or 0) + k
'''

_V1 = _HEAD + '''

class Life(Module):
    def define(self, m):
        events = m.depot("*events", hash_by(by_key))
        m.pstate("$$counts", Map(str, int))

        @m.stream(events)
        def count(ctx, record):
            ctx.update("$$counts", record["key"], add, 1)
            return 1
'''

_V2 = _HEAD + '''

class Life(Module):
    def define(self, m):
        events = m.depot("*events", hash_by(by_key))
        m.pstate("$$counts", Map(str, int))
        m.pstate("$$last", Map(str, int))
        {refuse}

        @m.stream(events)
        def count(ctx, record):
            ctx.update("$$counts", record["key"], add, 10)
            ctx.set("$$last", record["key"], record["i"])
            return 10
'''

_V3 = _HEAD + '''

def to_record(v):
    return v if isinstance(v, dict) else {"n": v, "was": v}


def bump(v):
    v = to_record(v or 0)
    return {"n": v["n"] + 1, "was": v["was"]}


class Life(Module):
    def define(self, m):
        events = m.depot("*events", hash_by(by_key))
        m.pstate("$$counts", Map(str, Record(n=int, was=int)), migration=Migration("to-record", to_record))

        @m.stream(events)
        def count(ctx, record):
            ctx.update("$$counts", record["key"], bump)
            return 1
'''

SOURCES = {
    "v1": _V1,
    "v2": _V2.replace("{refuse}", ""),
    "bad": _V2.replace("{refuse}", 'if "n2" in sys.argv:\n            raise RuntimeError("n2 refuses this version")'),
    "v3": _V3,
    "v3_unmigrated": _V3.replace(', migration=Migration("to-record", to_record)', ""),
}


def artifact(version: str) -> Artifact:
    """The zip artifact of one version of ``mr_life`` (sorted entries, fixed times: same bytes every time)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in (("mr_life/__init__.py", ""), ("mr_life/app.py", SOURCES[version])):
            zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), text)
    return Artifact(buf.getvalue(), "wheel", f"mr_life {version}")


@dataclass
class Ack:
    at: float
    record: dict[str, Any]
    value: Any


@dataclass
class Writer:
    """Appends one record at a time with ``ack="applied"`` from a thread; keeps every acknowledgement's time."""

    depot: Any
    keys: int = 50
    acks: list[Ack] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            record = {"key": f"k{i % self.keys}", "i": i}
            try:
                _offset, values = self.depot.append_with_acks(record, ack="applied")
                self.acks.append(Ack(time.monotonic(), record, values.get("count")))
            except Exception as e:  # counted: the tests and the bench require none
                self.errors.append(e)
            i += 1

    def start(self) -> Writer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def gaps_ms(self, start: float, end: float) -> list[float]:
        """Gaps between consecutive acknowledgements that end within [start, end], in ms."""
        return [ms for _at, ms in self.gap_times(start, end)]

    def gap_times(self, start: float, end: float) -> list[tuple[float, float]]:
        """``(end, ms)`` of each gap between consecutive acknowledgements that ends within [start, end]."""
        times = [a.at for a in self.acks]
        return [(b, (b - a) * 1000) for a, b in itertools.pairwise(times) if start <= b <= end]

