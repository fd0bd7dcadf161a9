"""Modules the benchmarks deploy (workers import them by reference, like any module)."""

import importlib

from pstate import Map
from topology import Module, random


class Visibility(Module):
    """Each marker record becomes `$$seen[id] = 1` through a microbatch: append -> visible latency."""

    def define(self, m):
        marks = m.depot("*marks", random)
        m.pstate("$$seen", Map(str, int))

        @m.microbatch(marks)
        def mark(batch, ctx):
            from pyspark.sql import functions as F

            return batch.select(F.lit("$$seen").alias("target"), F.get_json_object("value", "$.id").alias("key"),
                                F.lit("set").alias("op"), F.lit(1).alias("value"))


# WordCount deployed twice on one cluster by ``bench.topology`` (at 2 and at 8 task groups): a module's code
# declares the name it is deployed under. Imported by name: the examples are not type-checked.
_WordCount = importlib.import_module("examples.word_count").WordCount
WordCount2 = type("WordCount2", (_WordCount,), {"__module__": __name__})
WordCount8 = type("WordCount8", (_WordCount,), {"__module__": __name__})
