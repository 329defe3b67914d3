"""Delta table maintenance (pipeline/storage/maintenance.py): compaction of the small files rounds leave,
VACUUM within its retention and Delta log retention, on a real cluster's tables and logs."""

import os
import shutil
import time

import pytest
from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock
from pipeline.errors import ReplogError

CONFIG = {"log.maintenance.min.files": 4, "log.maintenance.file.retention.ms": 3600000,
          "log.maintenance.interval.ms": 60000}
HOUR_S = 3600


class Crash(Exception):
    pass


def _parquet_files(path: str) -> int:
    return sum(1 for _, _, files in os.walk(path) for f in files if f.endswith(".parquet"))


def _rows(spark, path: str) -> list:
    return sorted(spark.read.format("delta").load(path).drop("value").collect())


@pytest.fixture(scope="module")
def maintained(spark, tmp_path_factory):
    """A cluster after 4 rounds of produce, its logs' rows, then one maintenance pass."""
    clock = ManualClock(start_ms=0)
    cluster = Cluster.create(spark, str(tmp_path_factory.mktemp("maint") / "c"), brokers=3, clock=clock,
                             config=CONFIG)
    cluster.create_topic("t", partitions=3, replication_factor=3)
    for i in range(4):
        cluster.produce("t", [{"value": f"v{i}-{p}", "partition": p} for p in range(3)], acks="all")
        clock.advance(500)
        cluster.run_round()
    logs = [cluster.storage.log_path(b) for b in range(3)]
    before = {"rows": [_rows(spark, p) for p in logs], "files": [cluster.storage.snapshot(p).numOfFiles() for p in logs],
              "results": sorted(cluster.storage.read("results").collect()), "on_disk": _parquet_files(logs[1])}
    # what a write killed before its commit leaves: a data file no version references, 2 hours old
    some = next(f for f in os.listdir(logs[0]) if f.endswith(".parquet"))
    orphan = os.path.join(logs[0], "part-00000-killed-write.c000.snappy.parquet")
    shutil.copy(os.path.join(logs[0], some), orphan)
    os.utime(orphan, (time.time() - 2 * HOUR_S, time.time() - 2 * HOUR_S))
    before["orphan"] = orphan
    report = cluster.maintain()
    return cluster, clock, logs, before, report


def test_a_pass_compacts_the_small_files_of_logs_and_tables_keeping_every_row(spark, maintained):
    cluster, _, logs, before, report = maintained
    assert all(n >= 4 for n in before["files"])  # a file or more per round
    assert {"log of broker 0", "log of broker 1", "log of broker 2", "results"} <= set(report.compacted)
    for path, rows in zip(logs, before["rows"]):
        assert cluster.storage.snapshot(path).numOfFiles() == 1
        assert _rows(spark, path) == rows
    assert sorted(cluster.storage.read("results").collect()) == before["results"]
    assert report.files_removed > report.files_added == len(report.compacted)


def test_vacuum_deletes_unreferenced_files_older_than_the_retention_and_keeps_the_newer(maintained):
    cluster, _, logs, before, report = maintained
    assert not os.path.exists(before["orphan"])  # the killed write's file, 2 h old: gone
    assert report.files_vacuumed == 1
    # the small files compaction replaced were removed just now: kept for the retention (1 hour),
    # so readers of the versions before it and the recovery of a round still find them
    assert _parquet_files(logs[1]) == before["on_disk"] + 1
    assert cluster.storage.snapshot(logs[1]).numOfFiles() == 1


def test_retention_properties_are_set_once_and_the_change_feed_tables_keep_their_history(maintained):
    cluster, _, logs, _, report = maintained
    assert {"results", "rounds", "log of broker 0"} <= set(report.properties_set)
    assert "inbox" not in report.properties_set and "admin" not in report.properties_set
    results = cluster.storage.snapshot(cluster.storage.path("results")).metadata().configuration()
    inbox = cluster.storage.snapshot(cluster.storage.path("inbox")).metadata().configuration()
    assert results.apply("delta.logRetentionDuration") == "interval 604800000 milliseconds"
    assert results.apply("delta.deletedFileRetentionDuration") == "interval 3600000 milliseconds"
    # read as a change feed from the job's position: Delta's defaults (30 days of log, 7 of files)
    assert not inbox.contains("delta.logRetentionDuration") and not inbox.contains("delta.deletedFileRetentionDuration")


def test_the_job_step_runs_by_the_cluster_clock_and_rounds_go_on_after_it(spark, maintained):
    cluster, clock, logs, _, _ = maintained
    assert cluster.maintain_if_due() is None  # the pass above was just now
    clock.advance(59_999)
    assert cluster.maintain_if_due() is None
    clock.advance(1)
    again = cluster.maintain_if_due()
    assert again is not None and again.properties_set == [] and again.compacted == []
    # the pass's time is the cluster's, not this process's: a job started now has none due
    assert Cluster.open(spark, cluster.storage.root, clock=clock).maintain_if_due() is None
    rid = cluster.produce("t", [{"value": "after", "partition": 1}], acks="all")
    clock.advance(500)
    cluster.run_round()
    clock.advance(500)
    cluster.run_round()
    assert {r["status"] for r in cluster.produce_results().filter(F.col("request_id") == rid).collect()} == {"acked"}
    assert {max(r["offset"] for r in _rows(spark, p) if r["partition"] == 1) for p in logs} == {4}  # on every replica


def test_a_round_killed_after_a_pass_is_undone_and_replayed(spark, maintained):
    cluster, clock, logs, _, _ = maintained
    cluster.maintain()
    rid = cluster.produce("t", [{"value": "crash", "partition": 2}], acks="all")
    commits = []

    def hook(path, step):
        commits.append(step)
        if len(commits) == 2:
            raise Crash(step)

    cluster.storage.after_commit = hook
    clock.advance(500)
    with pytest.raises(Crash):
        cluster.run_round()
    cluster.storage.after_commit = None
    reopened = Cluster.open(spark, cluster.storage.root, clock=clock)
    for _ in range(2):
        clock.advance(500)
        reopened.run_round()
    assert {r["status"] for r in reopened.produce_results().filter(F.col("request_id") == rid).collect()} == {"acked"}
    rows = [_rows(spark, p) for p in logs]
    assert rows[0] == rows[1] == rows[2]
    assert [r["offset"] for r in rows[0] if r["partition"] == 2] == [0, 1, 2, 3, 4]  # the record once


def test_maintenance_settings_are_checked(new_cluster):
    with pytest.raises(ReplogError, match="log.maintenance.min.files"):
        new_cluster(config={"log.maintenance.min.files": 0})
    with pytest.raises(ReplogError, match=r"log.maintenance.file.retention.ms.*3600000"):
        new_cluster(config={"log.maintenance.file.retention.ms": 60000})
    with pytest.raises(ReplogError, match=r"INVALID_CONFIG.*'log.maintenance.log.retention.ms' \(3600000\) must be at least"):
        new_cluster(config={"log.maintenance.log.retention.ms": 3600000})  # below the file retention's 7 days


def test_a_cluster_without_a_pass_starts_counting_at_the_first_job_step(spark, new_cluster, clock):
    cluster = new_cluster(config={"log.maintenance.interval.ms": 1000})
    assert cluster.maintain_if_due() is None  # recorded now, no pass: a job's first round stays quick
    clock.advance(999)
    assert Cluster.open(spark, cluster.storage.root, clock=clock).maintain_if_due() is None


def test_a_read_only_log_directory_fails_the_pass_with_kafka_storage_error_then_a_pass_completes(spark, maintained):
    from pathlib import Path

    from tests.fs_faults import read_only as _read_only
    cluster, clock, logs, _, _ = maintained
    cluster = Cluster.open(spark, cluster.storage.root, clock=clock)  # the one above was fenced by a reopen
    log_dir = Path(logs[1])
    _read_only(log_dir, True)
    try:
        with pytest.raises(ReplogError, match=r"KAFKA_STORAGE_ERROR.*the log of broker 1 at .*cannot be written"):
            cluster.maintain()
    finally:
        _read_only(log_dir, False)
    assert cluster.maintain().tables == 22
