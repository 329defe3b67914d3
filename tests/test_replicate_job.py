"""jobs/replicate.py run the way users run it: spark-submit in its own process."""

import os
import re
import signal
import time
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import Cluster
from pipeline.config import CLUSTER_KEYS
from jobs.replicate import parse_interval_ms, read_properties

REPO = Path(__file__).resolve().parent.parent
SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")


def job_env():
    """This process's environment without the variables that tie pyspark to this test's own JVM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_GATEWAY", "SPARK_"))}
    return {**env, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}


def submit(*args, timeout=600):
    env = job_env()
    return subprocess.run([SPARK_SUBMIT, "--master", "local[2]", "--properties-file", "conf/spark-defaults.conf",
                           str(REPO / "jobs" / "replicate.py"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def test_shipped_properties_hold_every_key_with_kafkas_default():
    values = read_properties(str(REPO / "conf" / "replog.properties"))
    assert set(values) == set(CLUSTER_KEYS)
    for name, key in CLUSTER_KEYS.items():
        expected = str(key.default).lower() if key.kind is bool else str(key.default)
        assert values[name] == expected, name


def test_trigger_intervals():
    assert [parse_interval_ms(t) for t in ("500ms", "2s", "1min", "750")] == [500, 2000, 60000, 750]


@pytest.mark.integration
def test_available_now_commits_what_another_process_produced(spark, tmp_path):
    root = str(tmp_path / "cluster")
    cluster = Cluster.create(spark, root, brokers=3)
    cluster.create_topic("jobs", partitions=2, replication_factor=3, config={"min.insync.replicas": "2"})
    request = cluster.produce("jobs", [{"key": f"k{i}", "value": f"v{i}"} for i in range(20)], acks="all")

    done = submit("--root", root, "--conf-file", str(REPO / "conf" / "replog.properties"), "--available-now")

    assert done.returncode == 0, done.stderr[-3000:]
    # spark-submit passes the Python process's stderr on through its own stdout
    assert "available-now: 2 rounds" in done.stdout + done.stderr
    assert cluster.read("jobs").count() == 20
    status = {r["status"] for r in cluster.produce_results().filter(f"request_id = '{request}'").collect()}
    assert status == {"acked"}


@pytest.mark.integration
def test_without_the_delta_jars_spark_submit_says_what_to_pass(tmp_path):
    env = job_env()
    done = subprocess.run([SPARK_SUBMIT, "--master", "local[1]", str(REPO / "jobs" / "replicate.py"),
                           "--root", str(tmp_path), "--available-now"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode == 1
    lines = (done.stdout + done.stderr).splitlines()
    assert any(line.startswith("replicate: The Delta Lake classes are not on Spark's classpath") for line in lines)


@pytest.mark.integration
def test_bad_configuration_names_the_key_and_writes_nothing(spark, tmp_path):
    root = str(tmp_path / "cluster")
    Cluster.create(spark, root, brokers=1)
    rounds_log = Path(root) / "cluster" / "rounds" / "_delta_log"
    before = sorted(os.listdir(rounds_log))
    conf = tmp_path / "bad.properties"
    conf.write_text("# fetchers must be positive (KAFKA-19645)\nnum.replica.fetchers=0\n")

    done = submit("--root", root, "--conf-file", str(conf), "--available-now", timeout=120)

    assert done.returncode == 2
    out = done.stdout + done.stderr
    assert "INVALID_CONFIG" in out and "num.replica.fetchers" in out
    assert sorted(os.listdir(rounds_log)) == before


@pytest.mark.integration
def test_streaming_job_replicates_until_sigterm_then_resumes_from_its_checkpoint(spark, tmp_path):
    root = str(tmp_path / "cluster")
    cluster = Cluster.create(spark, root, brokers=3)
    cluster.create_topic("live", partitions=2, replication_factor=3)
    checkpoint = tmp_path / "checkpoint"
    job_log = tmp_path / "job.log"

    def run_until_committed(expected):
        job_log.write_text("")
        job = subprocess.Popen([SPARK_SUBMIT, "--master", "local[2]", "--properties-file", "conf/spark-defaults.conf",
                                str(REPO / "jobs" / "replicate.py"), "--root", root, "--trigger-interval", "1s",
                                "--checkpoint", str(checkpoint)],
                               stdout=job_log.open("w"), stderr=subprocess.STDOUT, env=job_env(), cwd=REPO)
        try:
            deadline = time.monotonic() + 300
            while cluster.read("live").count() < expected:
                assert job.poll() is None, job_log.read_text()[-3000:]
                assert time.monotonic() < deadline, "not committed within 300 s"
                time.sleep(2)
            # the job's Python process (spark-submit's JVM runs it as a child) is the one that stops
            # gracefully; its pid is in the log
            driver = int(re.search(r"SIGTERM to pid (\d+)", job_log.read_text()).group(1))
            os.kill(driver, signal.SIGTERM)
            job.wait(timeout=120)
            out = job_log.read_text()
        finally:
            if job.poll() is None:
                job.kill()
        assert job.returncode == 0, out[-3000:]
        assert "stopping after the current round" in out
        return out

    cluster.produce("live", [{"value": f"a{i}"} for i in range(10)], acks="all")
    first = [int(b) for b in re.findall(r"batch (\d+): round", run_until_committed(10))]
    cluster.produce("live", [{"value": f"b{i}"} for i in range(10)], acks="all")
    second = [int(b) for b in re.findall(r"batch (\d+): round", run_until_committed(20))]

    assert first and second and min(second) > max(first)  # resumed from the checkpoint
    rounds = [r["round_id"] for r in cluster.rounds().orderBy("round_id").collect()]
    assert rounds == list(range(1, len(rounds) + 1))  # every round once, none repeated
    assert sorted(bytes(r["value"]).decode() for r in cluster.read("live").collect()) == sorted(
        [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)])
