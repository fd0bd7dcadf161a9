"""A module whose topology misbehaves on request: the fault tests' input (not an example to copy).

``track`` counts events per user; an event with ``boom`` makes its update
function raise an exception of a type no layer knows; ``blob`` is written to
``copies`` keys, so a large blob makes a larger entry than its record.
"""

from pstate import Map
from topology import Module, hash_by


class Weird(Exception):
    """An exception type nothing in Millrace catches by name."""


def by_user(event: dict) -> str:
    return event["user"]


def plus_one(n: int | None) -> int:
    return (n or 0) + 1


def explode(n: int | None) -> int:
    raise Weird(f"update function raised on {n!r}")


class Faulty(Module):
    def define(self, m):
        events = m.depot("*events", hash_by(by_user))
        m.pstate("$$counts", Map(str, int))
        m.pstate("$$blobs", Map(str, str))

        @m.stream(events)
        def track(ctx, ev):
            ctx.update("$$counts", ev["user"], explode if ev.get("boom") else plus_one)
            for i in range(ev.get("copies", 0)):
                ctx.set("$$blobs", f"{ev['user']}#{i}", ev["blob"])
