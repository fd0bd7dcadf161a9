"""Word count: a stream topology that counts words of appended sentences.

    conductor deploy --module examples.word_count:WordCount --tasks 8 --threads 2 --workers 3 --replicationFactor 3

Sentences land on any task (`random`); each word's count lives on the task that
owns the word, wherever the sentence was appended. The Spark microbatch
topology keeps a second, exactly-once tally per word length. The query
topology ``top_words`` reads every task's counts where they live and brings
back only each task's ten best (``cluster.query("WordCount", "top_words")``,
see examples/top_words.py).
"""

from pstate import Map
from topology import Module, random
from topology.combiners import top_n

#: how many words ``top_words`` returns
TOP = 10


def plus_one(n: int | None) -> int:
    return (n or 0) + 1


def is_long(pair: tuple[str, int]) -> bool:
    """A server-side filter: ``counts.scan_pages(None, None, None, P.filter(is_long))`` runs it on the workers."""
    return len(pair[0]) >= 8


def words(sentence: str) -> list[str]:
    return [w.strip(".,;:!?\"'()").lower() for w in sentence.split() if w.strip(".,;:!?\"'()")]


class WordCount(Module):
    def define(self, m):
        sentences = m.depot("*sentences", random)
        counts = m.pstate("$$counts", Map(str, int))
        m.pstate("$$lengths", Map(int, int))

        @m.stream(sentences)
        def count(ctx, sentence: str):
            ws = words(sentence)
            for word in ws:
                # routed to the task that owns `word`, applied there in a replicated entry
                ctx.update(counts.name, word, plus_one)
            return len(ws)  # the ack value of the append

        @m.query("top_words", every_task=True, combine=top_n(TOP, key=1))
        def top_words(q):
            """Runs on every task: its (word, count) pairs, paged; each worker keeps the best TOP of its tasks."""
            return q.scan(counts.name)

        @m.microbatch(sentences)
        def lengths(batch, ctx):
            """Spark: one row per word, counted per word length; committed exactly once per batch."""
            from pyspark.sql import functions as F

            ws = batch.select(F.explode(F.split(F.lower(F.col("value")), r"[^a-z']+")).alias("w")).where("w != ''")
            per_len = ws.groupBy(F.length("w").alias("len")).count()
            return per_len.select(F.lit("$$lengths").alias("target"), F.col("len").alias("key"),
                                  F.lit("add").alias("op"), F.col("count").alias("value"))
