"""bench.paced_copy: the plain copy that stands for a reassignment's bytes copies every file whole, at its rate."""

from __future__ import annotations

from pathlib import Path

from bench.paced_copy import beside_plain_copy, make_files


def test_every_receiver_gets_every_file_whole_and_no_faster_than_its_rate(tmp_path: Path) -> None:
    make_files(tmp_path / "source", [0.6, 0.4])
    rate = 2 << 20  # B/s: a megabyte a receiver takes about half a second
    start, end = beside_plain_copy(tmp_path / "source", tmp_path / "work", receivers=2, rate=rate)
    sources = sorted((tmp_path / "source").iterdir())
    for i in range(2):
        got = sorted((tmp_path / "work" / f"receiver-{i}").iterdir())
        assert [p.name for p in got] == [p.name for p in sources]
        assert all(g.read_bytes() == s.read_bytes() for g, s in zip(got, sources, strict=True))
    # 1 MB at 2 MiB/s, less the throttle's burst (50 ms of its rate) and the first chunk, which is paced after
    assert end - start >= 0.3, end - start
