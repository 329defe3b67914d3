"""The replication job on a real Spark standalone cluster: a master and two workers, each its own JVM
process started with `spark-class` from the pyspark package, the job submitted with spark-submit."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from jobs.replicate import run_available_now
from pipeline import Cluster
from tests.test_replicate_job import REPO, SPARK_SUBMIT, job_env

pytestmark = pytest.mark.integration

SPARK_CLASS = str(Path(sys.executable).parent / "spark-class")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def master_state(ui_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as response:
        return json.load(response)


@pytest.fixture
def standalone(tmp_path):
    """spark://127.0.0.1:PORT with two one-core workers; every process is stopped afterwards."""
    env = {**job_env(), "SPARK_LOCAL_IP": "127.0.0.1"}
    port, ui = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    processes = []

    def start(name, *args):
        log = open(tmp_path / f"{name}.log", "w")
        processes.append((subprocess.Popen([SPARK_CLASS, *args], stdout=log, stderr=subprocess.STDOUT, env=env),
                          log))

    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui))
        for n in (1, 2):
            start(f"worker{n}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                  "--memory", "1g", "--work-dir", str(tmp_path / f"worker{n}"), "--webui-port", str(free_port()), url)
        deadline = time.monotonic() + 120
        while True:
            try:
                alive = [w for w in master_state(ui)["workers"] if w["state"] == "ALIVE"]
            except (OSError, ValueError):  # not up yet; or its web server up before the JSON page (an HTML answer)
                alive = []
            if len(alive) == 2:
                break
            if time.monotonic() > deadline:
                logs = "\n".join((tmp_path / f).read_text()[-2000:] for f in ("master.log", "worker1.log"))
                pytest.fail(f"the standalone cluster did not come up with two workers:\n{logs}")
            time.sleep(1)
        yield url, ui
    finally:
        for process, log in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()


def make_cluster(spark, root):
    # both clusters run by the wall clock: a first round that comes more than replica.lag.time.max.ms
    # after the produce (it did on a loaded machine) takes the followers out of the ISR, by Kafka's
    # rule, and the acks=all requests fail; this test is about where the job runs, not about lag
    cluster = Cluster.create(spark, root, brokers=3, config={"replica.lag.time.max.ms": 600_000})
    cluster.create_topic("orders", partitions=4, replication_factor=3, config={"min.insync.replicas": "2"})
    # keyed records: the partitioner puts them in the same partitions in both clusters
    cluster.produce("orders", [{"key": f"k{i}", "value": f"v{i}"} for i in range(40)], acks="all")
    return cluster


def outcome(cluster):
    records = sorted((r["partition"], r["offset"], bytes(r["key"]), bytes(r["value"]), r["leader_epoch"])
                     for r in cluster.read("orders").collect())
    replicas = sorted(tuple(r) for r in cluster.replicas("orders").select(
        "partition", "broker", "is_leader", "in_isr", "log_end_offset", "high_watermark").collect())
    results = sorted((r["partition"], r["base_offset"], r["last_offset"], r["status"])
                     for r in cluster.produce_results().collect())
    return records, replicas, results


def test_the_job_on_a_standalone_cluster_matches_a_local_run(spark, tmp_path, standalone):
    url, ui = standalone
    local = make_cluster(spark, str(tmp_path / "local"))
    # the cluster's root as a URI, as on object storage: every path goes through Hadoop's FileSystem
    remote_root = f"file://{tmp_path}/remote"
    make_cluster(spark, remote_root)

    run_available_now(local, max_stalled=3)  # this test's own local Spark
    done = subprocess.run(
        [SPARK_SUBMIT, "--master", url, "--properties-file", "conf/spark-defaults.conf",
         "--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2",
         "--conf", f"spark.executorEnv.PYTHONPATH={REPO}", "--conf", f"spark.executorEnv.PYSPARK_PYTHON={sys.executable}",
         str(REPO / "jobs" / "replicate.py"), "--root", remote_root, "--available-now"],
        capture_output=True, text=True, timeout=900, env=job_env(), cwd=REPO)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]

    # the job ran on the cluster: the master lists it as a finished application
    apps = master_state(ui)["completedapps"]
    assert [a["name"] for a in apps] == ["replog-replicate"]
    for n in (1, 2):  # each worker ran an executor of it (the worker's work dir holds the app's)
        assert os.listdir(tmp_path / f"worker{n}") == [apps[0]["id"]]

    records, replicas, results = outcome(Cluster.open(spark, remote_root))
    assert (records, replicas, results) == outcome(local)
    assert len(records) == 40 and {r[3] for r in results} == {"acked"}
    assert all(r[3] and r[4] == r[5] for r in replicas)  # every replica in sync and caught up
