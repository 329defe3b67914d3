"""Idempotent producers (KIP-98), per partition: a batch is appended once. The leader keeps the
last batches of each producer (Kafka keeps 5); a retried batch is a duplicate answered with its
original offsets, a batch that does not continue the sequence is OUT_OF_ORDER_SEQUENCE_NUMBER, and a
batch from an older producer epoch is INVALID_PRODUCER_EPOCH."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipeline.errors import ErrorCode
from pipeline.schemas import PARTITION_KEY

__all__ = ["BATCHES_TO_RETAIN", "producer_batches", "check_producer_sequences", "retained_batches",
           "batches_in_leader_log"]

BATCHES_TO_RETAIN = 5
BATCH_KEY = ["request_id", "topic", "partition"]
PRODUCER_KEY = ["topic", "partition", "producer_id"]


def producer_batches(rows_df: DataFrame) -> DataFrame:
    """One row per (request, partition) of an idempotent producer: producer_id, producer_epoch,
    base_sequence, last_sequence, record_count, _commit_version. A batch whose sequences are not
    contiguous, or mixes producers, is OUT_OF_ORDER_SEQUENCE_NUMBER."""
    return (
        rows_df.filter(F.col("producer_id").isNotNull())
        .withColumn("producer_epoch", F.coalesce(F.col("producer_epoch"), F.lit(0)))
        .groupBy(*BATCH_KEY, "_commit_version").agg(
            F.min("producer_id").alias("producer_id"), F.countDistinct("producer_id", "producer_epoch").alias("_ids"),
            F.min("producer_epoch").alias("producer_epoch"), F.min("sequence").alias("base_sequence"),
            F.max("sequence").alias("last_sequence"), F.count(F.lit(1)).alias("record_count"),
            F.count("sequence").alias("_with_sequence"))
        .withColumn("is_malformed", (F.col("_ids") != 1) | (F.col("_with_sequence") != F.col("record_count"))
                    | (F.col("last_sequence") - F.col("base_sequence") + 1 != F.col("record_count")))
        .drop("_ids", "_with_sequence")
    )


def batches_in_leader_log(state_df: DataFrame, leaders_df: DataFrame, logs_df: DataFrame) -> DataFrame:
    """The stored batches the partition's leader still holds. Kafka's leader builds its producer
    state from its own log (ProducerStateManager.truncateAndReload), so a batch counts while its last
    offset is below the leader's LEO and the leader's record there is the batch's last record (same
    producer id, epoch and sequence), or no record (the cleaner removed it: Kafka's keeps a
    producer's last batch). A batch another leader appended above this leader's LEO, or at offsets
    where this leader's log holds other records, is gone: a retry of it is a new batch, not a
    duplicate of records the leader does not have. Batches below the leader's log start (deleted by
    DeleteRecords or retention) are kept, as Kafka's leader keeps their producers' state; so are
    those of partitions whose leader's log is not read (no leader, or a leader that is down, where
    nothing is appended).

    state_df: the producers table's batches; leaders_df: topic, partition, broker (the leader),
    log_start_offset, log_end_offset, of the leaders whose logs are read; logs_df: those logs'
    records (broker, topic, partition, offset, producer_id, producer_epoch, sequence)."""
    leaders = leaders_df.select(*PARTITION_KEY, F.col("broker").alias("_leader"),
                                F.col("log_start_offset").alias("_lso"), F.col("log_end_offset").alias("_leo"))
    last_records = logs_df.select(F.col("broker").alias("_leader"), *PARTITION_KEY,
                                  F.col("offset").alias("last_offset"), F.col("producer_id").alias("_pid"),
                                  F.coalesce(F.col("producer_epoch"), F.lit(0)).alias("_epoch"),
                                  F.col("sequence").alias("_sequence"), F.lit(True).alias("_found"))
    same = (F.col("_pid").eqNullSafe(F.col("producer_id")) & F.col("_epoch").eqNullSafe(F.col("producer_epoch"))
            & F.col("_sequence").eqNullSafe(F.col("last_sequence")))
    held = (F.col("_leader").isNull() | (F.col("last_offset") < F.col("_lso"))
            | ((F.col("last_offset") < F.col("_leo")) & (F.col("_found").isNull() | same)))
    return (state_df.join(leaders, on=PARTITION_KEY, how="left")
            .join(last_records, on=["_leader", *PARTITION_KEY, "last_offset"], how="left")
            .filter(F.coalesce(held, F.lit(False))).select(*state_df.columns))


def retained_batches(state_df: DataFrame) -> DataFrame:
    """The last BATCHES_TO_RETAIN batches of each producer per partition."""
    newest = Window.partitionBy(*PRODUCER_KEY).orderBy(F.col("last_offset").desc())
    return state_df.withColumn("_n", F.row_number().over(newest)).filter(F.col("_n") <= BATCHES_TO_RETAIN).drop("_n")


def check_producer_sequences(batches_df: DataFrame, state_df: DataFrame) -> DataFrame:
    """Each batch with `outcome`: append | duplicate | error, `error_code`, and for duplicates of a
    retained batch its `original_base_offset` / `original_last_offset` (null for a duplicate of a
    batch appended in this same round: `duplicate_of` names that request; a copy of a batch refused
    in this round is refused with the same error).

    state_df: retained batches (topic, partition, producer_id, producer_epoch, base_sequence,
    last_sequence, base_offset, last_offset).
    """
    same_batch = [*PRODUCER_KEY, "producer_epoch", "base_sequence", "last_sequence"]
    stored = state_df.select(*same_batch, F.col("base_offset").alias("original_base_offset"),
                             F.col("last_offset").alias("original_last_offset"))
    latest = (retained_batches(state_df)
              .withColumn("_n", F.row_number().over(Window.partitionBy(*PRODUCER_KEY).orderBy(F.col("last_offset").desc())))
              .filter(F.col("_n") == 1)
              .select(*PRODUCER_KEY, F.col("producer_epoch").alias("_stored_epoch"),
                      F.col("last_sequence").alias("_stored_last")))
    # copies of one batch in the round that no retained batch answers: the first is checked, the
    # others repeat it (its offsets if appended, its error if refused)
    fresh = F.col("original_base_offset").isNull() & ~F.col("is_malformed")
    in_round = Window.partitionBy(*same_batch, "_fresh").orderBy("_commit_version", "request_id")
    order = Window.partitionBy(*PRODUCER_KEY).orderBy("_commit_version", "request_id")
    firsts = (
        batches_df.join(stored, on=same_batch, how="left").join(latest, on=PRODUCER_KEY, how="left")
        .withColumn("_fresh", fresh)
        .withColumn("duplicate_of", F.when(F.col("_fresh") & (F.row_number().over(in_round) > 1),
                                           F.first("request_id").over(in_round)))
    )
    new = firsts.filter(F.col("_fresh") & F.col("duplicate_of").isNull())
    prev_epoch = F.coalesce(F.lag("producer_epoch").over(order), F.col("_stored_epoch"))
    prev_last = F.coalesce(F.lag("last_sequence").over(order), F.col("_stored_last"))
    checked = (
        new.withColumns({"_prev_epoch": prev_epoch, "_prev_last": prev_last})
        .withColumn("error_code", F.when(F.col("producer_epoch") < F.col("_prev_epoch"),
                                         F.lit(ErrorCode.INVALID_PRODUCER_EPOCH))
                    .when(F.col("_prev_epoch").isNull() | (F.col("producer_epoch") > F.col("_prev_epoch")),
                          F.when(F.col("base_sequence") != 0, F.lit(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)))
                    .when(F.col("base_sequence") != F.col("_prev_last") + 1,
                          F.lit(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)))
        # once a batch of a producer fails, its later batches in the round cannot continue it
        .withColumn("error_code", F.coalesce(F.col("error_code"), F.when(
            F.max(F.col("error_code").isNotNull().cast("int")).over(
                order.rowsBetween(Window.unboundedPreceding, -1)) == 1,
            F.lit(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER))))
        .select(*BATCH_KEY, "error_code")
    )
    return (
        firsts.join(checked, on=BATCH_KEY, how="left")
        .withColumn("error_code", F.when(F.col("is_malformed"), F.lit(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER))
                    .when(F.col("duplicate_of").isNotNull(), F.first("error_code").over(in_round))
                    .otherwise(F.col("error_code")))
        .withColumn("duplicate_of", F.when(F.col("error_code").isNull(), F.col("duplicate_of")))
        .withColumn("outcome", F.when(F.col("error_code").isNotNull(), F.lit("error"))
                    .when(F.col("original_base_offset").isNotNull() | F.col("duplicate_of").isNotNull(),
                          F.lit("duplicate"))
                    .otherwise(F.lit("append")))
        .select(*BATCH_KEY, "producer_id", "producer_epoch", "base_sequence", "last_sequence", "outcome",
                "error_code", "original_base_offset", "original_last_offset", "duplicate_of")
    )
