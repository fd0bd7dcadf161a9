"""Peer systems that Millrace benchmarks measure against in the same run.

docs/performance.md asks every benchmark to print ratios against a peer measured
on the same machine at the same time, because absolute numbers on a shared
2-core box mean little on their own. Each module here starts its peer from a
local binary, on 127.0.0.1 only, and returns plain figures in a dict so the
Millrace benchmark can merge them into its own table and JSON line.
"""
