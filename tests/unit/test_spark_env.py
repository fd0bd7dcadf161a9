"""The Spark launch retry: only a JVM that died before starting is launched again."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.errors import PySparkRuntimeError

from topology.spark.session import _launch


class Builder:
    """Stands in for SparkSession.builder: fails with the given conditions, then returns a session."""

    def __init__(self, *conditions: str) -> None:
        self.conditions = list(conditions)
        self.calls = 0

    def getOrCreate(self) -> Any:
        self.calls += 1
        if self.conditions:
            raise PySparkRuntimeError(errorClass=self.conditions.pop(0), messageParameters={})
        return "session"


def test_a_jvm_that_exited_before_starting_is_launched_again() -> None:
    b = Builder("JAVA_GATEWAY_EXITED", "JAVA_GATEWAY_EXITED")
    assert _launch(b, attempts=3) == "session"
    assert b.calls == 3


def test_it_gives_up_after_the_attempts_and_never_retries_other_errors() -> None:
    b = Builder("JAVA_GATEWAY_EXITED", "JAVA_GATEWAY_EXITED")
    with pytest.raises(PySparkRuntimeError):
        _launch(b, attempts=2)
    assert b.calls == 2
    other = Builder("SESSION_ALREADY_EXIST")
    with pytest.raises(PySparkRuntimeError):
        _launch(other, attempts=3)
    assert other.calls == 1
