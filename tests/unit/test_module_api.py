from __future__ import annotations

import subprocess
import sys

import pytest

from topology import (
    Module,
    ModuleDefinitionError,
    custom,
    global_,
    hash_by,
    load_module,
    random,
    task_for_key,
)


class Words(Module):
    def define(self, m):
        m.depot("*sentences", random)
        m.depot("*events", hash_by(lambda e: e["user"]))
        m.pstate("$$counts", {"schema": "placeholder"})


def test_build_collects_declarations_in_order() -> None:
    md = Words.build()
    assert md.name == "Words"
    assert md.depot_names() == ["*sentences", "*events", "*dead_letters"]  # the dead-letter depot comes last
    assert md.pstate_names() == ["$$counts"]


@pytest.mark.parametrize("bad", ["sentences", "$$x", "*", "*has space"])
def test_depot_names_are_checked(bad: str) -> None:
    class Bad(Module):
        def define(self, m):
            m.depot(bad)

    with pytest.raises(ModuleDefinitionError, match="depot name"):
        Bad.build()


def test_pstate_names_and_duplicates_are_checked() -> None:
    class NoDollar(Module):
        def define(self, m):
            m.pstate("counts", None)

    with pytest.raises(ModuleDefinitionError, match=r"must start with '\$\$'"):
        NoDollar.build()

    class Twice(Module):
        def define(self, m):
            m.depot("*a")
            m.depot("*a")

    with pytest.raises(ModuleDefinitionError, match="declared twice"):
        Twice.build()


def test_topology_must_subscribe_to_declared_depots() -> None:
    class Unknown(Module):
        def define(self, m):
            m.depot("*a")

            @m.stream("*b")
            def t(ctx, rec):
                return None

    with pytest.raises(ModuleDefinitionError, match="unknown depot '\\*b'"):
        Unknown.build()


def test_partitioners_stay_in_range_and_hash_is_stable_across_processes() -> None:
    for tasks in (1, 3, 8):
        assert all(0 <= random("x", tasks) < tasks for _ in range(100))
        assert global_("x", tasks) == 0
    by_user = hash_by(lambda e: e["user"])
    assert by_user({"user": "ann"}, 8) == by_user({"user": "ann", "n": 2}, 8)
    here = [task_for_key(k, 16) for k in ("a", 1, -5, b"x", ("t", 2))]
    code = "from topology import task_for_key; print([task_for_key(k, 16) for k in ('a', 1, -5, b'x', ('t', 2))])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert other.strip() == str(here)


def test_custom_partitioner_out_of_range_is_a_clear_error() -> None:
    p = custom("broken", lambda _r, tasks: tasks)
    with pytest.raises(ValueError, match="must be an int in"):
        p("x", 4)


def test_load_module_by_reference() -> None:
    assert load_module("tests.unit.test_module_api:Words") is Words
    with pytest.raises(ModuleDefinitionError, match=r"package\.module:ClassName"):
        load_module("no_colon")
    with pytest.raises(ModuleDefinitionError, match="cannot import"):
        load_module("does.not.exist:X")
    with pytest.raises(ModuleDefinitionError, match="not name a Module"):
        load_module("topology.partitioners:stable_hash")
