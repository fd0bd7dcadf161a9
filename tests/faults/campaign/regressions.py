"""Seeds that once failed, kept as regression tests (`tests/faults/test_campaign.py` runs them).

Each entry is the run that failed (its replay command is `RunConfig.command()`), why it failed, and whether
main passes it now. A seed whose fix is not merged yet is kept with ``xfail`` naming the issue that fixes it,
so it turns into a plain regression test the moment the fix lands.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.faults.campaign.run import RunConfig
from tests.faults.campaign.selection import NO_DISK, parse_faults

ALL = parse_faults("all")


@dataclass(frozen=True)
class Regression:
    config: RunConfig
    found: str
    #: why it still fails on this branch (None: it passes)
    xfail: str | None = None


REGRESSIONS: tuple[Regression, ...] = (
    Regression(RunConfig(203, 60.0, NO_DISK, 8),
               "a worker SIGKILLed and restarted within its session timeout exited with NodeAlreadyRegistered "
               "(its dead predecessor's session still held the id); fixed: registration waits for it to expire"),
    Regression(RunConfig(300, 60.0, ALL, 8),
               "bit flips in stopped followers' replog segments: on restart Log.open raises CorruptLog, the worker "
               "cannot open the module at all ('it stays unavailable here'), so every group loses that replica; "
               "with a second corrupted follower every group stalls below min-ISR and never recovers; fixed by "
               "issue 13 (fault isolation), then (merged main) the damaged replica retried the same open forever: "
               "fixed, a replica that cannot open on damage is quarantined before its retry and rebuilt"),
    Regression(RunConfig(302, 60.0, ALL, 8),
               "a full disk on w3 (the sole ISR member and leader of group 0 after two other faults): its task "
               "threads crash on ENOSPC ('the replica stops, restart the node to recover'), w3 keeps its "
               "leadership and session, and group 0 stays unavailable after the disk is freed; fixed by issue 13"),
    Regression(RunConfig(501, 60.0, ALL, 8),
               "bit flips in a stopped follower's SST file: on restart RocksDB reports corruption (CorruptStore), "
               "the worker cannot open the module, and the replica is never rebuilt from the leader; fixed by "
               "issue 13"),
    Regression(RunConfig(2016, 60.0, ALL, 8),
               "a follower restarted with an emptied data folder took 38 s to over 90 s to rejoin its ISRs (the "
               "cluster did not converge): the beats queued for it while it was down (one per apply advance) "
               "each drew a reset ack, and each reset ack a resend of the leader's whole window, tens of seconds "
               "of duplicate windows on both task threads; fixed: a follower asks for a resend at most once per "
               "request timeout, an unreconciled follower is beaten per heartbeat. A replay also hit a kill "
               "between a follower's entries and its epoch file (fixed: epochs first)"),
    Regression(RunConfig(2072, 60.0, ALL, 8),
               "bit flips in the SST holding a stopped follower's _meta: RocksDB opened the file and the open's "
               "first read failed with a bare Exception, so the worker refused the whole module ('it stays "
               "unavailable here') and never converged; fixed: that read is typed (CorruptStore), the failed "
               "open lets go of RocksDB, and the replica is quarantined and rebuilt like damage found by "
               "verification"),
    Regression(RunConfig(2314, 60.0, ALL, 8),
               "a worker restarted after a torn tail met its crashed predecessor's node at registration, and that "
               "session expired between the create and the read of the node's owner: the read's NoNodeError made "
               "the worker exit while starting; fixed: registration creates again when the stale node is gone"),
    Regression(RunConfig(3401, 45.0, parse_faults("kill_worker,pause_worker,kill_conductor,reassign"), 8),
               "the first campaign run of the reassign class (session 10): nothing acknowledged was lost, but "
               "re-adding w3 to group 2 did not complete within the heal's 90 s and was cancelled, and the "
               "checker compared replicas a reassignment had rebuilt (a log starting after a far-horizon "
               "checkpoint) or removed (an empty group directory) byte for byte with their leader. Session 11: "
               "the checker judges a rebuilt replica on the entries both logs hold and reads only the final "
               "members; the replay passes (15,015 acknowledged, 0 lost, at load 12-15); the 90-s stall of the "
               "re-add did not recur"),
    Regression(RunConfig(3604, 60.0, (*ALL, "reassign"), 8),
               "session 13: w3's replica of group 0 restarted after a full disk at the moment w3's ZooKeeper "
               "session expired; it could not read its group's state then, and the group watch reports changes "
               "only, so it never learnt its leader and never caught up (the cluster did not converge; nothing "
               "lost). Fixed: a reopened replica reads its group's state again until ZooKeeper answers"),
    Regression(RunConfig(3620, 60.0, (*ALL, "reassign"), 8, secure=True),
               "session 13: a reassignment injected second in a round was healed first; its plan keeps a retired "
               "copy until the kept replicas reconfirm, which the worker a bit-flip fault kept stopped could not "
               "do, and both plan waits of the heal timed out (nothing lost). Fixed in the nemesis: a reassignment "
               "is healed after the other faults of its round"),
    Regression(RunConfig(3750, 60.0, parse_faults("all,membership,power_loss"), 8, fsync="interval"),
               "session 17: a power loss on w3 while a partition cut it from ZooKeeper; the power loss's heal "
               "(healed first, as the last injected) could not restart w3 until the partition healed, then waited "
               "60 s for w3's new storage incarnation, which only the final heal's restart could record (nothing "
               "lost). Fixed in the nemesis: that check waits for the final heal"),
)
