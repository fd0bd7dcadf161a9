"""ReplicaMembership and retired copies (replog/retirement.py): a worker keeps the directory of a replica the plan
retired, deletes it once released, and reopens the replica from it when the group takes it back."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from conductor.worker.membership import ReplicaMembership
from replog.messages import GroupState

RETIRED = GroupState("b", 4, ("b",), (), 9, placement=("b",), storage=(("b", 2, 2),),
                     retired=(("a", 1, 1),), reconfirming=("b",))
RELEASED = GroupState("b", 4, ("b",), (), 10, placement=("b",), storage=(("b", 2, 2),))
TAKEN_BACK = GroupState(None, 4, ("a",), ("b",), 10, placement=("b", "a"), storage=(("a", 1, 1), ("b", 0, 2)))


class FakeMetastore:
    """Runs submitted calls at once; the group znode is whatever the test set."""

    def __init__(self) -> None:
        self.state = RETIRED
        self.groups = SimpleNamespace(get=lambda module, g: (self.state, self.state.version))

    def submit(self, fn: Any, key: object = None) -> None:
        fn()


def setup(tmp_path: Path, retired_host: bool) -> tuple[ReplicaMembership, FakeMetastore, Any, list[Path]]:
    gdir = tmp_path / "M" / "0"
    (gdir / "replog").mkdir(parents=True)
    ms = FakeMetastore()
    opened: list[Path] = []

    def open_replica(rt: Any, rec: Any, *, defer_empty: bool) -> Any:
        assert defer_empty  # (a store not on disk waits for its first use; a copy kept here is on disk)
        opened.append(gdir)
        return SimpleNamespace(start=lambda: None, post=lambda ev: None, removed=False, retired=False)

    modules = SimpleNamespace(is_open=lambda rt: True, adopt=lambda rt, rec, old: rt.hosted.__setitem__(0, rec)
                              or True)
    rt = SimpleNamespace(spec=SimpleNamespace(name="M"), hosted={})
    if retired_host:
        closed = threading.Event()
        closed.set()
        rt.hosted[0] = SimpleNamespace(host=SimpleNamespace(removed=True, retired=True, closed=closed))
    membership = ReplicaMembership("a", tmp_path, cast(Any, ms), cast(Any, modules), open_replica)
    return membership, ms, rt, opened


def test_a_retired_copy_is_kept_until_released(tmp_path: Path) -> None:
    membership, ms, rt, opened = setup(tmp_path, retired_host=True)
    membership.on_group(rt, 0, RETIRED)
    assert (tmp_path / "M" / "0").is_dir()
    ms.state = RELEASED
    membership.on_group(rt, 0, RELEASED)
    assert not (tmp_path / "M" / "0").exists() and not opened


def test_a_kept_copy_found_at_start_is_released_too(tmp_path: Path) -> None:
    membership, ms, rt, _ = setup(tmp_path, retired_host=False)  # the worker restarted while it was retired
    membership.sweep_unlisted("M", {0: RETIRED})
    assert (tmp_path / "M" / "0").is_dir()
    ms.state = RELEASED
    membership.on_group(rt, 0, RELEASED)
    assert not (tmp_path / "M" / "0").exists()


def test_a_taken_back_copy_is_reopened_from_its_directory(tmp_path: Path) -> None:
    membership, ms, rt, opened = setup(tmp_path, retired_host=True)
    ms.state = TAKEN_BACK
    membership.on_group(rt, 0, TAKEN_BACK)
    assert opened == [tmp_path / "M" / "0"] and (tmp_path / "M" / "0" / "replog").is_dir()


def test_the_sweep_at_start_deletes_what_is_neither_a_replica_nor_retired(tmp_path: Path) -> None:
    membership, _, _, _ = setup(tmp_path, retired_host=False)
    membership.sweep_unlisted("M", {0: RELEASED})
    assert not (tmp_path / "M" / "0").exists()


def test_a_kept_copy_is_not_reused_by_a_later_plan_adding_the_worker_anew(tmp_path: Path) -> None:
    """Released and re-added before the release was seen here: the znode records no storage for a, so the replica
    starts empty, as every added replica does."""
    membership, ms, rt, opened = setup(tmp_path, retired_host=True)
    ms.state = GroupState("b", 4, ("b",), ("a",), 11, placement=("b", "a"), storage=(("b", 2, 2),), adding=("a",))
    membership.on_group(rt, 0, ms.state)
    assert opened == [tmp_path / "M" / "0"] and not (tmp_path / "M" / "0" / "replog").exists()
