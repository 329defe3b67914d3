"""Round v2's control job on Spark (DESIGN.md, "Round v2", 2-3): the inbox summarised by
(request, partition), and the working set's partition state cogrouped with it by bucket, Kafka's
rules run over each bucket's partitions in one Python task (pipeline/control/fetch_round.py,
`applyInArrow`), its output pinned once.

A bucket is a fetcher id, as Kafka's AbstractFetcherManager assigns them: partitions hash to one of
`num.replica.fetchers` fetchers, and each fetcher sends one request per leader, so a response's
limits apply within a bucket and a bucket's partitions are one Spark task."""

from __future__ import annotations

from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline.control import partition_health
from pipeline.control.fetch_round import RoundContext, fetch_round_and_sessions
from pipeline.control.acks import STATUS_ACKED, STATUS_ERROR, STATUS_PENDING
from pipeline.control.state import CONTROL_OUTPUT_SCHEMA, REQUEST_SUMMARY_SCHEMA, SESSION_ARRAYS, padded
from pipeline.errors import ErrorCode
from pipeline.control.producer_state import check_producer_sequences, producer_batches, retained_batches
from pipeline.control.replication import producer_fields_agree, record_size, validate_produce_requests
from pipeline.schemas import REPLICA_KEY
from pipeline.runtime import without_size_estimate
from pipeline.storage import current_rows

__all__ = ["fetcher_bucket", "partition_state_from_tables", "summarise_inbox", "pending_requests", "producer_checks",
           "with_producer_checks", "run_control_job", "produce_results"]


def fetcher_bucket(topic: Column, partition: Column, fetchers: int) -> Column:
    """The fetcher id (and control task) of a partition: its hash modulo `num.replica.fetchers`."""
    return F.pmod(F.hash(topic, partition), F.lit(fetchers)).cast("int")


def partition_state_from_tables(partitions_df: DataFrame, replica_state_df: DataFrame, fetchers: int,
                                min_isr: int | None = None, lag_time_max_ms: int | None = None) -> DataFrame:
    """The partition state (PARTITION_STATE_SCHEMA) of today's tables: the partitions table's rows
    with each replica's current replica_state row (the newest by round, as that table is appended
    to) gathered into arrays in replica order. The topic's effective `min_isr` and
    `lag_time_max_ms` are the given values, or else `partitions_df`'s columns of those names."""
    per_replica = {"log_start_offset": "log_start_offset", "log_end_offset": "log_end_offset",
                   "replica_high_watermark": "high_watermark", "fetch_offset": "fetch_offset",
                   "last_fetch_time_ms": "last_fetch_time_ms", "last_fetch_leader_leo": "last_fetch_leader_leo",
                   "last_caught_up_time_ms": "last_caught_up_time_ms", "last_data_round": "last_data_round",
                   **{name: name for name in SESSION_ARRAYS}, "validated_leader_epoch": "validated_leader_epoch"}
    gathered = current_rows(replica_state_df, REPLICA_KEY).groupBy("topic", "partition").agg(
        *[F.map_from_entries(F.collect_list(F.struct("broker", column))).alias(f"_{name}")
          for name, column in per_replica.items()])
    joined = partitions_df.join(gathered, on=["topic", "partition"], how="inner")
    leader_hw = F.element_at(F.col("_replica_high_watermark"), F.col("leader"))
    return joined.select(
        "topic", "partition", fetcher_bucket(F.col("topic"), F.col("partition"), fetchers).alias("bucket"),
        "leader", "leader_epoch", "leader_epoch_start_offset", "partition_epoch", "replicas", "isr",
        F.coalesce(F.col("adding_replicas"), F.array().cast("array<int>")).alias("adding_replicas"),
        F.coalesce(leader_hw, F.lit(0)).cast("long").alias("high_watermark"),
        (F.col("min_isr") if min_isr is None else F.lit(min_isr)).cast("int").alias("min_isr"),
        (F.col("lag_time_max_ms") if lag_time_max_ms is None else F.lit(lag_time_max_ms)).cast("long")
        .alias("lag_time_max_ms"),
        *[F.transform("replicas", _in_replica_order(f"_{name}")).alias(name) for name in per_replica])


def _in_replica_order(gathered: str):
    """A replica's value from the broker -> value map `gathered` (0 where the replica has no row)."""
    return lambda broker: F.coalesce(F.element_at(F.col(gathered), broker), F.lit(0)).cast("long")


# A request's records for a partition form record batches of the records whose index in the request
# falls in one span of this many (a Kafka producer bounds its batches by batch.size, 16 KB by
# default): a fetch response takes whole batches, so a bulk request must not be one batch larger
# than replica.fetch.max.bytes. 100-byte records into one partition: batches of ~124 KB.
BATCH_INDEX_SPAN = 1024


def summarise_inbox(inbox_df: DataFrame, fetchers: int, topic_checks: DataFrame | None = None) -> DataFrame:
    """The new inbox rows (with `_commit_version`) reduced to one row per record batch (request,
    partition, span of record indexes): its records' count and bytes and whether their own checks
    failed (REQUEST_SUMMARY_SCHEMA). Small whatever the round's size: the records stay where they are.

    The records' own checks, the first failing one naming the error: with `topic_checks` (topic,
    message_max_bytes, compact: the topic's effective config), a record over message.max.bytes
    (MESSAGE_TOO_LARGE) and a record without a key on a compacted topic (INVALID_RECORD, Kafka's
    LogValidator); then producer id, epoch and sequence that are neither all set nor all null
    (INVALID_RECORD)."""
    batch = F.floor(F.col("record_index") / BATCH_INDEX_SPAN).cast("long").alias("batch")
    size = record_size(F.col("key"), F.col("value"))
    if topic_checks is None:
        too_large, keyless = F.lit(False), F.lit(False)
    else:
        # (a sort-merge join, never a broadcast: Spark broadcasts the small pinned checks by itself,
        # and a broadcast is a Spark job of its own, where the join's stages are the control job's)
        inbox_df = inbox_df.join(topic_checks.select("topic", "message_max_bytes", "compact").hint("merge"),
                                 on="topic", how="left")
        too_large = F.coalesce(size > F.col("message_max_bytes"), F.lit(False))
        keyless = F.coalesce(F.col("compact") & F.col("key").isNull(), F.lit(False))
    return (
        inbox_df.groupBy("request_id", "topic", "partition", batch)
        .agg(F.min("_commit_version").cast("long").alias("append_order"),
             F.count(F.lit(1)).alias("record_count"),
             F.sum(size).cast("long").alias("bytes"),
             F.first("acks").alias("acks"),
             F.max(too_large).alias("_too_large"), F.max(keyless).alias("_keyless"),
             F.max(~producer_fields_agree()).alias("_bad_fields"))
        .select("request_id", "topic", "partition",
                fetcher_bucket(F.col("topic"), F.col("partition"), fetchers).alias("bucket"),
                "append_order", "batch", "record_count", "bytes", "acks",
                F.when(F.col("_too_large"), F.lit(ErrorCode.MESSAGE_TOO_LARGE))
                .when(F.col("_keyless") | F.col("_bad_fields"), F.lit(ErrorCode.INVALID_RECORD)).alias("record_error"),
                F.lit(False).alias("is_pending"), F.lit(None).cast("long").alias("base_offset"),
                F.lit(None).cast("long").alias("last_offset"), F.lit(False).alias("is_duplicate"),
                F.lit(None).cast("string").alias("duplicate_of"))
    )


def pending_requests(results_df: DataFrame, fetchers: int) -> DataFrame:
    """acks=all requests appended in an earlier round and not yet answered (result rows with status
    pending), as inbox summary rows that carry their offsets (REQUEST_SUMMARY_SCHEMA)."""
    return results_df.select(
        "request_id", "topic", "partition", fetcher_bucket(F.col("topic"), F.col("partition"), fetchers).alias("bucket"),
        F.lit(0).cast("long").alias("append_order"), F.lit(0).cast("long").alias("batch"), "record_count",
        F.lit(0).cast("long").alias("bytes"), "acks",
        F.lit(None).cast("string").alias("record_error"), F.lit(True).alias("is_pending"), "base_offset", "last_offset",
        F.lit(False).alias("is_duplicate"), F.lit(None).cast("string").alias("duplicate_of"))


_PART = ["request_id", "topic", "partition"]


def producer_checks(inbox_df: DataFrame, state_df: DataFrame, topic_checks: DataFrame, stored_df: DataFrame
                    ) -> DataFrame:
    """The sequence checks of the round's idempotent batches (producer_state.check_producer_sequences:
    outcome append, duplicate or error, per (request, partition)) against the producers' retained
    batches `stored_df` (in the leader's log: producer_state.batches_in_leader_log). As Kafka's
    leader, only of the batches it does not refuse before it looks at the producer state
    (ReplicaManager and LogValidator first: replication.validate_produce_requests), so a refused
    batch neither continues a sequence nor breaks it. `state_df`: the partition state before the
    round; `topic_checks`: topic, message_max_bytes, compact."""
    idempotent = inbox_df.filter(F.col("producer_id").isNotNull()).select(*_PART).distinct()
    rows = inbox_df.join(idempotent, on=_PART, how="left_semi")
    meta = state_df.select("topic", "partition", "leader", "leader_epoch", "isr",
                           F.expr(partition_health.SQL["effective_min_isr"]).alias("min_isr")).join(
        topic_checks.select("topic", "message_max_bytes", "compact"), on="topic")
    checked = validate_produce_requests(rows, meta).filter(F.col("error_code").isNull()
                                                           & F.col("producer_id").isNotNull())
    return check_producer_sequences(producer_batches(checked), retained_batches(stored_df))


def with_producer_checks(summary_df: DataFrame, checks_df: DataFrame) -> DataFrame:
    """The inbox summary with the producers' sequence checks (`producer_checks`): a batch out of
    sequence or of a fenced producer epoch refused with its error, a retried one a duplicate with
    the offsets it repeats (REQUEST_SUMMARY_SCHEMA)."""
    checks = checks_df.select(*_PART, F.col("outcome").alias("_outcome"), F.col("error_code").alias("_sequence_error"),
                              F.col("original_base_offset").alias("_base"), F.col("original_last_offset").alias("_last"),
                              F.col("duplicate_of").alias("_of"))
    duplicate = F.coalesce(F.col("_outcome") == "duplicate", F.lit(False))
    return (summary_df.drop("is_duplicate", "duplicate_of").join(checks, on=_PART, how="left")
            .withColumns({"record_error": F.coalesce(F.col("record_error"), F.col("_sequence_error")),
                          "is_duplicate": duplicate,
                          "base_offset": F.when(duplicate, F.col("_base")).otherwise(F.col("base_offset")),
                          "last_offset": F.when(duplicate, F.col("_last")).otherwise(F.col("last_offset")),
                          "duplicate_of": F.when(duplicate, F.col("_of"))})
            .select(*REQUEST_SUMMARY_SCHEMA.fieldNames()))


# the control job's figures that are counts (summed over its tasks)
_COUNTS = ("records_appended", "records_replicated", "results", "requests_acked", "requests_failed",
           "pending_requests", "changed", "unsettled", "isr_shrinks", "isr_expands", "isr_changes",
           "under_replicated_partitions", "under_min_isr_partitions", "at_min_isr_partitions", "offline_partitions",
           "fetch_request_partitions", "fetch_response_partitions", "replicas", "changed_replicas", "hw_advances")


class _Figures(AccumulatorParam):
    """The round's figures, summed over the control job's tasks: counts by name, and the brokers
    whose logs take rows (a set)."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, a: dict, b: dict) -> dict:
        for name, value in b.items():
            if isinstance(value, set):
                a[name] = a.get(name, set()) | value
            elif isinstance(value, dict):  # (summed by key; broker_max_lag: the largest by key)
                merged = dict(a.get(name, {}))
                for key, n in value.items():
                    merged[key] = max(merged.get(key, 0), n) if name == "broker_max_lag" else merged.get(key, 0) + n
                a[name] = merged
            elif name == "max_lag":
                a[name] = max(a.get(name, 0), value)
            else:
                a[name] = a.get(name, 0) + value
        return a


def _bucket_figures(out: pa.Table, ctx: RoundContext) -> dict:
    appended = pc.greater(out.column("records_appended"), 0)
    leaders = pc.filter(out.column("leader"), appended).to_pylist()
    fetches = pc.list_flatten(out.column("fetches"))
    takers = pc.struct_field(fetches, "broker").to_pylist() if len(fetches) else []
    rf = pc.list_value_length(out.column("replicas"))
    results = pc.list_flatten(out.column("results"))
    status = pc.struct_field(results, "status") if len(results) else pa.array([], pa.string())
    return {"records_appended": pc.sum(out.column("records_appended")).as_py() or 0,
            "records_replicated": pc.sum(out.column("records_replicated")).as_py() or 0,
            "results": len(results), "brokers": set(leaders) | set(takers),
            "requests_acked": pc.sum(pc.equal(status, STATUS_ACKED)).as_py() or 0,
            "requests_failed": pc.sum(pc.equal(status, STATUS_ERROR)).as_py() or 0,
            "pending_requests": pc.sum(pc.equal(status, STATUS_PENDING)).as_py() or 0,
            "changed": pc.sum(out.column("is_changed")).as_py() or 0,
            "replicas": pc.sum(pc.if_else(out.column("is_known"), rf, 0)).as_py() or 0,
            "changed_replicas": pc.sum(pc.if_else(pc.and_(out.column("is_known"), out.column("is_changed")), rf, 0))
            .as_py() or 0,
            "unsettled": pc.sum(pc.invert(out.column("is_settled"))).as_py() or 0,
            "isr_shrinks": pc.sum(out.column("isr_shrinks")).as_py() or 0,
            "isr_expands": pc.sum(out.column("isr_expands")).as_py() or 0,
            "isr_changes": pc.sum(pc.greater(pc.add(out.column("isr_shrinks"), out.column("isr_expands")), 0))
            .as_py() or 0,
            "fetch_request_partitions": pc.sum(out.column("fetch_request_partitions")).as_py() or 0,
            "fetch_response_partitions": pc.sum(out.column("fetch_response_partitions")).as_py() or 0,
            **partition_gauges(out.filter(out.column("is_known")), ctx)}


def partition_gauges(out: pa.Table, ctx: RoundContext) -> dict:
    """Kafka's partition gauges over partition rows after a round (control/partition_health.py:
    under-replicated, under and at min ISR, offline); and the largest follower lag behind its
    leader's LEO (the leaders with a follower behind: `lagging_leaders`). Per broker too, as
    Kafka's brokers report them: `broker_gauges` ((gauge, broker) -> partitions: the replicas a
    broker hosts, the partitions it leads, and of those the under-replicated, under and at min
    ISR ones) and `broker_max_lag` (broker -> its follower replicas' largest lag: MaxLag)."""
    def sizes(column: str) -> np.ndarray:
        return pc.list_value_length(out.column(column)).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)

    replicas = out.column("replicas")
    rf, isr = sizes("replicas"), sizes("isr")
    min_isr = out.column("min_isr").to_numpy(zero_copy_only=False).astype(np.int64)
    leader = out.column("leader").to_numpy(zero_copy_only=False).astype(np.int64)
    width = max(int(rf.max()) if len(rf) else 1, 1)
    brokers = padded(replicas, width, -1, np.int64)
    leo = padded(out.column("log_end_offset"), width, 0, np.int64)
    exists = np.arange(width)[None, :] < rf[:, None]
    is_leader = (brokers == leader[:, None]) & exists
    serving = is_leader.any(axis=1) & ~np.isin(leader, ctx.ineligible_brokers)
    followers = exists & ~is_leader & serving[:, None]
    lag = np.where(followers, np.where(is_leader, leo, 0).sum(axis=1)[:, None] - leo, 0)
    behind = (lag > 0).any(axis=1)
    adding = sizes("adding_replicas")
    led = ~partition_health.offline(leader)
    by_leader = {"PartitionCount": brokers[exists], "LeaderCount": leader[led],
                 "UnderReplicatedPartitions": leader[led & partition_health.under_replicated(isr, rf, adding)],
                 "UnderMinIsrPartitionCount": leader[partition_health.under_min_isr(isr, min_isr, rf, leader)],
                 "AtMinIsrPartitionCount": leader[partition_health.at_min_isr(isr, min_isr, rf, leader)]}
    broker_gauges = {(gauge, int(b)): int(n) for gauge, ids in by_leader.items()
                     for b, n in zip(*np.unique(ids, return_counts=True))}
    return {"lagging_leaders": set(leader[behind].tolist()),
            **partition_health.gauges(isr, rf, adding, min_isr, leader),
            "max_lag": int(lag.max()) if lag.size else 0, "broker_gauges": broker_gauges,
            "broker_max_lag": {int(b): int(lag[followers & (brokers == b)].max()) for b in np.unique(brokers[followers])}}


def hw_advances(before: pa.Table, after: pa.Table) -> int:
    """The partitions whose leader's high watermark moved up: partition rows before the round
    (PARTITION_STATE_SCHEMA) against the control job's rows after it (rows of unknown partitions,
    which carry only results, left out)."""
    known = after.filter(after.column("is_known"))
    if not len(known) or not len(before):
        return 0
    old = before.select(["topic", "partition", "high_watermark"]).rename_columns(["topic", "partition", "_before"])
    pairs = known.select(["topic", "partition", "high_watermark"]).join(old, ["topic", "partition"])
    return pc.sum(pc.greater(pairs.column("high_watermark"), pairs.column("_before"))).as_py() or 0


def _bucket_rules(ctx: RoundContext, figures: Accumulator, state: pa.Table, requests: pa.Table) -> pa.Table:
    out, sessions = fetch_round_and_sessions(state, requests, ctx)
    figures.add({**_bucket_figures(out, ctx), "hw_advances": hw_advances(state, out),
                 "followed_up_sessions": set(sessions.followed_up),
                 "session_partitions_added": sessions.added, "log_start_brokers": set(sessions.log_start_brokers),
                 "throttled_bytes": sessions.throttled_bytes})
    return out


def run_control_job(state_df: DataFrame, summary_df: DataFrame, ctx: RoundContext) -> tuple[DataFrame, dict]:
    """The working set's partitions after the round (CONTROL_OUTPUT_SCHEMA), computed in one Spark
    job whose tasks are buckets, and pinned: every output of the round is read from it. With the
    round's figures, which its tasks send back with their results (an accumulator: no job of
    their own): records_appended, records_replicated, results, the brokers whose logs take rows,
    the rows that changed (`is_changed`) and their replicas (`changed_replicas`), the replicas of
    the partitions it was given (`replicas`), the partitions not settled (`unsettled`), the leaders
    with a follower behind their LEO after the round (`lagging_leaders`: the logs the next round's
    lagging followers read), the rounds row's counts and gauges, the fetch sessions whose fetcher
    sent a follow-up (`followed_up_sessions`), the partitions each incremental request added to
    its session (`session_partitions_added`: session id -> partitions), and the brokers whose
    replicas' log start offsets moved (`log_start_brokers`), and the bytes each throttled broker
    drew on its replication quota (`throttled_bytes`: ("leader" | "follower", broker) -> bytes)."""
    figures = state_df.sparkSession.sparkContext.accumulator({}, _Figures())
    requests = summary_df.select(*REQUEST_SUMMARY_SCHEMA.fieldNames())
    # (replication quotas are a broker's over all its partitions: the buckets then run in one task)
    task = "bucket"
    if ctx.throttled:
        task, state_df, requests = "_task", state_df.withColumn("_task", F.lit(0)), requests.withColumn("_task", F.lit(0))
    control = without_size_estimate(state_df.groupBy(task).cogroup(requests.groupBy(task))
                                    .applyInArrow(partial(_bucket_rules, ctx, figures), CONTROL_OUTPUT_SCHEMA)
                                    .localCheckpoint())
    totals = {name: 0 for name in _COUNTS}
    totals.update(max_lag=0, brokers=set(), lagging_leaders=set(), followed_up_sessions=set(), broker_gauges={},
                  broker_max_lag={},
                  session_partitions_added={}, log_start_brokers=set(), throttled_bytes={})
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
