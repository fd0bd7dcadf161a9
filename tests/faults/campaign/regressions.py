"""Seeds that once failed, kept as regression tests (`tests/faults/test_campaign.py` runs them).

Each entry is the run that failed (its replay command is `RunConfig.command()`), why it failed, and whether
main passes it now. A seed whose fix is not merged yet is kept with ``xfail`` naming the issue that fixes it,
so it turns into a plain regression test the moment the fix lands.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.faults.campaign.run import RunConfig
from tests.faults.campaign.selection import DEFAULT_FAULTS


@dataclass(frozen=True)
class Regression:
    config: RunConfig
    found: str
    #: why it still fails on this branch (None: it passes)
    xfail: str | None = None


REGRESSIONS: tuple[Regression, ...] = (
    Regression(RunConfig(203, 60.0, DEFAULT_FAULTS, 8),
               "a worker SIGKILLed and restarted within its session timeout exited with NodeAlreadyRegistered "
               "(its dead predecessor's session still held the id); fixed: registration waits for it to expire"),
)
