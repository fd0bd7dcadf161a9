"""A depot-and-PState module: click events partitioned by user.

Used by the cluster runtime's tests and benchmarks; `examples/word_count.py`
shows topologies on top of the same pieces.
"""

from pstate import Map
from topology import Module, hash_by


def by_user(click: dict) -> str:
    return click["user"]


class Clicks(Module):
    def define(self, m):
        m.depot("*clicks", hash_by(by_user))
        m.depot("*raw", )
        m.pstate("$$visits", Map(str, int))
