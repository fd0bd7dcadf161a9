"""Backups of a module's task groups and restores from them (``conductor backup``, ``conductor restore``).

:mod:`~conductor.backups.layout` is the folder and its checksum manifest, :mod:`~conductor.backups.take` copies
each group's checkpoint from its leader, :mod:`~conductor.backups.restore` creates a module from a backup.
The worker's sides are :mod:`conductor.worker.far_horizon` (the same checkpoint rounds as a far-horizon copy) and
:mod:`conductor.worker.restore_receiver`. The layout and what a restored group starts at: docs/backups.md.
"""
