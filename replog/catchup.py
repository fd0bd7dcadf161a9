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


#: a first round that lasted longer than this is followed by another (see behind_at_install)
QUICK_ROUND_S = 1.0


def behind_at_install(behind: int, round_s: float, rate: float | None, near_lag: int) -> int:
    """How many entries short of the leader a checkpoint is by the end of its round (what
    :func:`replog.catchup.round_is_last` judges), not when it was taken: a round that lasted a while (a big
    store, a throttled copy) left the leader ``rate x round_s`` entries further on, and a replica installed that
    far behind would be offered a far-horizon copy again at once, for ever under steady appends (a throttled
    bench copy did). ``rate`` (entries/s) comes from two rounds' log ends; after the first round it is unknown,
    so a first round longer than :data:`QUICK_ROUND_S` counts as a whole near-horizon window behind (another
    round, which copies only the files flushed or compacted meanwhile)."""
    if rate is None:
        return behind if round_s <= QUICK_ROUND_S else max(behind, near_lag)
    return behind + int(max(rate, 0.0) * round_s)
