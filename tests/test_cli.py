"""The `replog` console script, driven as a subprocess the way an operator types it."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_replicate_job import job_env

REPLOG = str(Path(sys.executable).parent / "replog")

pytestmark = pytest.mark.integration


def replog(*args, stdin=None, root=None, java_options=None):
    env = job_env()
    env.pop("REPLOG_ROOT", None)
    if root is not None:
        env["REPLOG_ROOT"] = root
    if java_options is not None:
        env["JAVA_TOOL_OPTIONS"] = java_options  # every JVM the command starts
    return subprocess.run([REPLOG, *args], input=stdin, capture_output=True, text=True, timeout=300, env=env)


def last_line(done):
    return done.stderr.strip().splitlines()[-1]


def test_the_console_script_from_create_to_consume(tmp_path):
    """What only a process of its own shows: quiet output (the JVM's, log4j's and Hadoop's lines
    hidden, --verbose shows them), the exit codes, stdin, $REPLOG_ROOT and the class-data-sharing
    archive. The commands' output line by line: tests/test_cli_sessions.py, in process."""
    root = str(tmp_path / "cluster")
    created = replog("cluster", "--create", "--brokers", "3", "--root", root)
    assert created.returncode == 0, created.stderr[-2000:]
    assert created.stdout == f"Created a cluster of 3 brokers at {root}.\n" and created.stderr == ""

    topic = replog("topics", "--create", "--topic", "orders", "--partitions", "2", "--replication-factor", "3",
                   "--config", "min.insync.replicas=2", root=root)  # --root from $REPLOG_ROOT
    assert topic.returncode == 0 and "Created topic orders." in topic.stdout

    sent = replog("produce", "--topic", "orders", "--acks", "all", "--key-separator", ":",
                  stdin="k1:first\nk2:second\nthird\n", root=root)
    assert sent.returncode == 0 and sent.stdout.startswith("Sent 3 records to orders (acks=all)")

    ran = replog("run", "--until-committed", root=root)
    assert ran.returncode == 0 and ran.stdout.startswith("Committed: nothing pending after ")
    assert ran.stderr.count("[####################] round ") == 1  # one progress line per round

    consumed = replog("consume", "--topic", "orders", "--from-beginning", "--print-key", root=root)
    assert sorted(consumed.stdout.splitlines()) == ["k1\tfirst", "k2\tsecond", "null\tthird"]
    assert consumed.stderr == ""

    # the driver JVM loads its classes from the class-data-sharing archive `make setup` wrote (the
    # archive on top of Java's own: "top"); each JVM the command starts logs to a file of its own
    listed = replog("topics", "--list", "--verbose", root=root,
                    java_options=f"-Xlog:class+load=info:file={tmp_path}/classes-%p.log")
    assert listed.returncode == 0 and listed.stdout == "orders\n", listed.stderr[-2000:]
    assert "log4j" in listed.stderr
    from_archive = [sum("source: shared objects file (top)" in line for line in log.open())
                    for log in tmp_path.glob("classes-*.log")]
    assert max(from_archive) > 5000, from_archive

    again = replog("topics", "--create", "--topic", "orders", "--partitions", "1", root=root)
    assert again.returncode == 1
    assert last_line(again) == "replog: TOPIC_ALREADY_EXISTS: topic 'orders' already exists"


def test_errors_are_one_line_and_exit_non_zero(tmp_path):
    missing = replog("topics", "--list", "--root", str(tmp_path / "nothing"))
    assert missing.returncode == 1
    assert last_line(missing).startswith("replog: CLUSTER_NOT_FOUND: ")

    bad_args = replog("run", "--root", str(tmp_path))  # neither --rounds nor --until-committed
    assert bad_args.returncode == 2

    no_root = replog("brokers", root=None)
    assert no_root.returncode == 2 and "--root is required" in no_root.stderr

    # a replication job holds the root (its lock, not a real job: refused before Spark starts)
    from pipeline.storage.job_lock import hold_job_lock
    (tmp_path / "cluster" / "cluster" / "_delta_log").mkdir(parents=True)  # looks like a cluster to the CLI
    held = hold_job_lock(str(tmp_path))
    try:
        second = replog("run", "--until-committed", "--root", str(tmp_path))
        maintain = replog("maintain", "--root", str(tmp_path))
    finally:
        held.close()
    assert second.returncode == 1
    assert last_line(second).startswith("replog: REPLICATION_JOB_RUNNING: a replication job already runs on ")
    assert maintain.returncode == 1 and last_line(maintain).startswith("replog: REPLICATION_JOB_RUNNING: ")
