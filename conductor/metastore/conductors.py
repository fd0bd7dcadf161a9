"""``/millrace/conductor/election``: conductor high availability (kazoo's Election recipe).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kazoo.recipe.election import Election

from conductor.metastore.layout import ELECTION_PATH

if TYPE_CHECKING:
    from conductor.metastore.session import Metastore



class ConductorElection:
    """The conductors' election: exactly one conductor is active."""

    def __init__(self, ms: Metastore) -> None:
        self.ms = ms

    def election(self, identifier: str) -> Election:
        """A kazoo Election on ``/millrace/conductor/election`` for this session."""
        return self.ms.zk.Election(ELECTION_PATH, identifier)

    def contenders(self) -> list[str]:
        """Conductor names in election order; the first one is active."""
        return list(self.ms.call(self.election("").contenders))
