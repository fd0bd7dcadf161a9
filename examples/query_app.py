"""An app that queries PStates of a running WordCount module.

    python -m examples.query_app --zk 127.0.0.1:2181 cat dog          # point lookups
    python -m examples.query_app --zk 127.0.0.1:2181 --top 10         # a scan of every task
    python -m examples.query_app --zk 127.0.0.1:2181 --from m --to p  # a sorted key range

Queries go to the leader of the task group that owns each key; reads see
applied state (entries every in-sync replica holds).
"""

from __future__ import annotations

import argparse
import os

from rich.console import Console
from rich.table import Table

from conductor import Cluster


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.query_app")
    p.add_argument("--zk", default=os.environ.get("MILLRACE_ZK"), help="ZooKeeper address (or MILLRACE_ZK)")
    p.add_argument("--module", default="WordCount")
    p.add_argument("--top", type=int, default=0, help="show the N most frequent words")
    p.add_argument("--from", dest="start", default=None, help="first word of a sorted range")
    p.add_argument("--to", dest="end", default=None, help="word the range stops before")
    p.add_argument("words", nargs="*")
    args = p.parse_args(argv)
    if not args.zk:
        p.error("pass --zk HOST:PORT (the address `conductor dev` prints) or set MILLRACE_ZK")
    console = Console()
    with Cluster.connect(args.zk) as cluster:
        counts = cluster.pstate(args.module, "$$counts")
        tasks = cluster.module_info(args.module).tasks
        for word in args.words:
            console.print(f"{word}: {counts.select_one(word) or 0}")
        if args.top or args.start is not None or args.end is not None:
            rows = [kv for t in range(tasks) for kv in counts.scan(t, args.start, args.end)]
            rows.sort(key=(lambda kv: -kv[1]) if args.top else (lambda kv: kv[0]))
            table = Table("word", "count")
            for w, n in rows[: args.top or None]:
                table.add_row(w, str(n))
            console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
