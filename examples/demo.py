"""`make demo`: the whole of Millrace in about a minute and a half.

1. start a local cluster (ZooKeeper, a conductor, 3 worker nodes), all real processes;
2. deploy WordCount with replication factor 3;
3. feed it a text, with a progress bar; a stream topology counts words as they arrive;
4. run the Spark microbatch topology (word lengths, committed exactly once);
5. print the top words from the `$$counts` PState;
6. export the `*sentences` depot to Delta Lake and read it back with Spark SQL;
7. stop everything.

Run `python -m examples.demo [--sentences N] [--keep]`.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console()

# An original little text about a mill race; the demo samples it into a corpus.
TEXT = """
The mill race carries water from the river to the wheel. Every drop that enters the race is counted by the
miller, and every turn of the wheel is written in the ledger. When the river rises, the race runs fast and the
wheel turns faster; when the river falls, the miller waits. Three millers keep three copies of the ledger, and
a turn is only written when all three agree. If one miller falls asleep, the other two carry on, and the
sleeper copies the pages he missed when he wakes. The water never stops, the wheel never lies, and the ledger
is never wrong. At night the miller reads the ledger by candle light and counts the turns of the day.
"""


def corpus(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    sentences = [s.strip().replace("\n", " ") for s in TEXT.split(".") if s.strip()]
    return [rng.choice(sentences) + "." for _ in range(n)]


def step(n: int, text: str) -> None:
    console.print(f"[bold cyan]{n}.[/bold cyan] {text}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.demo")
    p.add_argument("--sentences", type=int, default=20_000)
    p.add_argument("--keep", action="store_true", help="leave the working folder for inspection")
    args = p.parse_args(argv)

    from conductor.client import Cluster
    from conductor.controller import Conductor
    from conductor.devcluster import DevCluster
    from conductor.metastore.module_spec import ModuleSpec
    from conductor.status import wait_serving
    from topology.spark import export_depot_to_delta, read_delta_sql
    from topology.spark.microbatch import run_microbatch
    from topology.spark.session import spark_session

    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="millrace-demo-"))
    console.print(Panel.fit("[bold]Millrace demo[/bold]: a replicated state store for Python, native to Spark",
                            border_style="cyan"))
    step(1, "starting ZooKeeper, a conductor and 3 worker nodes (real processes)")
    dc = DevCluster(work / "cluster", nodes=3, session_timeout=6.0).start()
    spark = None
    try:
        console.print(f"   ZooKeeper {dc.hosts}; nodes " + ", ".join(f"{n} (pid {p.pid})" for n, p in dc.nodes.items()))
        step(2, "deploying examples.word_count:WordCount with --tasks 8 --threads 2 --replicationFactor 3")
        c = Conductor(dc.hosts, "demo")
        c.ms.start()
        try:
            c.deploy(ModuleSpec(name="WordCount", module_ref="examples.word_count:WordCount", tasks=8, threads=2,
                                workers=3, replication_factor=3, options={}))
            wait_serving(c.ms, "WordCount", timeout_s=30)
        finally:
            c.ms.close()

        text = corpus(args.sentences)
        step(3, f"appending {len(text):,} sentences (ack=applied: every ISR replica holds them, stream topology done)")
        with Cluster.connect(dc.hosts) as cluster:
            depot = cluster.depot("WordCount", "*sentences")
            chunk = 1000
            t0 = time.monotonic()
            with Progress(TextColumn("   {task.description}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=console) as bar:
                task = bar.add_task("sentences", total=len(text), rate="")
                for i in range(0, len(text), chunk):
                    depot.append_many(text[i:i + chunk], ack="applied")
                    done = min(i + chunk, len(text))
                    bar.update(task, completed=done, rate=f"{done / (time.monotonic() - t0):,.0f}/s")

            step(4, "running the Spark microbatch topology `lengths` (exactly-once commits per task group)")
            spark = spark_session("millrace-demo", warehouse=work / "warehouse")
            q = run_microbatch(spark, dc.hosts, "WordCount", "lengths", str(work / "lengths-checkpoint"),
                               trigger={"availableNow": True}, max_records_per_trigger=10_000)
            q.await_termination()
            lengths = cluster.pstate("WordCount", "$$lengths")
            per_len = sorted(kv for t in range(8) for kv in lengths.scan(t))
            console.print("   words per length: " + ", ".join(f"{k}:{v}" for k, v in per_len))

            step(5, "top words from the $$counts PState (counted by the stream topology on the owning tasks)")
            counts = cluster.pstate("WordCount", "$$counts")
            expected_total = sum(len(s.split()) for s in text)
            deadline = time.monotonic() + 30
            while True:
                all_counts = dict(kv for t in range(8) for kv in counts.scan(t))
                if sum(all_counts.values()) >= expected_total or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            table = Table(title="top words", title_justify="left")
            table.add_column("word")
            table.add_column("count", justify="right")
            table.add_column("task", justify="right")
            from topology import task_for_key

            for w, n in sorted(all_counts.items(), key=lambda kv: -kv[1])[:10]:
                table.add_row(w, f"{n:,}", str(task_for_key(w, 8)))
            console.print(table)
            console.print(f"   {sum(all_counts.values()):,} words counted, {expected_total:,} expected; "
                          f"`the` via select_one: {counts.select_one('the'):,}")

            step(6, "exporting *sentences to Delta Lake (Spark's exactly-once Delta sink) and reading it with SQL")
            table_path = str(work / "delta" / "sentences")
            n = export_depot_to_delta(spark, dc.hosts, "WordCount", "*sentences", table_path,
                                      str(work / "delta" / "_checkpoint"))
            rows = spark.sql(read_delta_sql(table_path, "SELECT count(*) AS n, count(DISTINCT task) AS tasks "
                                                        "FROM {table}")).collect()[0]
            console.print(f"   exported {n:,} rows; Spark SQL reads {rows['n']:,} rows from {rows['tasks']} tasks")
    finally:
        step(7, "stopping Spark and every process we started")
        if spark is not None:
            spark.stop()
        dc.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    console.print(f"[green]demo finished in {time.monotonic() - t_start:.0f}s[/green]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
