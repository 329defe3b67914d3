"""The round's reads of the tables: partitions with their topic's effective config, the replicas
with their leader's log offsets (the controller's wave), the new inbox rows, the log start
requests (delete_records and retention), and the requests a round left waiting (acks=all
requests pending the HW, produce requests waiting for their client's quota)."""

from __future__ import annotations

from functools import reduce
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipeline.control import acks as acks_rules
from pipeline.control import session_cache as sessions
from pipeline.control import log_start
from pipeline.control.topic_config import effective_setting_sql
from pipeline.round.inputs import REQUEST_KEY, RoundInputs
from pipeline.schemas import NO_LEADER, PARTITION_KEY
from pipeline.storage import Storage, current_rows


def partition_meta(storage: Storage, config: dict[str, Any]) -> DataFrame:
    """Partitions with each topic's effective config (overrides over the cluster's)."""
    def setting(key: str, cast: str) -> Any:
        return F.expr(effective_setting_sql(key, config[key])).cast(cast)

    policy = F.split(setting("cleanup.policy", "string"), ",")
    deletes, compact = F.array_contains(policy, "delete"), F.array_contains(policy, "compact")
    topics = storage.read("topics").select(
        "topic",
        setting("min.insync.replicas", "int").alias("min_isr"),
        setting("replica.lag.time.max.ms", "long").alias("lag_time_max_ms"),
        setting("message.max.bytes", "long").alias("message_max_bytes"),
        # retention applies under cleanup.policy delete (or compact,delete) only
        F.when(deletes, setting("retention.ms", "long")).otherwise(F.lit(-1).cast("long")).alias("retention_ms"),
        F.when(deletes, setting("retention.bytes", "long")).otherwise(F.lit(-1).cast("long")).alias("retention_bytes"),
        setting("unclean.leader.election.enable", "boolean").alias("unclean"),
        compact.alias("compact"),
        setting("leader.replication.throttled.replicas", "string").alias("leader_throttled_replicas"),
        setting("follower.replication.throttled.replicas", "string").alias("follower_throttled_replicas"),
    )
    none = F.array().cast("array<int>")
    return (storage.read("partitions").join(topics, on="topic", how="inner").drop("round_id")
            .withColumn("adding_replicas", F.coalesce(F.col("adding_replicas"), none))
            .withColumn("removing_replicas", F.coalesce(F.col("removing_replicas"), none)))

def _by_key(keys: list[Any], pairs: dict[Any, Any], cast: str) -> Any:
    """A column that maps the value of `keys` (columns) to `pairs`' value (null for others): the
    round's O(brokers) settings as expressions, not as a table to join."""
    match = [(reduce(lambda a, b: a & b, [F.col(k) == v for k, v in zip(keys, key if isinstance(key, tuple)
                                                                           else (key,))]), value)
             for key, value in pairs.items()]
    if not match:
        return F.lit(None).cast(cast)
    column = F.when(match[0][0], F.lit(match[0][1]))
    for condition, value in match[1:]:
        column = column.when(condition, F.lit(value))
    return column.cast(cast)

def fetch_pair_counts(partitions: DataFrame) -> DataFrame:
    """follower, leader, count: how many partitions each follower fetches from each leader (the
    fetch requests of a round: O(brokers^2) rows)."""
    return (partitions.filter(F.col("leader") != NO_LEADER)
            .select("leader", F.explode("replicas").alias("follower"))
            .filter(F.col("follower") != F.col("leader")).groupBy("follower", "leader").count())


def fetch_pairs(partitions: DataFrame) -> dict[tuple[int, int], int]:
    """fetch_pair_counts as (follower, leader) -> partitions, on the driver."""
    return {(r["follower"], r["leader"]): r["count"] for r in fetch_pair_counts(partitions).collect()}


def _fetch_pair(context: Any) -> tuple[int, int]:
    """(follower broker, leader broker) of a replica fetcher's fetch context."""
    return int(context.fetcher[len(sessions.REPLICA_FETCHER_PREFIX):]), context.leader

def with_fetcher_state(replicas: DataFrame, inputs: RoundInputs) -> DataFrame:
    """Each replica row with what the controller's epoch checks ask of its broker's fetcher this
    round: is_paused, and the context its leader made of its fetch request (fetch_kind). (The
    round's fetch limits, last fetches and KIP-73 throttles are its RoundContext's.)"""
    contexts = {_fetch_pair(c): c for c in inputs.contexts}
    return replicas.withColumns({
        "is_paused": F.coalesce(F.col("broker").isin(*inputs.paused_brokers), F.lit(False)),
        "fetch_kind": _by_key(["broker", "leader"], {k: c.kind for k, c in contexts.items()}, "string"),
    })

def serving(meta: DataFrame, inputs: RoundInputs) -> DataFrame:
    """The metadata the round serves requests by: a leader that is down (stopped, not yet fenced)
    appends nothing, answers no fetch and moves no HW or ISR: its partitions count as leaderless
    for the round (NOT_LEADER_OR_FOLLOWER to producers) until the controller fences it."""
    down = (inputs.controller or {}).get("down") or []
    if not down:
        return meta
    return meta.withColumn("leader", F.when(F.col("leader").isin(*down), F.lit(NO_LEADER)).otherwise(F.col("leader")))

def serving_brokers(inputs: RoundInputs) -> list[int]:
    """The brokers whose logs a round may read: not the ones that are down (a stopped broker's log
    directory may be gone), which neither fetch nor lead for the round (serving)."""
    down = set((inputs.controller or {}).get("down") or [])
    return [b for b in inputs.brokers if b not in down] or list(inputs.brokers)

def read_replicas(spark: SparkSession, inputs: RoundInputs, meta: DataFrame, state: DataFrame) -> DataFrame:
    """One row per replica with its partition's metadata (as served) and its leader's offsets."""
    partition = Window.partitionBy(*PARTITION_KEY)
    leaders = {f"leader_{short}_before": F.max(F.when(F.col("is_leader"), F.col(column))).over(partition)
               for short, column in (("leo", "log_end_offset"), ("hw", "high_watermark"), ("lso", "log_start_offset"))}
    return (
        state.join(meta, on=PARTITION_KEY, how="inner")
        .filter(F.array_contains(F.col("replicas"), F.col("broker")))
        .withColumn("is_leader", F.col("broker") == F.col("leader"))
        .withColumns(leaders)
        .transform(lambda df: with_fetcher_state(df, inputs))
    ).localCheckpoint()

def read_inbox(spark: SparkSession, storage: Storage, last_version: int, version: int) -> tuple[DataFrame, int]:
    if version > last_version:
        inbox = storage.read_changes("inbox", last_version, version).drop("_change_type", "_commit_timestamp")
    else:
        inbox = storage.read("inbox").limit(0).withColumn("_commit_version", F.lit(0).cast("long"))
    return inbox, max(version, last_version)

def log_start_requests(storage: Storage, inputs: RoundInputs, leaders: DataFrame | None
                       ) -> tuple[DataFrame | None, int]:
    """`_log_start_requests` given the leaders to check for retention (None: the check is not
    due): broker, topic, partition, log_start_offset, log_end_offset, retention_ms,
    retention_bytes of each serving leader under a retention limit. Also the admin version read."""
    version = inputs.admin_to_version
    asks = []
    if version > inputs.last_admin_version:
        asks.append(storage.read_changes("admin", inputs.last_admin_version, version)
                    .filter(F.col("kind") == "delete_records")
                    .select(*PARTITION_KEY, F.col("offset").alias("requested_lso")))
    if leaders is not None:
        logs = [storage.read_log(b).withColumn("broker", F.lit(b)) for b in serving_brokers(inputs)]
        leader_logs = (reduce(DataFrame.unionByName, logs).join(leaders, on=["broker", *PARTITION_KEY])
                       .filter((F.col("offset") >= F.col("log_start_offset")) & (F.col("offset") < F.col("log_end_offset"))))
        asks.append(log_start.retention_log_start_offsets(leader_logs, inputs.now_ms)
                    .join(leaders.select(*PARTITION_KEY, "log_start_offset"), on=PARTITION_KEY, how="inner")
                    .filter(F.col("retention_start_offset") > F.col("log_start_offset"))
                    .select(*PARTITION_KEY, F.col("retention_start_offset").alias("requested_lso")))
    if not asks:
        return None, max(version, inputs.last_admin_version)
    requests = (reduce(DataFrame.unionByName, asks).groupBy(*PARTITION_KEY)
                .agg(F.max("requested_lso").alias("requested_lso"))).localCheckpoint()
    return requests, max(version, inputs.last_admin_version)

def pending_results(storage: Storage, last_pending: int | None) -> DataFrame:
    """Requests still waiting for their acks (the newest result row of each is pending); none to
    read when the last round left none pending."""
    results = storage.read("results")
    if last_pending == 0:
        results = results.limit(0)
    return current_rows(results, REQUEST_KEY).filter(F.col("status") == acks_rules.STATUS_PENDING).drop("round_id")
