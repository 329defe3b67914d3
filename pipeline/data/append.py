"""A round's records, numbered once and written once per broker (DESIGN.md, "Round v2", 4).

As in Kafka's record batches (a base offset per batch, an offset delta per record), the control
job gives each accepted (request, partition) its base offset; a record's offset is that base plus
its place among the request's records of that partition. A follower whose fetch took this round's
batch gets its slice of the same rows (`fetches` with `from_batch`), never reading its leader's log
back. The control job's output is pinned (an RDD scan Spark does not broadcast by itself): the
joins to it are shuffles inside the numbering's one job, not broadcasts of their own."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipeline.schemas import LOG_SCHEMA, PARTITION_KEY

__all__ = ["number_records", "batch_copies", "log_rows"]

_PART = ["request_id", *PARTITION_KEY]


def number_records(inbox_df: DataFrame, control_df: DataFrame) -> DataFrame:
    """The accepted records of the round's inbox rows as log rows of their leader (`broker`): each
    request's base offset and the leader's epoch from the control job's output, plus the record's
    place among its request's records of that partition (by record_index)."""
    # (an appended request has its offsets whatever its status: one answered with
    # NOT_ENOUGH_REPLICAS_AFTER_APPEND was appended; a refused one has none)
    bases = (control_df.filter(F.col("is_known"))
             .select(*PARTITION_KEY, "leader", "leader_epoch", F.explode("results").alias("r"))
             .filter(F.col("r.base_offset").isNotNull())
             .select(F.col("r.request_id").alias("request_id"), *PARTITION_KEY, F.col("r.base_offset").alias("_base"),
                     F.col("leader").alias("broker"), "leader_epoch"))
    delta = F.row_number().over(Window.partitionBy(*_PART).orderBy("record_index")) - 1
    return (inbox_df.join(bases, on=_PART, how="inner")
            .withColumn("offset", F.col("_base") + delta)
            .select(*PARTITION_KEY, "offset", "leader_epoch", "timestamp", "key", "value", "producer_id",
                    "producer_epoch", "sequence", "broker"))


def batch_copies(numbered_df: DataFrame, control_df: DataFrame) -> DataFrame:
    """The followers' slices of the round's batch: for each fetch that took from it, the numbered
    rows of its partition in [from_offset, to_offset), with `broker` the follower."""
    ranges = (control_df.select(*PARTITION_KEY, F.explode("fetches").alias("f"))
              .filter(F.col("f.from_batch"))
              .select(*PARTITION_KEY, F.col("f.broker").alias("_follower"), F.col("f.from_offset").alias("_from"),
                      F.col("f.to_offset").alias("_to")))
    return (numbered_df.join(ranges, on=PARTITION_KEY, how="inner")
            .filter((F.col("offset") >= F.col("_from")) & (F.col("offset") < F.col("_to")))
            .withColumn("broker", F.col("_follower"))
            .drop("_follower", "_from", "_to"))


def log_rows(inbox_df: DataFrame, control_df: DataFrame) -> DataFrame:
    """Every log row the round writes, leaders' and followers', with the `broker` whose log takes it."""
    numbered = number_records(inbox_df, control_df)
    return numbered.unionByName(batch_copies(numbered, control_df)).select(*LOG_SCHEMA.fieldNames(), "broker")
