"""Consuming a topic with Spark Structured Streaming, as a Spark job consumes Kafka.

    def write(records, batch_id):
        (records.write.format("delta").mode("append")
         .option("txnAppId", "orders-etl").option("txnVersion", batch_id).save("/data/orders"))

    query = committed_stream(cluster, "orders", "orders-etl", write, checkpoint="/chk/orders-etl")

Structured Streaming drives it. The stream's source is the cluster's replica_state table: the
committed records only change when a round appends the replicas' rows that move a high watermark
or a log start offset, so a micro-batch runs after such rounds (once their rows landed) and none
runs while the cluster is quiet (its compactions are change commits, which the source skips). Each micro-batch reads the topic's
committed records that this consumer has not read, through its unprivileged KIP-227 fetch session
with each leader (Cluster.fetch_incremental): an incremental response carries only the partitions
that changed, so a batch costs what changed, not how many partitions there are.

Exactly once: before `process` runs, the batch's ranges (per partition: the offsets from and to)
are committed to the `stream_batches` table under (consumer, topic, batch id), then the consumer's
positions move. A batch that Spark runs again after a failure (same batch id, from its checkpoint)
re-reads exactly those ranges. So `process` sees the same records every time it runs a batch, and
with an idempotent sink (a Delta write with txnAppId = the consumer and txnVersion = the batch id,
as above) each record lands once. Ranges below the high watermark do not change, except that log
compaction may remove records from them meanwhile (a compacted topic's consumer sees at least the
last value of every key).
"""

from __future__ import annotations

from typing import Any, Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from pipeline.consume import sessions as consumer
from pipeline.errors import ErrorCode, ReplogError
from pipeline.schemas import PARTITION_KEY

__all__ = ["committed_stream", "batch_records"]

_TRIGGERS = ("processingTime", "availableNow", "once")


def batch_records(cluster: Any, consumer_id: str, topic: str, batch_id: int) -> DataFrame:
    """The records of micro-batch `batch_id` of `consumer_id`'s stream of `topic`: read (and
    recorded) now, or read again from the ranges recorded when it first ran. Pinned."""
    storage = cluster.storage
    storage.ensure("stream_batches")
    recorded = (storage.read("stream_batches")
                .filter((F.col("consumer_id") == consumer_id) & (F.col("topic") == topic)
                        & (F.col("batch_id") == batch_id))
                .select(*PARTITION_KEY, "start_offset", "end_offset").localCheckpoint())
    if recorded.limit(1).count():
        # the batch ran before and failed after its ranges were committed: the same records again,
        # and the positions past them (a crash may have come before they moved)
        consumer.advance_positions(storage, consumer_id, recorded, cluster.clock.now_ms())
        return (cluster.read(topic).join(F.broadcast(recorded), on=PARTITION_KEY)
                .filter((F.col("offset") >= F.col("start_offset")) & (F.col("offset") < F.col("end_offset")))
                .drop("start_offset", "end_offset").localCheckpoint())
    fetched = cluster.fetch_incremental(consumer_id, topic)
    ranges = fetched.ranges.filter(F.col("end_offset") > F.col("start_offset"))
    storage.append_table(ranges.select(F.lit(consumer_id).alias("consumer_id"), "topic",
                                       F.lit(batch_id).cast("long").alias("batch_id"), "partition",
                                       "start_offset", "end_offset"), "stream_batches")
    fetched.commit()
    return fetched.records


def committed_stream(cluster: Any, topic: str, consumer_id: str, process: Callable[[DataFrame, int], Any],
                     checkpoint: str, trigger: dict[str, Any] | None = None,
                     query_name: str | None = None) -> StreamingQuery:
    """Starts a streaming query that calls `process(records, batch_id)` with the committed
    records of `topic` that consumer `consumer_id` has not processed (topic, partition, offset,
    leader_epoch, timestamp, key, value), once per micro-batch (see the module's text).
    `checkpoint`: the query's checkpoint location (one per consumer). `trigger`: as
    DataStreamWriter.trigger takes it (default processingTime 1 second; {"availableNow": True}
    processes what is committed and stops, for a scheduled job)."""
    if not isinstance(consumer_id, str) or not consumer_id.strip():
        raise ReplogError(ErrorCode.INVALID_GROUP_ID, f"consumer_id must be a non-empty string, got {consumer_id!r}")
    cluster.describe(topic)  # UNKNOWN_TOPIC_OR_PARTITION for an unknown topic
    if not callable(process):
        raise ValueError(f"process must be callable as process(records, batch_id), got {process!r}")
    trigger = trigger or {"processingTime": "1 second"}
    if not isinstance(trigger, dict) or len(trigger) != 1 or next(iter(trigger)) not in _TRIGGERS:
        raise ValueError(f"trigger must be one of {{'processingTime': '1 second'}}, {{'availableNow': True}}, "
                         f"{{'once': True}}, got {trigger!r}")

    def one_batch(_rows: DataFrame, batch_id: int) -> None:
        process(batch_records(cluster, consumer_id, topic, batch_id), batch_id)

    return (cluster.spark.readStream.format("delta").option("skipChangeCommits", "true")
            .load(cluster.storage.path("replica_state"))
            .writeStream.queryName(query_name or f"replog-{topic}-{consumer_id}")
            .foreachBatch(one_batch).option("checkpointLocation", checkpoint)
            .trigger(**trigger).start())
