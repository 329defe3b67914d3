"""A round's records, numbered once and written once per broker (DESIGN.md, "Round v2", 4).

As in Kafka's record batches (a base offset per batch, an offset delta per record), the control
job gives each accepted (request, partition) its base offset; a record's offset is that base plus
its place among the request's records of that partition. A follower whose fetch took this round's
batch gets its slice of the same rows (`fetches` with `from_batch`), never reading its leader's log
back. The control job's output is pinned (an RDD scan Spark does not broadcast by itself): the
join to it is a shuffle inside the numbering's one job, not a broadcast of its own."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipeline.schemas import LOG_SCHEMA, PARTITION_KEY

__all__ = ["log_rows"]

_PART = ["request_id", *PARTITION_KEY]


def log_rows(inbox_df: DataFrame, control_df: DataFrame) -> DataFrame:
    """Every log row the round writes, leaders' and followers', with the `broker` whose log takes
    it: the accepted records of the round's inbox rows, each numbered from its request's base
    offset in the control job's output (plus its place among its request's records of that
    partition, by record_index) with the leader's epoch, once for the leader and once for each
    follower whose fetch took it from the batch (`fetches` with `from_batch`, offsets in
    [from_offset, to_offset)). One join and one window over the records."""
    # (an appended request has its offsets whatever its status: one answered with
    # NOT_ENOUGH_REPLICAS_AFTER_APPEND was appended; a refused one has none)
    bases = (control_df.filter(F.col("is_known"))
             .select(*PARTITION_KEY, "leader", "leader_epoch",
                     F.filter("fetches", lambda f: f["from_batch"]).alias("_fetches"),
                     F.explode("results").alias("r"))
             .filter(F.col("r.base_offset").isNotNull())
             .select(F.col("r.request_id").alias("request_id"), *PARTITION_KEY, F.col("r.base_offset").alias("_base"),
                     "leader", "leader_epoch", "_fetches"))
    delta = F.row_number().over(Window.partitionBy(*_PART).orderBy("record_index")) - 1
    offset = F.col("offset")
    takers = F.concat(F.array(F.col("leader")), F.transform(
        F.filter("_fetches", lambda f: (offset >= f["from_offset"]) & (offset < f["to_offset"])),
        lambda f: f["broker"]))
    return (inbox_df.join(bases, on=_PART, how="inner")
            .withColumn("offset", F.col("_base") + delta)
            .select(*[c for c in LOG_SCHEMA.fieldNames() if c != "offset"], "offset", F.explode(takers).alias("broker"))
            .select(*LOG_SCHEMA.fieldNames(), "broker"))
