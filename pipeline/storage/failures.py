"""What a store says when a write fails: a refused write (KAFKA_STORAGE_ERROR, a failed log
directory) and Delta's refusal of a commit that conflicts with another writer's."""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator

from pipeline.errors import LogDirFailure

__all__ = ["unwritable_error", "is_concurrent_conflict"]

# what a local or Hadoop file system says when it refuses a write (read-only, full, permissions)
_IO_FAILURE = re.compile(r"(java\.io\.\w*(?:IOException|FileNotFoundException)|java\.nio\.file\.\w+Exception"
                         r"|org\.apache\.hadoop\.security\.AccessControlException): ([^\n]*)")


@contextmanager
def unwritable_error(path: str, broker: int | None = None) -> Iterator[None]:
    """A write to `path` that the file system refuses (a read-only directory, a full disk, missing
    permissions) raises KAFKA_STORAGE_ERROR (LogDirFailure), Kafka's error for a log directory that
    failed, naming `broker`'s log (or the table) and what the file system said. A round that meets
    it on a broker's log halts that broker (Cluster.run_round); its commits that landed before are
    undone by the next round (recovery.py)."""
    from py4j.protocol import Py4JJavaError
    try:
        yield
    except Py4JJavaError as err:
        found = _IO_FAILURE.search(str(err))
        if found is None:
            raise
        what = f"the log of broker {broker}" if broker is not None else "the table"
        remedy = (f"A round halts broker {broker} for it (a failed log directory); start_broker({broker}) "
                  "restarts it once its location can be written again, or is replaced by an empty one"
                  if broker is not None else "Make the directory writable (or free space); the next round "
                  "then completes this one, losing nothing")
        raise LogDirFailure(f"{what} at {path} cannot be written: {found.group(2).strip()} ({found.group(1)})",
                            remedy, broker) from None


# Delta's commit-conflict exceptions (io.delta.exceptions): another writer committed first
_CONFLICTS = ("DeltaConcurrentModificationException", "ConcurrentWriteException", "MetadataChangedException",
              "ProtocolChangedException", "ConcurrentAppendException", "ConcurrentDeleteReadException",
              "ConcurrentDeleteDeleteException", "ConcurrentTransactionException")


def is_concurrent_conflict(error: BaseException) -> bool:
    """Whether `error` is Delta's refusal of a commit that conflicts with another writer's: the
    Python class delta-spark converts it to, or a Py4J error naming the Java one."""
    text = str(error)
    return type(error).__name__ in _CONFLICTS or any(f"io.delta.exceptions.{n}" in text for n in _CONFLICTS)

