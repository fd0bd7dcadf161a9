"""``/millrace/modules/<module>/versions/<sha256>``: the code versions a module keeps.

Only metadata lives here (docs/metastore.md: no data goes through
ZooKeeper): the artifact's hash, size and kind, the class it provides, and the
workers that held it when it was deployed, so that a worker that lacks it
(a replacement, a wiped disk) knows whom to fetch it from. The bytes stay on
workers. A version is created in the same transaction as its module (and, in
the update issue, beside the running one), and goes with the module.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kazoo.exceptions import NoNodeError

from conductor.metastore.errors import ModuleNotFound
from conductor.metastore.layout import MODULES_PATH, module_path, version_path

if TYPE_CHECKING:
    from conductor.metastore.session import Metastore


@dataclass(frozen=True)
class CodeVersion:
    """One code artifact of a module, as the metastore keeps it."""

    sha256: str
    size: int
    kind: str  #: ``package`` (a top-level package the deploy zipped) or ``wheel`` (given with --code)
    module_ref: str
    origin: str  #: what was packaged, for operators
    holders: tuple[str, ...] = ()  #: workers that held the artifact when it was deployed
    created: float = field(default_factory=time.time)

    def to_json(self) -> bytes:
        return json.dumps({"sha256": self.sha256, "size": self.size, "kind": self.kind, "moduleRef": self.module_ref,
                           "origin": self.origin, "holders": list(self.holders), "created": self.created},
                          sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> CodeVersion:
        d = json.loads(raw)
        return cls(d["sha256"], int(d["size"]), d["kind"], d["moduleRef"], d["origin"], tuple(d["holders"]),
                   float(d["created"]))


class Versions:
    """Read the code versions of modules (they are written with the module, see ``Modules.create``)."""

    def __init__(self, ms: Metastore) -> None:
        self.ms = ms

    def get(self, module: str, sha256: str) -> CodeVersion | None:
        try:
            data, _ = self.ms.call(self.ms.zk.get, version_path(module, sha256))
        except NoNodeError:
            return None
        return CodeVersion.from_json(data)

    def all(self, module: str) -> list[CodeVersion]:
        try:
            names = self.ms.call(self.ms.zk.get_children, f"{module_path(module)}/versions")
        except NoNodeError:
            if self.ms.call(self.ms.zk.exists, module_path(module)) is None:
                raise ModuleNotFound(module) from None
            return []  # deployed with code on the workers' path
        found = (self.get(module, h) for h in sorted(names))
        return [v for v in found if v is not None]

    def referenced(self) -> set[str]:
        """Every code version some deployed module keeps: a worker deletes no artifact in this set."""
        out: set[str] = set()
        for module in self.ms.call(self.ms.zk.get_children, MODULES_PATH):
            try:
                out.update(self.ms.call(self.ms.zk.get_children, f"{module_path(module)}/versions"))
            except NoNodeError:
                continue
        return out
