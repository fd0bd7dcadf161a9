"""Which fault classes run where: the selection syntax, and the classes `make test` uses on main.

Every class passes on merged main (issue 13's safety work made the disk classes pass: a replica that lost
data is not eligible, reads are verified, one group's fault stays in that group, damaged data is quarantined
and rebuilt), so the short campaign of `make test` draws from all of them; with 30 s of faults a run takes about
as long as with the process, network and ZooKeeper classes alone (38-40 s). `make faults` runs every class.
"""

from __future__ import annotations

from tests.faults.campaign.nemesis import (
    CLASSES,
    DISK,
    EVERY_CLASS,
    MEMBERSHIP,
    NETWORK,
    POWER,
    PROCESS,
    ZOOKEEPER,
)

#: "all" is every class but the membership ones (issue 27), so seeds recorded with "all" replay unchanged
ALL_BUT_MEMBERSHIP = tuple(c for c in CLASSES if c not in MEMBERSHIP)
GROUPS = {"process": PROCESS, "network": NETWORK, "zookeeper": ZOOKEEPER, "disk": DISK,
          "membership": MEMBERSHIP, "all": ALL_BUT_MEMBERSHIP, "power": POWER, "none": ()}
#: What passes on main today: every class but the reassignment nemesis, which has not had a campaign yet.
DEFAULT_FAULTS = ALL_BUT_MEMBERSHIP
#: The classes before the disk ones joined (what seeds found then replay).
NO_DISK = (*PROCESS, *NETWORK, *ZOOKEEPER)


def parse_faults(spec: str) -> tuple[str, ...]:
    """'kill_worker,network' -> the classes named, groups expanded, in EVERY_CLASS order; ValueError if unknown."""
    chosen: set[str] = set()
    for word in (w.strip() for w in spec.split(",") if w.strip()):
        if word in GROUPS:
            chosen.update(GROUPS[word])
        elif word in EVERY_CLASS:
            chosen.add(word)
        else:
            raise ValueError(f"unknown fault class {word!r}; known: {', '.join(EVERY_CLASS)} or {', '.join(GROUPS)}")
    return tuple(c for c in EVERY_CLASS if c in chosen)
