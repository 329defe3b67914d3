"""A stock idempotent producer (kafka-python, acks=all) that keeps sending through the front door
while the partition's leader broker is stopped, fenced and started again (issue 51): every record
is committed exactly once, in the order sent, and a consumer reads them all back with the offsets
cluster.read shows. Integration: about a minute of rounds."""

import threading
import time

import pytest

from pipeline.wire.front_door import serve

pytestmark = pytest.mark.integration


def _wait(condition, what, seconds=300):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_producer_across_a_leader_stop_and_start_loses_and_duplicates_nothing(new_cluster, clock):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    cluster = new_cluster(brokers=3)
    cluster.create_topic("orders", partitions=1, replication_factor=3, config={"min.insync.replicas": 2})
    leader = cluster.describe("orders").first()["leader"]
    server = serve(cluster, port=0, run_rounds=True, round_interval_ms=200)
    address = f"127.0.0.1:{server.port}"
    done = threading.Event()
    futures, outcomes = [], []

    def produce():  # one record every 0.2 s until told to stop, then waits for every answer
        producer = KafkaProducer(bootstrap_servers=address, acks="all", enable_idempotence=True, linger_ms=0,
                                 retry_backoff_ms=200, request_timeout_ms=60_000, delivery_timeout_ms=600_000,
                                 max_block_ms=120_000)
        try:
            while not done.is_set():
                futures.append(producer.send("orders", value=f"r{len(futures)}".encode()))
                time.sleep(0.2)
            for future in futures:
                try:
                    outcomes.append(future.get(timeout=620).offset)
                except Exception as err:  # noqa: BLE001 - the assertion below names it
                    outcomes.append(repr(err))
        finally:
            producer.close()

    def committed():
        return [(r["offset"], r["value"]) for r in cluster.read("orders").orderBy("offset").collect()]

    thread = threading.Thread(target=produce)
    try:
        thread.start()
        _wait(lambda: len(committed()) >= 3, "the first records")
        cluster.stop_broker(leader)
        clock.advance(10_000)  # past broker.session.timeout.ms (9000): fenced, a new leader from the ISR
        _wait(lambda: cluster.describe("orders").first()["leader"] not in (leader, -1), "a new leader")
        moved = len(committed())
        _wait(lambda: len(committed()) > moved, "records through the new leader")
        cluster.start_broker(leader)
        clock.advance(1_000)
        _wait(lambda: leader in cluster.describe("orders").first()["isr"], "the restarted broker in the ISR")
        done.set()
        thread.join(timeout=900)
        assert not thread.is_alive()
        log = committed()
        assert len(futures) > moved and [o for o in outcomes if not isinstance(o, int)] == []
        assert [v for _, v in log] == [f"r{n}".encode() for n in range(len(futures))]  # once each, in order
        assert outcomes == [o for o, _ in log]

        consumer = KafkaConsumer(bootstrap_servers=address, request_timeout_ms=120_000, fetch_max_wait_ms=100,
                                 enable_auto_commit=False, consumer_timeout_ms=60_000)
        try:
            consumer.assign([TopicPartition("orders", 0)])
            consumer.seek_to_beginning()
            got = []
            for message in consumer:
                got.append((message.offset, message.value))
                if len(got) == len(log):
                    break
        finally:
            consumer.close()
        assert got == log
    finally:
        done.set()
        thread.join(timeout=900)
        server.shutdown()
