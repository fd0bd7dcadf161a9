"""The campaign's report: one table row per run, failing runs' stories and replay commands, a JSON line."""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from tests.faults.campaign.nemesis import EVERY_CLASS
from tests.faults.campaign.run import RunConfig, RunResult


@dataclass
class Campaign:
    results: list[RunResult] = field(default_factory=list)
    crashes: list[tuple[RunConfig, str]] = field(default_factory=list)
    console: Console = field(default_factory=lambda: Console(file=sys.stdout, width=160))

    def add(self, r: RunResult) -> None:
        self.results.append(r)
        f = r.findings
        verdict = "ok" if r.ok else "FAILED"
        self.console.print(f"seed {r.config.seed}: {verdict} in {r.seconds:.0f} s; {f.acknowledged} acknowledged, "
                           f"{f.unknown} unknown, {len(f.duplicated)} duplicated, "
                           f"{sum(r.injected.values())} faults", highlight=False)
        if not r.ok or f.duplicated:
            for line in r.story():
                self.console.print(f"    {line}", highlight=False, markup=False)
        if not r.ok:
            print(f"    replay: {r.config.command()}\n    files kept in {r.root}", flush=True)

    def crashed(self, cfg: RunConfig, e: BaseException) -> None:
        self.crashes.append((cfg, f"{type(e).__name__}: {e}"))
        traceback.print_exception(e, file=sys.stdout)
        print(f"seed {cfg.seed}: the run itself failed: {type(e).__name__}: {e}\n    replay: {cfg.command()}",
              flush=True)

    @property
    def ok(self) -> bool:
        return not self.crashes and all(r.ok for r in self.results)

    def print_table(self) -> None:
        t = Table(title="fault campaign")
        for col in ("seed", "s", "acked", "unknown", "lost", "dup", "divergent", "violations", "faults",
                    "unavail s"):
            t.add_column(col, justify="right")
        t.add_column("verdict")
        for r in self.results:
            f = r.findings
            un = "-" if r.max_unavailable_after_heal_s is None else f"{r.max_unavailable_after_heal_s:.1f}"
            t.add_row(str(r.config.seed), f"{r.seconds:.0f}", str(f.acknowledged), str(f.unknown),
                      str(len(f.lost_acknowledged)), str(len(f.duplicated)), str(len(f.divergent_replicas)),
                      str(len(f.violations) + len(r.errors)), str(sum(r.injected.values())), un,
                      "ok" if r.ok else "FAILED")
        for cfg, why in self.crashes:
            t.add_row(str(cfg.seed), "-", "-", "-", "-", "-", "-", "-", "-", "-", f"CRASHED {why[:40]}")
        self.console.print(t)
        per_class = self.summary()["faults_injected"]
        self.console.print("faults injected: " + ", ".join(f"{c} {n}" for c, n in per_class.items()),
                           highlight=False)

    def summary(self) -> dict[str, Any]:
        rs = self.results
        unavail = [r.max_unavailable_after_heal_s for r in rs]
        return {
            "runs": len(rs) + len(self.crashes),
            "crashed_runs": len(self.crashes),
            "failed_seeds": [r.config.seed for r in rs if not r.ok] + [c.seed for c, _ in self.crashes],
            "acknowledged": sum(r.findings.acknowledged for r in rs),
            "unknown": sum(r.findings.unknown for r in rs),
            "lost_acknowledged": sum(len(r.findings.lost_acknowledged) for r in rs),
            "duplicated": sum(len(r.findings.duplicated) for r in rs),
            "divergent_replicas": sum(len(r.findings.divergent_replicas) for r in rs),
            "checker_violations": sum(len(r.findings.violations) + len(r.errors) for r in rs),
            "isr_unjudged": sum(r.findings.isr_unjudged for r in rs),
            "faults_injected": {c: sum(r.injected.get(c, 0) for r in rs) for c in EVERY_CLASS},
            "max_unavailable_after_heal_s": None if any(u is None for u in unavail) or not unavail
            else round(max(u for u in unavail if u is not None), 2),
        }

    def json_line(self) -> str:
        return json.dumps(self.summary())
