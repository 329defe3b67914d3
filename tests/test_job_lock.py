"""One replication job per root (pipeline/storage/job_lock.py): a second one is refused, naming the first."""

import os

import pytest

from pipeline.errors import ErrorCode, ReplogError
from pipeline.storage.job_lock import LOCK_FILE, hold_job_lock


def test_a_second_job_is_refused_until_the_first_lets_go(tmp_path):
    (tmp_path / "cluster").mkdir()
    first = hold_job_lock(str(tmp_path))
    assert first is not None
    with pytest.raises(ReplogError) as refused:
        hold_job_lock(str(tmp_path))  # another open file: flock refuses it as it would another process
    assert refused.value.code == ErrorCode.REPLICATION_JOB_RUNNING
    assert f"pid {os.getpid()} on " in str(refused.value) and str(tmp_path) in str(refused.value)
    first.close()  # the process ends (or the job stops): the next job takes the root
    again = hold_job_lock(f"file://{tmp_path}")
    assert again is not None
    again.close()


def test_no_lock_where_there_is_no_cluster_or_no_local_file_system(tmp_path):
    assert hold_job_lock(str(tmp_path / "missing")) is None
    assert hold_job_lock(str(tmp_path)) is None  # a directory without a cluster: nothing written
    assert not (tmp_path / LOCK_FILE).exists()
    assert hold_job_lock("s3a://bucket/replog") is None  # the replication lease fences there
