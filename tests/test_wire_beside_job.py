"""The front door beside the replication job (issue 51): the job runs the rounds in its own
spark-submit process on the root, the door in this one answers a stock producer's acks=all requests
from those rounds' results and a stock consumer's incremental fetches from the committed view."""

import os
import re
import signal
import subprocess

import pytest

from pipeline import Cluster
from pipeline.wire.front_door import serve
from tests.test_replicate_job import REPO, SPARK_SUBMIT, job_env
from tests.test_wire_produce_fetch import consumed

pytestmark = pytest.mark.integration


def test_a_stock_client_produces_and_consumes_through_the_door_while_the_job_runs_the_rounds(spark, tmp_path):
    from kafka import KafkaConsumer, KafkaProducer

    root = str(tmp_path / "cluster")
    cluster = Cluster.create(spark, root, brokers=3)
    cluster.create_topic("orders", partitions=2, replication_factor=3, config={"min.insync.replicas": "2"})
    job_log = tmp_path / "job.log"
    job = subprocess.Popen([SPARK_SUBMIT, "--master", "local[2]", "--properties-file", "conf/spark-defaults.conf",
                            str(REPO / "jobs" / "replicate.py"), "--root", root, "--trigger-interval", "500ms",
                            "--checkpoint", str(tmp_path / "checkpoint")],
                           stdout=job_log.open("w"), stderr=subprocess.STDOUT, env=job_env(), cwd=REPO)
    server = serve(cluster, port=0)  # (no rounds of its own: the job's wake the waiting requests)
    address = f"127.0.0.1:{server.port}"
    try:
        producer = KafkaProducer(bootstrap_servers=address, acks="all", enable_idempotence=True, linger_ms=5,
                                 request_timeout_ms=120_000, delivery_timeout_ms=400_000, max_block_ms=120_000)
        try:
            futures = [producer.send("orders", key=f"k{n % 4}".encode(), value=f"v{n}".encode()) for n in range(10)]
            sent = sorted((m.partition, m.offset) for m in (f.get(timeout=400) for f in futures))
        finally:
            producer.close()
        assert job.poll() is None, job_log.read_text()[-3000:]
        committed = [(r["partition"], r["offset"], r["value"])
                     for r in cluster.read("orders").orderBy("partition", "offset").collect()]
        assert sent == [(p, o) for p, o, _ in committed]
        assert sorted(v for _, _, v in committed) == sorted(f"v{n}".encode() for n in range(10))

        consumer = KafkaConsumer(bootstrap_servers=address, request_timeout_ms=120_000, fetch_max_wait_ms=200,
                                 enable_auto_commit=False, consumer_timeout_ms=120_000)
        try:
            got = [(m.partition, m.offset, m.value) for m in consumed(consumer, "orders", [0, 1], len(committed))]
        finally:
            consumer.close()
        assert sorted(got) == committed
        assert server.handler.fetch_kinds["full"] >= 1
    finally:
        server.shutdown()
        try:
            driver = re.search(r"SIGTERM to pid (\d+)", job_log.read_text())
            os.kill(int(driver.group(1)) if driver else job.pid, signal.SIGTERM)
            job.wait(timeout=120)
        finally:
            if job.poll() is None:
                job.kill()
    assert job.returncode == 0, job_log.read_text()[-3000:]
