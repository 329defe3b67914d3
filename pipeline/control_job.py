"""Round v2's control job on Spark (DESIGN.md, "Round v2", 2-3): the inbox summarised by
(request, partition), and the working set's partition state cogrouped with it by bucket, Kafka's
rules run over each bucket's partitions in one Python task (pipeline/control/fetch_round.py,
`applyInArrow`), its output pinned once.

A bucket is a fetcher id, as Kafka's AbstractFetcherManager assigns them: partitions hash to one of
`num.replica.fetchers` fetchers, and each fetcher sends one request per leader, so a response's
limits apply within a bucket and a bucket's partitions are one Spark task. This module moves to
pipeline/round/ when the round of today is replaced by the v2 round."""

from __future__ import annotations

from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline.control.fetch_round import RoundContext, fetch_round
from pipeline.control.state import CONTROL_OUTPUT_SCHEMA, REQUEST_SUMMARY_SCHEMA
from pipeline.errors import ErrorCode
from pipeline.replication import record_size
from pipeline.schemas import REPLICA_KEY
from pipeline.storage import current_rows

__all__ = ["fetcher_bucket", "partition_state_from_tables", "summarise_inbox", "pending_requests", "run_control_job",
           "produce_results"]


def fetcher_bucket(topic: Column, partition: Column, fetchers: int) -> Column:
    """The fetcher id (and control task) of a partition: its hash modulo `num.replica.fetchers`."""
    return F.pmod(F.hash(topic, partition), F.lit(fetchers)).cast("int")


def partition_state_from_tables(partitions_df: DataFrame, replica_state_df: DataFrame, fetchers: int,
                                min_isr: int, lag_time_max_ms: int) -> DataFrame:
    """The partition state (PARTITION_STATE_SCHEMA) of today's tables: the partitions table's rows
    with each replica's current replica_state row (the newest by round, as that table is appended
    to) gathered into arrays in replica order. `min_isr` and `lag_time_max_ms` are given (the
    topic's effective config)."""
    per_replica = {"log_start_offset": "log_start_offset", "log_end_offset": "log_end_offset",
                   "replica_high_watermark": "high_watermark", "fetch_offset": "fetch_offset",
                   "last_fetch_time_ms": "last_fetch_time_ms", "last_fetch_leader_leo": "last_fetch_leader_leo",
                   "last_caught_up_time_ms": "last_caught_up_time_ms", "last_data_round": "last_data_round"}
    gathered = current_rows(replica_state_df, REPLICA_KEY).groupBy("topic", "partition").agg(
        *[F.map_from_entries(F.collect_list(F.struct("broker", column))).alias(f"_{name}")
          for name, column in per_replica.items()])
    joined = partitions_df.join(gathered, on=["topic", "partition"], how="inner")
    leader_hw = F.element_at(F.col("_replica_high_watermark"), F.col("leader"))
    return joined.select(
        "topic", "partition", fetcher_bucket(F.col("topic"), F.col("partition"), fetchers).alias("bucket"),
        "leader", "leader_epoch", "leader_epoch_start_offset", "partition_epoch", "replicas", "isr",
        F.coalesce(leader_hw, F.lit(0)).cast("long").alias("high_watermark"),
        F.lit(min_isr).alias("min_isr"), F.lit(lag_time_max_ms).cast("long").alias("lag_time_max_ms"),
        *[F.transform("replicas", _in_replica_order(f"_{name}")).alias(name) for name in per_replica])


def _in_replica_order(gathered: str):
    """A replica's value from the broker -> value map `gathered` (0 where the replica has no row)."""
    return lambda broker: F.coalesce(F.element_at(F.col(gathered), broker), F.lit(0).cast("long"))


def _producer_fields_disagree() -> Column:
    """A record whose producer id, epoch and sequence are neither all set (>= 0) nor all null."""
    pid, epoch, sequence = F.col("producer_id"), F.col("producer_epoch"), F.col("sequence")
    agree = F.when(pid.isNull(), epoch.isNull() & sequence.isNull()).otherwise(
        (pid >= 0) & F.coalesce(epoch >= 0, F.lit(False)) & F.coalesce(sequence >= 0, F.lit(False)))
    return ~agree


# A request's records for a partition form record batches of the records whose index in the request
# falls in one span of this many (a Kafka producer bounds its batches by batch.size, 16 KB by
# default): a fetch response takes whole batches, so a bulk request must not be one batch larger
# than replica.fetch.max.bytes. 100-byte records into one partition: batches of ~124 KB.
BATCH_INDEX_SPAN = 1024


def summarise_inbox(inbox_df: DataFrame, fetchers: int) -> DataFrame:
    """The new inbox rows (with `_commit_version`) reduced to one row per record batch (request,
    partition, span of record indexes): its records' count and bytes and whether their own checks
    failed (REQUEST_SUMMARY_SCHEMA). Small whatever the round's size: the records stay where they are."""
    batch = F.floor(F.col("record_index") / BATCH_INDEX_SPAN).cast("long").alias("batch")
    return (
        inbox_df.groupBy("request_id", "topic", "partition", batch)
        .agg(F.min("_commit_version").cast("long").alias("append_order"),
             F.count(F.lit(1)).alias("record_count"),
             F.sum(record_size(F.col("key"), F.col("value"))).cast("long").alias("bytes"),
             F.first("acks").alias("acks"),
             F.max(_producer_fields_disagree()).alias("_bad_fields"))
        .select("request_id", "topic", "partition",
                fetcher_bucket(F.col("topic"), F.col("partition"), fetchers).alias("bucket"),
                "append_order", "batch", "record_count", "bytes", "acks",
                F.when(F.col("_bad_fields"), F.lit(ErrorCode.INVALID_RECORD)).alias("record_error"),
                F.lit(False).alias("is_pending"), F.lit(None).cast("long").alias("base_offset"),
                F.lit(None).cast("long").alias("last_offset"))
    )


def pending_requests(results_df: DataFrame, fetchers: int) -> DataFrame:
    """acks=all requests appended in an earlier round and not yet answered (result rows with status
    pending), as inbox summary rows that carry their offsets (REQUEST_SUMMARY_SCHEMA)."""
    return results_df.select(
        "request_id", "topic", "partition", fetcher_bucket(F.col("topic"), F.col("partition"), fetchers).alias("bucket"),
        F.lit(0).cast("long").alias("append_order"), F.lit(0).cast("long").alias("batch"), "record_count",
        F.lit(0).cast("long").alias("bytes"), "acks",
        F.lit(None).cast("string").alias("record_error"), F.lit(True).alias("is_pending"), "base_offset", "last_offset")


class _Figures(AccumulatorParam):
    """The round's figures, summed over the control job's tasks: counts by name, and the brokers
    whose logs take rows (a set)."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, a: dict, b: dict) -> dict:
        for name, value in b.items():
            a[name] = a.get(name, set()) | value if isinstance(value, set) else a.get(name, 0) + value
        return a


def _bucket_figures(out: pa.Table) -> dict:
    appended = pc.greater(out.column("records_appended"), 0)
    leaders = pc.filter(out.column("leader"), appended).to_pylist()
    fetches = pc.list_flatten(out.column("fetches"))
    takers = pc.struct_field(fetches, "broker").to_pylist() if len(fetches) else []
    lagging = pc.invert(pc.struct_field(fetches, "from_batch")) if len(fetches) else pa.array([], pa.bool_())
    rows_of_fetch = pc.list_value_length(out.column("fetches")).to_numpy(zero_copy_only=False)
    leader_of_fetch = np.repeat(out.column("leader").to_numpy(zero_copy_only=False), rows_of_fetch)
    return {"records_appended": pc.sum(out.column("records_appended")).as_py() or 0,
            "records_replicated": pc.sum(out.column("records_replicated")).as_py() or 0,
            "results": len(pc.list_flatten(out.column("results"))), "brokers": set(leaders) | set(takers),
            "changed": pc.sum(out.column("is_changed")).as_py() or 0,
            "unsettled": pc.sum(pc.invert(out.column("is_settled"))).as_py() or 0,
            "lagging": pc.sum(lagging).as_py() or 0,
            "lagging_leaders": set(leader_of_fetch[lagging.to_numpy(zero_copy_only=False)].tolist())}


def _bucket_rules(ctx: RoundContext, figures: Accumulator, state: pa.Table, requests: pa.Table) -> pa.Table:
    out = fetch_round(state, requests, ctx)
    figures.add(_bucket_figures(out))
    return out


def run_control_job(state_df: DataFrame, summary_df: DataFrame, ctx: RoundContext) -> tuple[DataFrame, dict]:
    """The working set's partitions after the round (CONTROL_OUTPUT_SCHEMA), computed in one Spark
    job whose tasks are buckets, and pinned: every output of the round is read from it. With the
    round's figures, which its tasks send back with their results (an accumulator: no job of
    their own): records_appended, records_replicated, results, the brokers whose logs take rows,
    the rows that changed (`is_changed`), the partitions not settled (`unsettled`), and the fetches
    that read a leader's log (`lagging`) with those leaders."""
    figures = state_df.sparkSession.sparkContext.accumulator({}, _Figures())
    requests = summary_df.select(*REQUEST_SUMMARY_SCHEMA.fieldNames())
    control = (state_df.groupBy("bucket").cogroup(requests.groupBy("bucket"))
               .applyInArrow(partial(_bucket_rules, ctx, figures), CONTROL_OUTPUT_SCHEMA)
               .localCheckpoint())
    totals = {"records_appended": 0, "records_replicated": 0, "results": 0, "brokers": set(), "changed": 0,
              "unsettled": 0, "lagging": 0, "lagging_leaders": set()}
    totals.update(figures.value)
    return control, totals


def produce_results(partition_rows_df: DataFrame) -> DataFrame:
    """The produce results in partition rows (the control job's, or the partition state table's),
    one row per (request, partition), with the round that answered them (the results table's rows).
    The round writes them nested in the partition rows, so a partition's new HW and the acks it
    allows land in one commit."""
    return (partition_rows_df.select("topic", "partition", "round_id", F.explode("results").alias("r"))
            .select(F.col("r.request_id").alias("request_id"), "topic", "partition", "r.base_offset", "r.last_offset",
                    "r.record_count", "r.acks", "r.status", "r.error_code", F.col("round_id").cast("long")))
