"""An audit trail: every event's id is recorded once (idempotent) and visits are counted per user.

The fault tests use it to check stream topologies under leader failover: every
acknowledged event must be in `$$seen`, and `$$seen` holds nothing that was not
appended.
"""

from pstate import Map
from topology import Module, hash_by


def plus_one(n: int | None) -> int:
    return (n or 0) + 1


def by_user(event: dict) -> str:
    return event["user"]


class Audit(Module):
    def define(self, m):
        events = m.depot("*events", hash_by(by_user))
        m.pstate("$$seen", Map(str, str))      # event id -> user; writing it twice changes nothing
        m.pstate("$$visits", Map(str, int))    # user -> events counted

        @m.stream(events)
        def audit(ctx, event: dict):
            ctx.set("$$seen", event["id"], event["user"])      # routed to the task owning the id
            ctx.update("$$visits", event["user"], plus_one)    # colocated with the event (same key)
            return event["id"]
