"""The far-horizon round rule: when a follower copying the leader's checkpoint stops copying and installs.

A far-horizon copy goes in rounds: each round fetches a fresh checkpoint of
the leader's applied state (only the files the follower lacks). Appends go on
meanwhile, so after a round the checkpoint may still be far behind the
leader's log end; installing then would only start a long replay, or another
far-horizon offer. The worker's transfer and the simulator both ask
:func:`round_is_last` after every round, so the rule they run is the same.
"""

from __future__ import annotations

#: a follower that still lags after this many rounds installs anyway; the leader re-offers if it must
MAX_ROUNDS = 20


def round_is_last(behind: int, near_lag: int, rnd: int, max_rounds: int = MAX_ROUNDS) -> bool:
    """After round ``rnd``, with the checkpoint ``behind`` entries short of the leader's log end: install now?

    Yes once the checkpoint is within half the near-horizon window
    (``replication.max.near.sync.message.lag``): the replay that follows is
    short and cannot itself trigger far horizon again. Yes on the last round
    too: rounds must end even under appends that outrun the copy.
    """
    assert rnd >= 1 and near_lag >= 1 and max_rounds >= 1, (rnd, near_lag, max_rounds)
    return behind <= near_lag // 2 or rnd >= max_rounds
