"""Exactly-once output, the pattern of Kafka's design (section 4.6): a consumer stores its position
in the same place as its output, so both are written together or not at all.

Here the place is a Delta table. Each batch's output rows and the positions they were computed up to
go into one Delta commit: the rows as data, the positions in the commit's `userMetadata`, and the
commit is keyed by Delta's idempotent-write pair (`txnAppId` = the consumer, `txnVersion` = the
batch number), so a batch written twice is written once. After a crash the consumer reads its
positions back from the newest such commit: a batch whose commit landed is never read again, one
whose commit did not land is read again whole.

    sink = ExactlyOnceOutput(cluster, "orders-to-parquet", "orders", "/data/out/orders")
    while sink.run_batch(lambda records: records.select("partition", "offset", "value")):
        pass

The positions are one number per partition of the topic in every commit's metadata: O(partitions)
bytes per commit, fine for thousands of partitions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline.errors import ErrorCode, ReplogError

__all__ = ["ExactlyOnceOutput", "Batch", "METADATA_PREFIX"]

METADATA_PREFIX = "replog-exactly-once="


@dataclass(frozen=True)
class Batch:
    """One written batch: its number, the records it consumed, the positions after it."""

    number: int
    records: int
    positions: dict[int, int]


class ExactlyOnceOutput:
    """A consumer (`consumer_id`) of `topic` whose output table at `output_path` holds its positions."""

    def __init__(self, cluster: Any, consumer_id: str, topic: str, output_path: str):
        if not isinstance(consumer_id, str) or not consumer_id.strip():
            raise ReplogError(ErrorCode.INVALID_GROUP_ID, f"consumer_id must be a non-empty string, got {consumer_id!r}")
        cluster.describe(topic)  # UNKNOWN_TOPIC_OR_PARTITION for an unknown topic
        self.cluster, self.consumer_id, self.topic, self.output_path = cluster, consumer_id, topic, output_path
        self.app_id = f"replog-exactly-once:{consumer_id}:{topic}"

    def last_batch(self) -> Batch | None:
        """The newest batch committed to the output table (None before the first)."""
        spark = self.cluster.spark
        if not DeltaTable.isDeltaTable(spark, self.output_path):
            return None
        history = (DeltaTable.forPath(spark, self.output_path).history()
                   .filter(F.col("userMetadata").startswith(METADATA_PREFIX))
                   .select("userMetadata").collect())  # O(commits kept in the Delta log)
        mine = [json.loads(r["userMetadata"][len(METADATA_PREFIX):]) for r in history]
        mine = [m for m in mine if m["app"] == self.app_id]
        if not mine:
            return None
        last = max(mine, key=lambda m: m["batch"])
        return Batch(last["batch"], last["records"], {int(p): o for p, o in last["positions"].items()})

    def positions(self) -> dict[int, int]:
        """The next offset to consume per partition; partitions not in it start at the log start."""
        last = self.last_batch()
        return dict(last.positions) if last else {}

    def run_batch(self, transform: Callable[[DataFrame], DataFrame] = lambda records: records) -> Batch | None:
        """Reads the committed records past the positions, writes transform(records) and the new
        positions in one commit. None when nothing new was committed (nothing is written)."""
        last = self.last_batch()
        starts = dict(last.positions) if last else {}
        # the end of this batch: each partition's HW now (the read below stops there even if the
        # HW moves on meanwhile, so the positions written match the rows written)
        ends = {r["partition"]: r["high_watermark"] for r in
                self.cluster.describe(self.topic).select("partition", "high_watermark").collect()}
        if all(ends[p] <= starts.get(p, 0) for p in ends):
            return None
        spark = self.cluster.spark
        ranges = spark.createDataFrame([(p, starts.get(p, 0), end) for p, end in ends.items()],
                                       "partition int, _start long, _end long")
        records = (self.cluster.read(self.topic).join(F.broadcast(ranges), on="partition")
                   .filter((F.col("offset") >= F.col("_start")) & (F.col("offset") < F.col("_end")))
                   .drop("_start", "_end")).localCheckpoint()
        count = records.count()
        number = (last.number if last else 0) + 1
        positions = {p: max(end, starts.get(p, 0)) for p, end in ends.items()}
        metadata = METADATA_PREFIX + json.dumps({"app": self.app_id, "batch": number, "records": count,
                                                 "positions": {str(p): o for p, o in positions.items()}})
        (transform(records).write.format("delta").mode("append")
         .option("txnAppId", self.app_id).option("txnVersion", number).option("userMetadata", metadata)
         .save(self.output_path))
        return Batch(number, count, positions)
