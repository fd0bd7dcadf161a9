"""An app that asks a running WordCount module for its most frequent words with one query topology call.

    python -m examples.top_words --zk 127.0.0.1:2181            # the ten most frequent words
    python -m examples.top_words --zk 127.0.0.1:2181 --long     # every word of 8+ letters (a server-side filter)

``cluster.query("WordCount", "top_words")`` runs WordCount's ``top_words`` query on every task, next to the
counts: each worker sends back the best ten of its tasks and this app gets the best ten of those, instead of
fetching every count to sort them here. ``--long`` streams a paged scan of every task whose filter
(``examples.word_count.is_long``, named, never sent as code) runs on the workers.
"""

from __future__ import annotations

import argparse
import os

from rich.console import Console
from rich.table import Table

from conductor import Cluster
from examples.word_count import is_long
from pstate import P


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.top_words")
    p.add_argument("--zk", default=os.environ.get("MILLRACE_ZK"), help="ZooKeeper address (or MILLRACE_ZK)")
    p.add_argument("--module", default="WordCount")
    p.add_argument("--long", action="store_true", help="list the words of 8 letters or more (paged scan)")
    args = p.parse_args(argv)
    if not args.zk:
        p.error("pass --zk HOST:PORT (the address `conductor dev` prints) or set MILLRACE_ZK")
    console = Console()
    with Cluster.connect(args.zk) as cluster:
        table = Table("word", "count")
        if args.long:
            counts = cluster.pstate(args.module, "$$counts")
            for page in counts.scan_pages(None, None, None, P.filter(is_long), page_size=500):
                for word, n in page.items:
                    table.add_row(word, str(n))
        else:
            for word, n in cluster.query(args.module, "top_words", timeout_s=10):
                table.add_row(word, str(n))
        console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
