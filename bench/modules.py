"""Modules the benchmarks deploy (workers import them by reference, like any module)."""

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
