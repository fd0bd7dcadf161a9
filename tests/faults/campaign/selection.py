"""Which fault classes run where: the selection syntax, and the classes `make test` uses on main.

The disk classes (bit flips in a stopped follower's replog and SST files, torn replog tails, a lost data
folder, a full disk) need the safety work of issue 13 (a replica that lost data is not eligible, verified
reads, fault isolation); until it is merged they find the bugs it fixes, so the short campaign of `make test`
leaves them out. `make faults` runs every class.
"""

from __future__ import annotations

from tests.faults.campaign.nemesis import CLASSES, DISK, NETWORK, PROCESS, ZOOKEEPER

GROUPS = {"process": PROCESS, "network": NETWORK, "zookeeper": ZOOKEEPER, "disk": DISK, "all": CLASSES,
          "none": ()}
#: What passes on main today (process, network and ZooKeeper faults).
DEFAULT_FAULTS = (*PROCESS, *NETWORK, *ZOOKEEPER)


def parse_faults(spec: str) -> tuple[str, ...]:
    """'kill_worker,network' -> the classes named, groups expanded, in CLASSES order; ValueError if unknown."""
    chosen: set[str] = set()
    for word in (w.strip() for w in spec.split(",") if w.strip()):
        if word in GROUPS:
            chosen.update(GROUPS[word])
        elif word in CLASSES:
            chosen.add(word)
        else:
            raise ValueError(f"unknown fault class {word!r}; known: {', '.join(CLASSES)} or {', '.join(GROUPS)}")
    return tuple(c for c in CLASSES if c in chosen)
