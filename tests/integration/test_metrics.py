"""Every worker node serves Prometheus metrics that agree with the cluster's state."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from conductor.client import Cluster
from conductor.devcluster import DevCluster
from tests.integration.cluster_helpers import converged, deploy, wait_for


def scrape(dc: DevCluster, node_id: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    address = (dc.node_dir(node_id) / "node.metrics").read_text()
    assert address.startswith("127.0.0.1:")
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_node_metrics_report_roles_offsets_and_counters(tmp_path: Path) -> None:
    with DevCluster(tmp_path / "cluster", nodes=3, session_timeout=4.0) as dc:
        groups = deploy(dc)
        with Cluster.connect(dc.hosts) as cluster:
            # keyed by user, so every group gets some (`*raw` is random: one append_many lands on one task)
            cluster.depot("Clicks", "*clicks").append_many([{"user": f"u{i}", "id": str(i)} for i in range(500)])
        wait_for(lambda: converged(dc, "Clicks"), 30, "replicas to converge")
        for g, st in groups.items():
            key = (("group", str(g)), ("module", "Clicks"), ("node", st.leader))
            m = scrape(dc, st.leader)
            assert m[("millrace_replica_role", (*key[:2], key[2], ("role", "leader")))] == 1.0
            assert m[("millrace_isr_size", key)] == 3
            assert m[("millrace_group_stalled", key)] == 0
            end = m[("millrace_replog_end_offset", key)]
            assert end > 0 and m[("millrace_applied_offset", key)] == end - 1
            assert m[("millrace_appends_total", key)] >= 1
            assert m[("millrace_replog_flushes_total", key)] >= 1
            for follower in st.replicas[1:]:
                fk = (("group", str(g)), ("module", "Clicks"), ("node", follower))
                fm = wait_for(lambda fk=fk, f=follower, e=end: (x := scrape(dc, f))[("millrace_applied_offset", fk)] == e - 1
                              and x, 10, f"{follower} to report the apply offset")
                assert fm[("millrace_replica_role", (*fk[:2], fk[2], ("role", "follower")))] == 1.0
