"""One replication job per root, refused at start.

Rounds are fenced by the replication lease (storage/lease.py): a newer writer takes it over and
the older one fails its next round with FENCED_INSTANCE_ID. That is what lets a job restart after a
crash, but two jobs started on one root by mistake would take the lease from each other round after
round. So a job (jobs/replicate.py, `replog run`) first takes an exclusive lock on
ROOT/.replicate.lock, held for as long as its process lives (the OS releases it when the process
dies, however it dies). A second job on the root is refused at once with REPLICATION_JOB_RUNNING,
naming the holder, and writes nothing.

The lock is a local file system's (flock): a root given as a URI other than file: (s3a://, abfss://)
has none, and there the lease alone keeps one writer."""

from __future__ import annotations

import fcntl
import os
import socket
import time
from typing import IO

from pipeline.errors import ErrorCode, ReplogError
from pipeline.storage import is_uri

LOCK_FILE = ".replicate.lock"


def _local_dir(root: str) -> str | None:
    if root.startswith("file:"):
        return "/" + root[len("file:"):].lstrip("/")
    return None if is_uri(root) else root


def hold_job_lock(root: str) -> IO[str] | None:
    """Takes the root's job lock for the life of this process (keep the returned file open); None
    for a root without a local file system. Raises REPLICATION_JOB_RUNNING when another process
    holds it."""
    directory = _local_dir(root)
    if directory is None or not os.path.isdir(os.path.join(directory, "cluster")):
        return None  # no local root, or no cluster there: opening it says so, and nothing is written
    try:
        handle = open(os.path.join(directory, LOCK_FILE), "a+")
    except OSError:
        return None  # a root this process cannot write: its first commit fails and says so
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ReplogError(ErrorCode.REPLICATION_JOB_RUNNING,
                          f"a replication job already runs on {root} ({holder}); two jobs on one root would "
                          "take the replication lease from each other. Stop that job first (SIGTERM to its pid "
                          "stops it after its round).") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime())}\n")
    handle.flush()
    return handle
