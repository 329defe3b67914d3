"""File-system faults the tests inject: a directory tree that refuses writes."""

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def read_only(directory, on: bool) -> None:
    """Makes a directory tree read-only (or writable again): chmod for a user, and for root (whom
    permissions do not stop) the immutable attribute."""
    directory = Path(directory)
    dirs = [directory] + [p for p in directory.rglob("*") if p.is_dir()]
    if os.geteuid() != 0:
        for d in dirs:
            d.chmod(0o555 if on else 0o755)
        return
    subprocess.run(["chattr", "+i" if on else "-i", *map(str, dirs)], check=True, capture_output=True)


@contextlib.contextmanager
def scratch_dir(prefix: str):
    """A temporary directory, removed afterwards even when a fault left part of it read-only (a
    soak that failed with a broker's location refusing writes)."""
    root = tempfile.mkdtemp(prefix=prefix)
    try:
        yield root
    finally:
        read_only(root, False)
        shutil.rmtree(root, ignore_errors=True)
