"""ModuleSpec validation, options and JSON."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conductor.metastore.depot_options import (
    CHECK_INTERVAL_MS,
    COMPACTION,
    DELETE_RETENTION_MS,
    RETENTION_BYTES,
    RETENTION_MS,
)
from conductor.metastore.module_spec import (
    DEPOT_APPEND_TIMEOUT_MS,
    FLUSH_MS,
    FSYNC,
    MAX_ENTRY_BYTES,
    MAX_NEAR_SYNC_MESSAGE_LAG,
    MAX_RECORD_BYTES,
    MAX_TIME_LAG_MS,
    MIGRATION_BATCH_INTERVAL_MS,
    MIGRATION_BATCH_KEYS,
    MIN_ISR,
    REASSIGN_COPY_BYTES_PER_S,
    SEGMENT_BYTES,
    InvalidOption,
    InvalidSpec,
    ModuleSpec,
    NotEnoughNodes,
    UnknownOption,
)
from replog.config import FSYNC_ALWAYS


def test_depot_options_name_every_depot_or_one() -> None:
    s = spec(options={RETENTION_BYTES: "1000", RETENTION_BYTES + ".*clicks": "50", COMPACTION + ".*users": "1"})
    assert s.depot_settings("*clicks")["retention_bytes"] == 50
    assert s.depot_settings("*other")["retention_bytes"] == 1000
    assert s.depot_settings("*users")["compaction"] == 1 and s.depot_settings("*other")["compaction"] == 0
    assert s.depot_settings("*dead_letters")["retention_ms"] == 7 * 24 * 3600 * 1000
    assert spec(options={RETENTION_MS: "5"}).depot_settings("*dead_letters")["retention_ms"] == 5
    with pytest.raises(InvalidOption):
        spec(options={RETENTION_MS + ".*clicks": "-1"})
    with pytest.raises(InvalidOption):
        spec(options={COMPACTION: "2"})
    with pytest.raises(UnknownOption):
        spec(options={"depot.retention.minutes.*clicks": "1"})


def spec(**kw: object) -> ModuleSpec:
    args: dict[str, object] = dict(name="WordCount", module_ref="examples.word_count:WordCount", tasks=8,
                                   threads=2, workers=3, replication_factor=3)
    args.update(kw)
    return ModuleSpec(**args)  # type: ignore[arg-type]


def test_defaults_follow_replication_factor() -> None:
    assert spec().effective_options() == {MIN_ISR: 2, MAX_TIME_LAG_MS: 10_000, DEPOT_APPEND_TIMEOUT_MS: 30_000,
                                          MAX_NEAR_SYNC_MESSAGE_LAG: 20_000, SEGMENT_BYTES: 64 * 1024 * 1024,
                                          MIGRATION_BATCH_KEYS: 200, MIGRATION_BATCH_INTERVAL_MS: 50,
                                          MAX_RECORD_BYTES: 4 * 1024 * 1024, MAX_ENTRY_BYTES: 16 * 1024 * 1024,
                                          REASSIGN_COPY_BYTES_PER_S: 16 * 1024 * 1024,
                                          RETENTION_MS: 0, RETENTION_BYTES: 0, COMPACTION: 0,
                                          DELETE_RETENTION_MS: 86_400_000, CHECK_INTERVAL_MS: 5000,
                                          FSYNC: FSYNC_ALWAYS, FLUSH_MS: 100}
    assert spec().shown_options()[FSYNC] == "always"
    assert spec(options={FSYNC: "interval"}).shown_options()[FSYNC] == "interval"
    assert spec(options={FSYNC: "interval"}).replication_config().acks_from_page_cache
    with pytest.raises(InvalidOption, match="must be one of always, interval"):
        spec(options={FSYNC: "sometimes"})
    assert spec(replication_factor=1, workers=1).option(MIN_ISR) == 1


def test_json_round_trip_is_canonical() -> None:
    s = spec(options={MIN_ISR: "3", MAX_TIME_LAG_MS: "1500"})
    assert ModuleSpec.from_json(s.to_json()) == s
    assert s.to_json() == spec(options={MAX_TIME_LAG_MS: "1500", MIN_ISR: "3"}).to_json()
    assert b'"replicationFactor":3' in s.to_json() and b'"moduleRef"' in s.to_json()


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"name": "Word/Count"}, "name="),
        ({"name": ""}, "name="),
        ({"module_ref": "examples.word_count"}, "package.module:ClassName"),
        ({"tasks": 1}, "tasks >= threads"),
        ({"threads": 0}, "at least 1"),
        ({"workers": 2}, "needs at least that many workers"),
        ({"tasks": True}, "whole number"),
    ],
)
def test_bad_specs_say_what_to_fix(kw: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidSpec, match=match):
        spec(**kw)


def test_options_are_validated() -> None:
    with pytest.raises(UnknownOption, match=r"known options: .*replication\.depot\.append\.timeout\.millis"):
        spec(options={"replication.min.isrr": "2"})
    with pytest.raises(InvalidOption, match="cannot exceed the replication factor 3"):
        spec().with_option(MIN_ISR, "4")
    with pytest.raises(InvalidOption, match="whole number"):
        spec().with_option(MAX_TIME_LAG_MS, "ten")
    with pytest.raises(InvalidOption, match="greater than 0"):
        spec().with_option(MAX_NEAR_SYNC_MESSAGE_LAG, "0")
    assert spec().with_option(MIN_ISR, "1").option(MIN_ISR) == 1


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({SEGMENT_BYTES: "1"}, r"replog\.segment\.bytes: must be between 65,536 and 1,073,741,824"),
        ({SEGMENT_BYTES: str(2 << 30)}, "must be between 65,536"),
        ({SEGMENT_BYTES: "-5"}, "greater than 0"),
        ({MAX_TIME_LAG_MS: "0"}, "greater than 0"),
        ({MAX_TIME_LAG_MS: "-100"}, "greater than 0"),
        ({MAX_TIME_LAG_MS: "50"}, "drops healthy followers"),
        ({MAX_TIME_LAG_MS: str(10 * 24 * 3600 * 1000)}, "between 1,000"),
        ({DEPOT_APPEND_TIMEOUT_MS: "0"}, "greater than 0"),
        ({DEPOT_APPEND_TIMEOUT_MS: "1.5"}, "whole number"),
        ({DEPOT_APPEND_TIMEOUT_MS: "5000"}, r"must exceed replication\.max\.time\.lag\.millis \(10,000\)"),
        ({MAX_TIME_LAG_MS: "40000"}, r"'30000 \(default\)'.*must exceed .*\(40,000\)"),
        ({MAX_NEAR_SYNC_MESSAGE_LAG: str(1 << 40)}, "a count of replog entries"),
        ({MIN_ISR: "0"}, "greater than 0"),
        ({MIN_ISR: "4"}, "cannot exceed the replication factor 3"),
    ],
)
def test_each_option_rule_refuses_with_what_to_fix(options: dict[str, str], match: str) -> None:
    with pytest.raises(InvalidOption, match=match):
        spec(options=options)
    key, value = next(iter(options.items()))
    with pytest.raises(InvalidOption, match=match):  # set-option goes through the same rules
        spec().with_option(key, value)


def test_options_are_checked_together_and_against_the_replication_factor() -> None:
    both = spec(options={MAX_TIME_LAG_MS: "1500", DEPOT_APPEND_TIMEOUT_MS: "3000"})
    with pytest.raises(InvalidOption, match="must exceed"):
        both.with_option(MAX_TIME_LAG_MS, "3000")
    assert both.with_option(DEPOT_APPEND_TIMEOUT_MS, "3001").option(DEPOT_APPEND_TIMEOUT_MS) == 3001
    with pytest.raises(InvalidOption, match="cannot exceed the replication factor 1"):
        spec(replication_factor=1, workers=1, options={MIN_ISR: "2"})
    assert spec(options={SEGMENT_BYTES: str(64 * 1024)}).option(SEGMENT_BYTES) == 64 * 1024


def test_entry_limits_stay_below_the_transport_and_in_order() -> None:
    with pytest.raises(InvalidOption, match="at most 33,554,432"):
        spec().with_option(MAX_ENTRY_BYTES, str(64 << 20))
    with pytest.raises(InvalidOption, match="must not exceed"):
        spec().with_option(MAX_RECORD_BYTES, str(20 << 20))  # over the default entry limit of 16 MiB
    with pytest.raises(InvalidOption, match="must not exceed"):
        spec().with_option(MAX_ENTRY_BYTES, str(1 << 20))  # under the default record limit of 4 MiB
    s = spec().with_option(MAX_RECORD_BYTES, "1000").with_option(MAX_ENTRY_BYTES, "5000")
    c = s.replication_config()
    assert (c.max_record_bytes, c.max_entry_bytes) == (1000, 5000)


def test_from_json_rejects_garbage() -> None:
    with pytest.raises(InvalidSpec, match="not valid JSON"):
        ModuleSpec.from_json(b"{nope")
    with pytest.raises(InvalidSpec, match="missing field"):
        ModuleSpec.from_json(b'{"name": "X"}')


def test_check_placeable() -> None:
    with pytest.raises(NotEnoughNodes, match="replication factor 3 needs 3 distinct live node"):
        spec().check_placeable(["n1", "n2"])
    with pytest.raises(NotEnoughNodes, match="workers=4"):
        spec(workers=4).check_placeable(["n1", "n2", "n3"])
    spec().check_placeable(["n1", "n2", "n3"])


@given(tasks=st.integers(1, 64), data=st.data())
def test_tasks_partition_into_groups(tasks: int, data: st.DataObject) -> None:
    threads = data.draw(st.integers(1, tasks))
    s = spec(tasks=tasks, threads=threads)
    seen = sorted(t for g in range(threads) for t in s.tasks_of(g))
    assert seen == list(range(tasks))
    assert all(s.group_of(t) == t % threads for t in range(tasks))
