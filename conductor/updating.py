"""Updating a running module's code with no processing pause: :func:`update_code`.

    result = update_code(conductor, "WordCount", package_code("examples.word_count:WordCount"), module_ref)

Steps (Rama pauses processing for each update; this does not):

1. compare the running version's definition with the new one
   (:func:`topology.upgrade.plan_update`): refused changes stop here;
2. ship the artifact to the workers hosting the module (as a deploy does:
   :func:`~conductor.shipping.put_artifact`), then ask every one to *prepare*
   it beside the running version: check the hash, import in isolation,
   define, build each local replica's runners and nothing else (new PStates
   take spare column families at the switch). Any refusal discards the
   version and raises :class:`~conductor.shipping.CodeRefused` with each
   worker's error; the running version was never touched;
3. name the version in the module's spec, with its version znode, in one
   ZooKeeper transaction (a CAS on the spec);
4. every group's leader sees the spec and appends one *switch entry*: entries
   before it were built by the old version, entries after it by the new one
   (:mod:`topology.group_code`); wait until every leader reports it
   applied. Appends are accepted throughout.

A rollback is the same command with the older code.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conductor.client.code import default_cache, load_deployed
from conductor.controller import Conductor
from conductor.metastore import Metastore
from conductor.metastore.versions import CodeVersion
from conductor.shipping import (
    CodeRefused,
    check_locally,
    discard_code,
    keep_locally,
    prepare_code,
    put_artifact,
)
from conductor.status import Channels, leader_reports
from topology.artifact import Artifact
from topology.upgrade import UpdatePlan, UpdateRefused, plan_update

#: how long the switch may take on every group before update_code gives up waiting (it goes on anyway)
SWITCH_TIMEOUT_S = 60.0
#: how often leaders are asked whether they switched (each ask is a GroupStatus call on their event loop)
SWITCH_POLL_S = 0.2


@dataclass
class UpdateResult:
    """What an update did: the plan, the versions, and how long the switch took once the spec named it."""

    module: str
    old_version: str
    new_version: str
    plan: UpdatePlan
    switched: bool
    switch_s: float = 0.0
    groups: dict[int, str] = field(default_factory=dict)  #: group -> version its leader reports


def switch_progress(reports: dict[int, dict[str, Any]]) -> dict[int, str]:
    """Each group's applied code version, as its leader reports it (missing: unreachable)."""
    return {g: r["code_version"] for g, r in reports.items() if r.get("reachable") and r.get("code_version")}


def running_migrations(reports: dict[int, dict[str, Any]]) -> dict[str, list[int]]:
    """PState -> groups whose migration is not rewritten to its end yet."""
    out: dict[str, list[int]] = {}
    for g, r in sorted(reports.items()):
        for m in r.get("migrations") or []:
            if not m["done"]:
                out.setdefault(m["pstate"], []).append(g)
    return out


def _preparing_nodes(ms: Metastore, module: str) -> tuple[list[str], list[str]]:
    """(the workers that must prepare the new version, the ones skipped): a worker that is down and in no ISR
    of the module serves nothing until it returns, and a returning worker opens its replicas with the version
    the spec names then (``Worker._open_module``), so one dead machine does not block every update. A down
    worker still in an ISR may be elected before it returns: it is asked (and refuses) until it leaves the ISR."""
    groups = [st for st, _v in ms.groups.all(module).values()]
    live, in_isr = set(ms.nodes.sessions()), {n for st in groups for n in st.isr}
    hosting = sorted({n for st in groups for n in st.replicas})
    return ([n for n in hosting if n in live or n in in_isr], [n for n in hosting if n not in live and n not in in_isr])


def update_code(conductor: Conductor, module: str, artifact: Artifact, module_ref: str, *, allow_drop: bool = False,
                tasks: int | None = None, on_step: Callable[[str], None] | None = None,
                switch_timeout_s: float = SWITCH_TIMEOUT_S) -> UpdateResult:
    """Update ``module`` to the code in ``artifact`` (see the module docstring)."""
    with Channels() as channels:  # one per worker for every call of the update (status polls included)
        return _update(conductor, module, artifact, module_ref, allow_drop, tasks, on_step, switch_timeout_s,
                       channels)


def _update(conductor: Conductor, module: str, artifact: Artifact, module_ref: str, allow_drop: bool,
            tasks: int | None, on_step: Callable[[str], None] | None, switch_timeout_s: float,
            pool: Channels) -> UpdateResult:
    step = on_step or (lambda _msg: None)
    ms = conductor.ms
    step(f"comparing {artifact.origin} with the running version of {module}")
    spec, zversion = ms.modules.get(module)
    if tasks is not None and tasks != spec.tasks:
        raise UpdateRefused(module, [f"the task count is fixed at deploy ({spec.tasks}); an update cannot make it "
                                     f"{tasks}"])
    new = check_locally(artifact, module_ref)
    old = load_deployed(ms, spec, default_cache()).build()
    plan = plan_update(old, new, allow_drop=allow_drop)
    if artifact.sha256 == spec.code:
        step(f"module {module} already runs code version {artifact.sha256[:12]}")
        return UpdateResult(module, spec.version, spec.version, plan, True)
    reports = leader_reports(ms, module, pool)
    behind = {g: v for g, v in switch_progress(reports).items() if v != spec.version}
    if behind:
        raise UpdateRefused(module, [f"groups {sorted(behind)} are still switching to version {spec.version[:12]}; "
                                     "wait for `conductor status` to show it everywhere"])
    busy = sorted(set(running_migrations(reports)) & set(plan.migrations))
    if busy:
        raise UpdateRefused(module, [f"the migration of {', '.join(busy)} is still running; wait for it to finish "
                                     "(`conductor status`) before migrating again"])
    for line in plan.lines():
        step(line)
    nodes, skipped = _preparing_nodes(ms, module)
    if skipped:
        step(f"skipping {', '.join(skipped)}: not live and in no ISR (it loads the new version when it returns, "
             "before it serves)")
    addresses = {n: info.address for n in nodes if (info := ms.nodes.get(n)) is not None}
    channels = {n: pool.get(a) for n, a in addresses.items()}
    target = dataclasses.replace(spec, code=artifact.sha256, module_ref=module_ref,
                                 initial_code=spec.initial_version if spec.initial_code is None else spec.initial_code)
    try:
        step(f"shipping code {artifact.sha256[:12]} ({artifact.size:,} bytes) to {', '.join(nodes)}")
        holder, refusals = put_artifact(channels, nodes, artifact)
        if holder is not None:
            step("each worker loads it beside the running version")
            refusals.update(prepare_code(channels, target, [addresses[holder]]))
        refusals.update({n: "not registered in ZooKeeper any more (stopped?), and still in an ISR: wait until it "
                            "leaves it (replication.max.time.lag.ms) or start it" for n in nodes if n not in addresses})
        if refusals:
            raise CodeRefused(module, refusals, update=True)
        version = CodeVersion(artifact.sha256, artifact.size, artifact.kind, module_ref, artifact.origin,
                              tuple(nodes))
        ms.modules.update_code(target, zversion, version)
    except BaseException:
        discard_code(channels, artifact.sha256)
        raise
    keep_locally(artifact)
    step(f"leaders switch to {artifact.sha256[:12]} at one replog entry each")
    started = time.monotonic()
    result = UpdateResult(module, spec.version, target.version, plan, False)
    while True:
        result.groups = switch_progress(leader_reports(ms, module, pool))
        result.switched = len(result.groups) == spec.threads and all(v == target.version
                                                                     for v in result.groups.values())
        if result.switched or time.monotonic() - started > switch_timeout_s:
            result.switch_s = time.monotonic() - started
            return result
        time.sleep(SWITCH_POLL_S)


