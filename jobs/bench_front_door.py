"""The front door with a real Kafka client (issue 51): records/s through the server, and
produce-to-visible latency (jobs/benchmark.py --scenario front-door runs it).

A cluster of P partitions (3 brokers, RF 3) on the system clock, served on 127.0.0.1 with the door
running the rounds (`serve(run_rounds=True)`, a round every 500 ms when idle, the job's default
trigger, and at once for a produce request). Two phases, one client library (confluent-kafka,
librdkafka):
- throughput: an idempotent producer with acks=all sends N records of V-byte values (keys spread
  over the partitions) and flushes; records/s from the first send to the last acknowledgement;
- latency: K records one at a time: each is sent (acks=all) and a consumer assigned to its
  partition polls until it sees it; per record, the seconds from the send to the producer's
  acknowledgement, and to the consumer's receipt (produce-to-visible).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

__all__ = ["front_door_run", "front_door_table"]


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else float("nan")


def front_door_run(spark: Any, records: int, partitions: int, value_bytes: int, samples: int) -> dict:
    from confluent_kafka import Consumer, Producer, TopicPartition

    from pipeline.cluster import Cluster

    cluster = Cluster.create(spark, tempfile.mkdtemp(prefix="replog-bench-door-") + "/root", brokers=3)
    cluster.create_topic("bench", partitions=partitions, replication_factor=3)
    server = cluster.serve(port=0, run_rounds=True, round_interval_ms=500)
    address = f"127.0.0.1:{server.port}"
    try:
        producer = Producer({"bootstrap.servers": address, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 50, "message.timeout.ms": 600_000, "request.timeout.ms": 120_000})
        producer.produce("bench", value=b"warm-up", partition=0)  # (metadata, producer id, a first round)
        assert producer.flush(600) == 0
        value = b"x" * value_bytes
        failed: list[Any] = []
        start = time.monotonic()
        for n in range(records):
            while True:
                try:
                    producer.produce("bench", key=str(n).encode(), value=value,
                                     on_delivery=lambda err, _msg: err and failed.append(err))
                    break
                except BufferError:  # the client's queue is full: let it send
                    producer.poll(0.1)
            producer.poll(0)
        assert producer.flush(1200) == 0
        seconds = time.monotonic() - start
        acked, visible = [], []
        consumer = Consumer({"bootstrap.servers": address, "group.id": "bench", "enable.auto.commit": False,
                             "fetch.wait.max.ms": 100})
        ends = {r["partition"]: r["high_watermark"] for r in cluster.describe("bench").collect()}
        consumer.assign([TopicPartition("bench", p, ends[p]) for p in range(partitions)])
        for n in range(samples):
            tag = f"sample-{n}".encode()
            delivered: dict = {}
            sent = time.monotonic()
            producer.produce("bench", value=tag, partition=n % partitions,
                             on_delivery=lambda err, msg: delivered.update(at=time.monotonic(), err=err))
            producer.flush(600)
            while True:
                message = consumer.poll(30)
                if message is not None and message.error() is None and message.value() == tag:
                    visible.append(time.monotonic() - sent)
                    break
            acked.append(delivered["at"] - sent)
        consumer.close()
        return {"records": records, "partitions": partitions, "value_bytes": value_bytes, "seconds": round(seconds, 2),
                "records_per_s": round(records / seconds, 1), "failed": len(failed),
                "committed": cluster.read("bench").count(), "samples": samples,
                "ack_s_median": _median(acked), "ack_s_max": round(max(acked), 3),
                "visible_s_median": _median(visible), "visible_s_max": round(max(visible), 3)}
    finally:
        server.shutdown()


def front_door_table(data: dict) -> str:
    r = data["results"]
    return "\n".join([
        f"Front door, confluent-kafka (librdkafka) client, acks=all, idempotent; {data['machine']}",
        f"`{data['command']}`",
        "",
        "| records | partitions | value bytes | records/s | produce ack median (max) | produce-to-visible median (max) |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {r['records']:,} | {r['partitions']} | {r['value_bytes']} | {r['records_per_s']:,} | "
        f"{r['ack_s_median']} s ({r['ack_s_max']} s) | {r['visible_s_median']} s ({r['visible_s_max']} s) |",
    ])
