"""``python -m conductor.worker``: run one worker process."""

from conductor.worker.worker import main

main()
