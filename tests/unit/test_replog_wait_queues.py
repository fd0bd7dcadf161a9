"""A leader's queues of appends waiting for their ack level are bounded by the unapplied entries.

Each waiting append's last entry is unapplied and no two share one, so the
queues never hold more than ``replication.max.unapplied.entries``; an append
past that is refused with Backpressure (the app retries later) and waits nowhere.
"""

from __future__ import annotations

from replog.errors import Backpressure
from replog.messages import Ack, ClientAppend, Reply
from tests.unit.test_replica_leader import make_leader, of


def test_waiting_appends_stop_at_the_unapplied_bound_and_the_next_is_refused() -> None:
    r, _ = make_leader(max_unapplied_entries=5)
    for i in range(5):  # one entry each, nobody acknowledges them: all wait
        assert not of(r.handle(ClientAppend(i, 1, 10, Ack.APPLIED if i % 2 else Ack.APPEND), 0), Reply)
    ls = r._ls
    assert ls is not None and len(ls.wait_append) + len(ls.wait_applied) == 5
    (reply,) = of(r.handle(ClientAppend(9, 1, 10, Ack.APPLIED), 0), Reply)
    assert isinstance(reply.error, Backpressure) and "replication.max.unapplied.entries=5" in str(reply.error)
    assert len(ls.wait_append) + len(ls.wait_applied) == 5  # the refused one waits nowhere
