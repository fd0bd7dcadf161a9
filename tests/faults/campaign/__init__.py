"""A Jepsen-style fault campaign: real processes on test hosts, a seeded nemesis, a history and its checker.

``python -m tests.faults.campaign --runs N --seed S`` (``make faults`` runs 100). See README.md here.
"""
