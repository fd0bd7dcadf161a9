"""A live leaderboard over WordCount: the top words, updated as sentences are counted (a subscription).

    python -m examples.leaderboard --zk 127.0.0.1:2181 --top 10            # redraws on every change
    python -m examples.leaderboard --zk 127.0.0.1:2181 --top 10 --once 5   # print after 5 s and stop

One subscription per task group holds that group's part of ``$$counts`` (``PState.subscribe_groups``): the
first event is its value, then every applied entry's diffs (``["set", [word], count]``) arrive as the stream
topology counts words, from each group's leader, and survive a leader failover without missing or repeating one
(docs/subscriptions.md). The board merges the groups' live values; nothing polls.
"""

from __future__ import annotations

import argparse
import heapq
import os
import threading
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from conductor import Cluster
from conductor.client.subscriptions import Change, Subscription


class Leaderboard:
    """The top ``n`` words of every task group's live ``$$counts`` (redrawn on demand)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.changed = threading.Event()
        self.subs: list[Subscription] = []

    def on_change(self, ch: Change) -> None:  # the client's event loop: only note it, draw elsewhere
        self.changed.set()

    def top(self) -> list[tuple[str, int]]:
        counts = [kv for s in self.subs for kv in (s.value or {}).items()]
        return heapq.nlargest(self.n, counts, key=lambda kv: (kv[1], kv[0]))

    def table(self) -> Table:
        t = Table("#", "word", "count", title="WordCount leaderboard (live)")
        for i, (w, n) in enumerate(self.top(), 1):
            t.add_row(str(i), w, str(n))
        return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.leaderboard")
    p.add_argument("--zk", default=os.environ.get("MILLRACE_ZK"), help="ZooKeeper address (or MILLRACE_ZK)")
    p.add_argument("--module", default="WordCount")
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--once", type=float, default=None, metavar="SECONDS", help="print the board after SECONDS and stop")
    args = p.parse_args(argv)
    if not args.zk:
        p.error("pass --zk HOST:PORT (the address `conductor dev` prints) or set MILLRACE_ZK")
    board = Leaderboard(args.top)
    console = Console()
    with Cluster.connect(args.zk) as cluster:
        board.subs = cluster.pstate(args.module, "$$counts").subscribe_groups(board.on_change)
        for s in board.subs:
            s.wait_ready()
        if args.once is not None:
            time.sleep(args.once)
            console.print(board.table())
        else:
            with Live(board.table(), console=console, auto_refresh=False) as live:
                while True:
                    board.changed.wait()
                    board.changed.clear()
                    live.update(board.table(), refresh=True)
                    time.sleep(0.1)  # at most 10 redraws a second, whatever the rate of changes
        for s in board.subs:
            s.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
