"""Orchestration: one fetch round (DESIGN.md "One round, in order"), the function the streaming
job's foreachBatch calls. Reads the inputs once, applies the rules, commits O(brokers) times.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from functools import reduce
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StringType

from pipeline import acks as acks_rules
from pipeline import isr as isr_rules
from pipeline import replication as rules
from pipeline.schemas import LOG_SCHEMA, NO_LEADER, REPLICA_STATE_SCHEMA, RESULTS_SCHEMA, ROUNDS_SCHEMA
from pipeline.storage import Storage

__all__ = ["RoundReport", "RoundInputs", "run_round"]

PARTITION_KEY = ["topic", "partition"]
REPLICA_KEY = ["topic", "partition", "broker"]


@dataclass(frozen=True)
class RoundReport:
    """What one round did (also one row of `replog.rounds`)."""

    round_id: int
    now_ms: int
    inbox_version: int
    fetch_request_partitions: int
    fetch_response_partitions: int
    records_appended: int
    records_replicated: int
    requests_acked: int
    requests_failed: int
    isr_shrinks: int
    isr_expands: int
    under_replicated_partitions: int
    under_min_isr_partitions: int
    at_min_isr_partitions: int
    offline_partitions: int
    max_lag: int
    duration_ms: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RoundInputs:
    """What the driver knows before a round: O(brokers) values, never per-partition data."""

    round_id: int
    now_ms: int
    last_inbox_version: int
    cluster_config: dict[str, Any]
    brokers: list[int]
    paused_brokers: dict[int, int | None]  # broker -> its last fetch time before the pause
    throttles: dict[int, int]  # broker -> max bytes per round
    previous_round_ms: int | None


def _partition_meta(storage: Storage, config: dict[str, Any]) -> DataFrame:
    """Partitions with each topic's effective config (overrides over the cluster's)."""
    overrides = F.from_json(F.col("config"), MapType(StringType(), StringType()))

    def setting(key: str, cast: str) -> Any:
        default = str(config[key]).lower()
        return F.coalesce(overrides.getItem(key), F.lit(default)).cast(cast)

    topics = storage.read("topics").select(
        "topic",
        setting("min.insync.replicas", "int").alias("min_isr"),
        setting("replica.lag.time.max.ms", "long").alias("lag_time_max_ms"),
        setting("message.max.bytes", "long").alias("message_max_bytes"),
    )
    return storage.read("partitions").join(topics, on="topic", how="inner").drop("round_id")


def _with_broker_info(replicas_df: DataFrame, inputs: RoundInputs) -> DataFrame:
    spark = replicas_df.sparkSession
    rows = []
    for broker in inputs.brokers:
        paused = broker in inputs.paused_brokers
        last_fetch = inputs.paused_brokers.get(broker) if paused else inputs.previous_round_ms
        rows.append((broker, paused, last_fetch, inputs.throttles.get(broker)))
    info = spark.createDataFrame(
        rows, "broker int, is_paused boolean, broker_last_fetch_ms long, throttle_bytes long")
    return replicas_df.join(F.broadcast(info), on="broker", how="left")


def _append_per_broker(storage: Storage, df: DataFrame, brokers: list[int], round_id: int) -> None:
    """One commit per broker that has rows (O(brokers) commits)."""
    present = {r["broker"] for r in df.select("broker").distinct().collect()}
    for broker in brokers:
        if broker in present:
            storage.append(df.filter(F.col("broker") == broker).select(*LOG_SCHEMA.fieldNames()),
                           storage.log_path(broker), round_id)


def _old_leader_records(storage: Storage, needs_df: DataFrame, brokers: list[int]) -> DataFrame | None:
    """Leader log rows older than this round's append, for followers that lag behind it."""
    bounds = needs_df.agg(F.count(F.lit(1)).alias("n"), F.min("fetch_offset").alias("lo")).first()
    if not bounds["n"]:
        return None
    logs = [storage.read_log(b).filter(F.col("offset") >= F.lit(bounds["lo"])).withColumn("broker", F.lit(b))
            for b in brokers]
    wanted = needs_df.select(*PARTITION_KEY, F.col("leader").alias("broker"), "leader_leo_before").distinct()
    return (reduce(DataFrame.unionByName, logs)
            .join(wanted, on=["broker", *PARTITION_KEY], how="inner")
            .filter(F.col("offset") < F.col("leader_leo_before"))
            .drop("leader_leo_before"))


def _pending_results(storage: Storage) -> DataFrame:
    from pyspark.sql import Window

    newest = Window.partitionBy("request_id", "topic", "partition").orderBy(F.col("round_id").desc())
    return (storage.read("results").withColumn("_n", F.row_number().over(newest))
            .filter((F.col("_n") == 1) & (F.col("status") == acks_rules.STATUS_PENDING)).drop("_n"))


def run_round(spark: SparkSession, storage: Storage, inputs: RoundInputs) -> RoundReport:
    """One fetch round: leader append, follower fetch, ISR, high watermark, acks, metrics."""
    started = time.perf_counter()
    now, round_id = inputs.now_ms, inputs.round_id
    config = inputs.cluster_config

    # -- inputs, pinned for the whole round ------------------------------------------------
    meta = _partition_meta(storage, config).localCheckpoint()
    state = storage.read("replica_state").drop("round_id").localCheckpoint()
    replicas = (
        state.join(meta, on=PARTITION_KEY, how="inner")
        .withColumn("is_leader", F.col("broker") == F.col("leader"))
        .withColumn("partition_max_bytes", F.lit(config["replica.fetch.max.bytes"]).cast("long"))
    )
    leader_rows = replicas.filter("is_leader").select(
        *PARTITION_KEY, F.col("log_end_offset").alias("leader_leo_before"),
        F.col("high_watermark").alias("leader_hw_before"))
    replicas = _with_broker_info(replicas.join(leader_rows, on=PARTITION_KEY, how="left"), inputs).localCheckpoint()

    inbox_version = storage.version("inbox")
    if inbox_version > inputs.last_inbox_version:
        inbox = storage.read_changes("inbox", inputs.last_inbox_version, inbox_version).drop(
            "_change_type", "_commit_timestamp")
    else:
        inbox = spark.createDataFrame([], storage.read("inbox").schema).withColumn("_commit_version", F.lit(0).cast("long"))

    # -- 2. leader append ------------------------------------------------------------------
    validated = rules.validate_produce_requests(
        inbox, meta.select(*PARTITION_KEY, "leader", "leader_epoch", "isr", "min_isr", "message_max_bytes")
    ).localCheckpoint()
    leaders = replicas.filter("is_leader").select(
        *PARTITION_KEY, "leader", "leader_epoch", F.col("log_end_offset").alias("leader_leo"))
    appended = rules.assign_offsets(
        validated.filter(F.col("error_code").isNull()).drop("leader", "leader_epoch"), leaders).localCheckpoint()
    append_counts = appended.groupBy(*PARTITION_KEY).agg(F.count(F.lit(1)).alias("appended"))
    replicas = (
        replicas.join(append_counts, on=PARTITION_KEY, how="left")
        .withColumn("appended", F.coalesce(F.col("appended"), F.lit(0)).cast("long"))
        .withColumn("leader_leo", F.col("leader_leo_before") + F.col("appended"))
    )

    # -- 3. fetch: the leader updates its view of each fetching follower --------------------
    followers = rules.with_effective_fetch_state(
        replicas.filter(~F.col("is_leader") & (F.col("leader") != NO_LEADER)))
    is_fetching = ~F.col("is_paused")
    fetched = rules.update_follower_fetch_state(
        followers.filter(is_fetching).withColumn("fetch_offset", F.col("log_end_offset")), now)
    followers = fetched.unionByName(followers.filter(~is_fetching)).withColumn("fetched", is_fetching)

    # -- 5. ISR: expand (vs the HW before this fetch), shrink (lagging too long) -----------
    followers = followers.withColumn("leader_hw", F.col("leader_hw_before")).localCheckpoint()
    joining = isr_rules.maybe_expand_isr(followers.filter("fetched"))
    leaving = isr_rules.out_of_sync_followers(followers, now)
    changes = (
        joining.withColumn("delta", F.lit(1)).unionByName(leaving.withColumn("delta", F.lit(-1)))
        .groupBy(*PARTITION_KEY).agg(
            F.collect_list(F.when(F.col("delta") > 0, F.col("broker"))).alias("_in"),
            F.collect_list(F.when(F.col("delta") < 0, F.col("broker"))).alias("_out"))
    )
    isr_changed = (
        meta.join(changes, on=PARTITION_KEY, how="inner")
        .withColumn("isr", isr_rules.isr_in_replica_order(
            F.col("replicas"), F.array_union(F.array_except(F.col("isr"), F.col("_out")), F.col("_in"))))
        .withColumn("isr_expands", F.size(F.col("_in")).cast("long"))
        .withColumn("isr_shrinks", F.size(F.col("_out")).cast("long"))
        .withColumn("partition_epoch", F.col("partition_epoch") + 1)
        .drop("_in", "_out")
    ).localCheckpoint()
    new_isr = isr_changed.select(*PARTITION_KEY, F.col("isr").alias("_new_isr"))

    def with_new_isr(df: DataFrame) -> DataFrame:
        return (df.join(new_isr, on=PARTITION_KEY, how="left")
                .withColumn("isr", F.coalesce(F.col("_new_isr"), F.col("isr"))).drop("_new_isr"))

    # -- high watermark over the leader and (new) ISR ---------------------------------------
    leader_now = replicas.filter("is_leader").withColumn("fetch_offset", F.col("leader_leo"))
    hw_input = with_new_isr(leader_now.unionByName(followers.drop("fetched", "leader_hw"), allowMissingColumns=True)
                            .withColumn("high_watermark", F.col("leader_hw_before")))
    hw = rules.maybe_increment_leader_hw(hw_input, now).localCheckpoint()

    # -- 4. response and follower append ----------------------------------------------------
    fetching = followers.filter("fetched").drop("throttle_bytes")
    needs_old = fetching.filter(F.col("fetch_offset") < F.col("leader_leo_before"))
    old = _old_leader_records(storage, needs_old, inputs.brokers)
    source = appended.select(*LOG_SCHEMA.fieldNames(), "broker")
    source = source if old is None else source.unionByName(old)
    throttle = followers.select("broker", "throttle_bytes").distinct()
    fetch_req = fetching.join(throttle, on="broker", how="left").withColumn(
        "partition_max_bytes", F.least(F.col("partition_max_bytes"),
                                       F.coalesce(F.col("throttle_bytes"), F.col("partition_max_bytes"))))
    response = rules.fetch_response_records(fetch_req, source).localCheckpoint()
    followers_after = rules.follower_log_end(fetching, response, hw).localCheckpoint()

    # -- 6. acks ----------------------------------------------------------------------------
    partitions_now = with_new_isr(meta).join(hw, on=PARTITION_KEY, how="left").withColumn(
        "high_watermark", F.coalesce(F.col("high_watermark"), F.lit(0)))
    appended_results = (
        appended.groupBy("request_id", *PARTITION_KEY, "acks").agg(
            F.min("offset").alias("base_offset"), F.max("offset").alias("last_offset"),
            F.count(F.lit(1)).alias("record_count"))
        .withColumn("status", acks_rules.status_after_append(F.col("acks")))
        .withColumn("error_code", F.lit(None).cast("string"))
    )
    rejected = (
        validated.filter(F.col("error_code").isNotNull())
        .groupBy("request_id", *PARTITION_KEY, "acks", "error_code").agg(F.count(F.lit(1)).alias("record_count"))
        .withColumn("base_offset", F.lit(None).cast("long")).withColumn("last_offset", F.lit(None).cast("long"))
        .withColumn("status", F.lit(acks_rules.STATUS_ERROR))
    )
    pending = _pending_results(storage).drop("round_id").unionByName(
        appended_results.filter(F.col("status") == acks_rules.STATUS_PENDING))
    answered = acks_rules.resolve_pending_acks(pending, partitions_now)
    # a request appended and answered in the same round is written once, answered
    results = (
        appended_results.join(answered.select("request_id", *PARTITION_KEY), on=["request_id", *PARTITION_KEY],
                              how="left_anti")
        .unionByName(rejected).unionByName(answered)
        .withColumn("round_id", F.lit(round_id).cast("long"))
        .select(*RESULTS_SCHEMA.fieldNames())
    ).localCheckpoint()

    # -- commits: leader logs, ISR, follower logs, replica state, results, metrics ---------
    _append_per_broker(storage, appended, inputs.brokers, round_id)
    isr_rows = isr_changed.withColumn("round_id", F.lit(round_id).cast("long"))
    has_isr_change = isr_rows.limit(1).count() > 0
    if has_isr_change:
        storage.upsert(isr_rows.select(*storage.read("partitions").columns), "partitions", PARTITION_KEY, round_id)
    _append_per_broker(storage, response, inputs.brokers, round_id)

    state_cols = REPLICA_STATE_SCHEMA.fieldNames()
    leader_rows_out = (
        leader_now.join(hw.select(*PARTITION_KEY, F.col("high_watermark").alias("_hw")), on=PARTITION_KEY, how="left")
        .filter((F.col("appended") > 0) | (F.col("_hw") != F.col("leader_hw_before")))
        .withColumn("log_end_offset", F.col("leader_leo"))
        .withColumn("high_watermark", F.col("_hw"))
    )
    quiescent_after = (F.col("fetch_offset") == F.col("log_end_offset")) & (F.col("log_end_offset") == F.col("leader_leo")) \
        & (F.col("high_watermark") == F.col("log_end_offset"))
    state_before = state.select(*REPLICA_KEY, F.col("log_end_offset").alias("_leo0"),
                                F.col("fetch_offset").alias("_fo0"), F.col("high_watermark").alias("_hw0"))
    moved = (F.col("_leo0") != F.col("log_end_offset")) | (F.col("_fo0") != F.col("fetch_offset")) \
        | (F.col("_hw0") != F.col("high_watermark"))
    followers_vs_before = followers_after.join(state_before, on=REPLICA_KEY, how="left")
    follower_rows_out = followers_vs_before.filter(moved | ~quiescent_after)
    state_out = (
        leader_rows_out.select(*state_cols[:-1]).unionByName(follower_rows_out.select(*state_cols[:-1]))
        .withColumn("round_id", F.lit(round_id).cast("long"))
    ).localCheckpoint()
    if state_out.limit(1).count() > 0:
        storage.upsert(state_out, "replica_state", REPLICA_KEY, round_id)
    if results.limit(1).count() > 0:
        storage.append_table(results, "results", round_id)

    # -- 7. metrics -------------------------------------------------------------------------
    health = partitions_now.agg(
        F.sum((F.size("isr") < F.size("replicas")).cast("long")).alias("under_replicated_partitions"),
        F.sum((F.size("isr") < F.col("min_isr")).cast("long")).alias("under_min_isr_partitions"),
        F.sum((F.size("isr") == F.col("min_isr")).cast("long")).alias("at_min_isr_partitions"),
        F.sum((F.col("leader") == NO_LEADER).cast("long")).alias("offline_partitions"),
    ).first()
    lag = followers_after.unionByName(followers.filter(~F.col("fetched")), allowMissingColumns=True).agg(
        F.max(F.col("leader_leo") - F.col("log_end_offset")).alias("max_lag")).first()
    changes_n = isr_changed.agg(F.sum("isr_shrinks").alias("s"), F.sum("isr_expands").alias("e")).first()
    responded = followers_vs_before.filter((F.col("records_received") > 0) | (F.col("_hw0") != F.col("high_watermark")))
    counts = {
        "fetch_request_partitions": fetching.select(*PARTITION_KEY).distinct().count(),
        "fetch_response_partitions": responded.select(*PARTITION_KEY).distinct().count(),
        "records_appended": appended.count(),
        "records_replicated": response.count(),
    }
    result_counts = results.groupBy("status").count().collect()
    by_status = {r["status"]: r["count"] for r in result_counts}
    report = RoundReport(
        round_id=round_id, now_ms=now, inbox_version=max(inbox_version, inputs.last_inbox_version),
        **counts,
        requests_acked=by_status.get(acks_rules.STATUS_ACKED, 0),
        requests_failed=by_status.get(acks_rules.STATUS_ERROR, 0),
        isr_shrinks=int(changes_n["s"] or 0), isr_expands=int(changes_n["e"] or 0),
        under_replicated_partitions=int(health["under_replicated_partitions"] or 0),
        under_min_isr_partitions=int(health["under_min_isr_partitions"] or 0),
        at_min_isr_partitions=int(health["at_min_isr_partitions"] or 0),
        offline_partitions=int(health["offline_partitions"] or 0),
        max_lag=int(lag["max_lag"] or 0),
        duration_ms=int((time.perf_counter() - started) * 1000),
    )
    storage.append_table(spark.createDataFrame([tuple(report.as_dict().values())], ROUNDS_SCHEMA), "rounds", round_id)
    return report

