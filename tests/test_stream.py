"""A topic consumed by a Structured Streaming query (pipeline/consume/stream.py): each micro-batch gets the
committed records its consumer has not processed, and a batch that fails, before or after its sink
wrote, is run again by Spark with the same records, so an idempotent Delta sink holds every record
once."""

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from pipeline import ManualClock
from pipeline import Cluster
from pipeline.errors import ReplogError

EPOCH_MS = 1_700_000_000_000


def _produce_and_commit(cluster, clock, values):
    request = cluster.produce("orders", [{"key": v, "value": v} for v in values], acks="all")
    for _ in range(2):
        clock.advance(500)
        cluster.run_round()
    assert cluster.produce_results().filter(F.col("request_id") == request).first()["status"] == "acked"


def test_a_stream_of_committed_records_exactly_once_through_failed_batches(spark, tmp_path):
    clock = ManualClock(start_ms=EPOCH_MS)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=2, clock=clock)
    cluster.create_topic("orders", partitions=3, replication_factor=2)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "chk")
    calls = []

    def sink(fail=None):
        def process(records, batch_id):
            calls.append((batch_id, sorted(r["value"].decode() for r in records.collect())))
            if fail == "before":
                raise RuntimeError("the sink failed before writing")
            (records.select("partition", "offset", F.col("value").cast("string").alias("value"))
             .write.format("delta").mode("append").option("txnAppId", "etl").option("txnVersion", batch_id)
             .save(out))
            if fail == "after":
                raise RuntimeError("the job died after the sink wrote")
        return process

    def run(process):
        query = cluster.stream("orders", "etl", process, checkpoint, trigger={"availableNow": True})
        query.awaitTermination()

    def written():
        return sorted((r["partition"], r["offset"], r["value"]) for r in spark.read.format("delta").load(out).collect())

    _produce_and_commit(cluster, clock, [f"a{i}" for i in range(5)])
    run(sink())
    assert [values for _, values in calls] == [[f"a{i}" for i in range(5)]]
    assert len(written()) == 5

    # the sink fails before writing: the query stops; its restart runs the batch again, same records
    _produce_and_commit(cluster, clock, ["b0", "b1"])
    with pytest.raises(StreamingQueryException):
        run(sink(fail="before"))
    run(sink())
    assert calls[1] == calls[2] and calls[1][1] == ["b0", "b1"]

    # the job dies after the sink wrote: the batch runs again with the same records, and the sink's
    # idempotent commit (txnAppId, txnVersion = batch id) skips them
    _produce_and_commit(cluster, clock, ["c0", "c1", "c2"])
    with pytest.raises(StreamingQueryException):
        run(sink(fail="after"))
    run(sink())
    assert calls[3] == calls[4] and calls[3][1] == ["c0", "c1", "c2"]
    rows = written()
    assert sorted(v for _, _, v in rows) == sorted([f"a{i}" for i in range(5)] + ["b0", "b1", "c0", "c1", "c2"])
    assert len({(p, o) for p, o, _ in rows}) == len(rows) == 10
    # the rows are the partitions' committed records, at their offsets
    committed = sorted((r["partition"], r["offset"], r["value"].decode()) for r in cluster.read("orders").collect())
    assert rows == committed

    # nothing new: no batch runs, nothing is written
    before = len(calls)
    run(sink())
    assert len(calls) == before


def test_a_stream_refuses_what_it_cannot_consume(spark, tmp_path):
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=1, clock=ManualClock(start_ms=EPOCH_MS))
    with pytest.raises(ReplogError) as err:
        cluster.stream("nope", "etl", lambda df, b: None, str(tmp_path / "chk"))
    assert err.value.code == "UNKNOWN_TOPIC_OR_PARTITION"
    cluster.create_topic("orders")
    with pytest.raises(ReplogError) as err:
        cluster.stream("orders", " ", lambda df, b: None, str(tmp_path / "chk"))
    assert err.value.code == "INVALID_GROUP_ID"
    with pytest.raises(ValueError, match="trigger"):
        cluster.stream("orders", "etl", lambda df, b: None, str(tmp_path / "chk"), trigger={"continuous": "1s"})
    assert not (tmp_path / "chk").exists()
