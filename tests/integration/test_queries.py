"""Queries on a real cluster (RF=3): query topologies, paged scans with server-side filters, deadlines."""

from __future__ import annotations

import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.queries import key_name, load_counts
from conductor.client import Cluster
from conductor.devcluster import DevCluster
from conductor.testing import deploy, wait_for
from conductor.wire import millrace_pb2 as pb
from examples.word_count import TOP, is_long, plus_one
from pstate import P
from pstate.errors import InvalidPath
from topology.combiners import top_n
from topology.errors import QueryTimeout
from topology.partitioners import task_for_key

TASKS, GROUPS = 4, 2


@pytest.fixture(scope="module")
def dc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    cluster = DevCluster(tmp_path_factory.mktemp("queries") / "cluster", nodes=3, session_timeout=4.0)
    cluster.start()
    try:
        deploy(cluster, "examples.word_count:WordCount", tasks=TASKS, threads=GROUPS)
        deploy(cluster, "examples.timeline:Timeline", tasks=TASKS, threads=GROUPS)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def cluster(dc: DevCluster) -> Iterator[Cluster]:
    with Cluster.connect(dc.hosts) as c:
        yield c


@pytest.fixture(scope="module")
def words(cluster: Cluster) -> Counter[str]:
    text = [" ".join(f"word{(i * 7 + j) % 300}" for j in range(i % 13 + 1)) + " extraordinarily" for i in range(600)]
    cluster.depot("WordCount", "*sentences").append_many(text, ack="applied")
    return Counter(w for s in text for w in s.split())


def test_top_words_fans_out_to_every_task_and_equals_a_full_scan(cluster: Cluster, words: Counter[str]) -> None:
    counts = cluster.pstate("WordCount", "$$counts")
    full = counts.scan()  # every task, paged
    assert dict(full) == dict(words)
    top = cluster.query("WordCount", "top_words")
    assert [tuple(x) for x in top] == top_n(TOP, key=1).lift(full)
    assert top[0] == ("extraordinarily", 600)


def test_paged_scans_resume_filter_by_task_and_on_the_worker(cluster: Cluster, words: Counter[str]) -> None:
    counts = cluster.pstate("WordCount", "$$counts")
    pages = list(counts.scan_pages(None, page_size=17))
    assert all(len(p.items) <= 17 for p in pages) and pages[-1].token is None
    keys = [k for p in pages for k, _ in p.items]
    assert sorted(keys) == sorted(words) and len(keys) == len(set(keys))
    # a token resumes right after its page
    rest = [k for p in counts.scan_pages(None, page_size=17, resume=pages[4].token) for k, _ in p.items]
    assert rest == keys[sum(len(p.items) for p in pages[:5]):]
    for t in range(TASKS):  # one task: only its keys cross the network
        mine = counts.scan(t)
        assert {k for k, _ in mine} == {w for w in words if task_for_key(w, TASKS) == t}
    # a server-side filter, named (module-level); an anonymous one is refused with how to name it
    long_words = [tuple(kv) for p in counts.scan_pages(None, None, None, P.filter(is_long)) for kv in p.items]
    assert sorted(long_words) == sorted((w, n) for w, n in words.items() if len(w) >= 8)
    assert counts.select_one("extraordinarily", P.view(plus_one)) == 601  # a named view in a select, too
    with pytest.raises(InvalidPath, match="top level"):
        counts.select("word1", P.filter(lambda n: n > 1))


def test_a_query_hops_between_pstates_on_other_tasks_and_joins(cluster: Cluster) -> None:
    names = [f"user{i}" for i in range(40)]
    reader = names[0]
    authors = [n for n in names[1:] if task_for_key(n, TASKS) % GROUPS != task_for_key(reader, TASKS) % GROUPS][:3]
    authors.append(next(n for n in names[1:] if task_for_key(n, TASKS) == task_for_key(reader, TASKS)))
    follows = cluster.depot("Timeline", "*follows")
    followers = {a: [reader] + [f"fan{a}{i}" for i in range(k + 1)] for k, a in enumerate(authors)}
    follows.append_many([{"author": a, "follower": f} for a, fs in followers.items() for f in fs], ack="applied")
    posts = [{"author": a, "id": 100 + i, "text": f"post {i}"} for i, a in enumerate(authors)]
    cluster.depot("Timeline", "*posts").append_many(posts, ack="applied")
    page = cluster.query("Timeline", "timeline_page", reader, 10)
    assert page == {p["id"]: {"author": p["author"], "followers": len(followers[p["author"]])} for p in posts}


def _running(cluster: Cluster, group: int) -> int:
    req = pb.QueryRunRequest(module="WordCount", group=group, query="top_words", calls=b"\x90", deadline_ms=5000)
    reply: pb.QueryRunReply = cluster.call_group("WordCount", group, "QueryRun", req).result(timeout=30)
    return reply.running


def test_a_query_past_its_deadline_fails_typed_and_leaves_nothing_running(dc: DevCluster, cluster: Cluster,
                                                                          words: Counter[str]) -> None:
    load_counts(cluster, "WordCount", 150_000, batch=10_000)  # enough that every task's scan takes a while
    began = time.monotonic()
    with pytest.raises(QueryTimeout) as err:
        cluster.query("WordCount", "top_words", timeout_s=0.02)
    assert time.monotonic() - began < 2 and err.value.query == "top_words"
    wait_for(lambda: all(_running(cluster, g) == 0 for g in range(GROUPS)), 10, "no query left running")
    assert len(cluster.query("WordCount", "top_words", timeout_s=60)) == TOP  # and the next one runs whole


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _scan_all_once(cluster: Cluster, n: int, dc: DevCluster, module: str) -> None:
    load_counts(cluster, module, n)
    workers = [proc.pid for proc in dc.nodes.values()]
    rss0 = [_rss(w) for w in workers]
    counts = cluster.pstate(module, "$$counts")
    seen = bytearray(n)
    tracemalloc.start()
    try:
        for page in counts.scan_pages(None, page_size=5000):
            for k, v in page.items:
                i = int(k[1:])
                assert v == i and not seen[i], k
                seen[i] = 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert all(seen) and key_name(n - 1).startswith("k")
    assert peak < 40 << 20, f"the client held {peak >> 20} MiB scanning"  # a page, not the PState
    grown = max(_rss(w) - r for w, r in zip(workers, rss0, strict=True))
    assert grown < 200 << 20, f"a worker grew by {grown >> 20} MiB serving the scan"


def test_a_paged_scan_of_every_task_returns_each_key_once(dc: DevCluster, cluster: Cluster) -> None:
    deploy(dc, "bench.queries:Keys", tasks=TASKS, threads=GROUPS)
    _scan_all_once(cluster, 50_000, dc, "Keys")


@pytest.mark.slow
def test_a_paged_scan_of_a_million_keys_returns_each_key_once_with_bounded_memory(dc: DevCluster,
                                                                                  cluster: Cluster) -> None:
    deploy(dc, "bench.queries:Keys1M", tasks=TASKS, threads=GROUPS)
    _scan_all_once(cluster, 1_000_000, dc, "Keys1M")
