"""Client quotas in the round (KIP-13's producer_byte_rate, pipeline/control/quotas.py's rules): which of
the round's produce requests its clients' quotas let through, which wait in the inbox, and the
throttle time a served request answers with."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipeline.control import quotas
from pipeline.control import replication as rules
from pipeline.round.carry import pinned_without_history
from pipeline.round.inputs import REQUEST_KEY, RoundInputs
from pipeline.storage import Storage, current_rows

STATUS_THROTTLED = "throttled"  # a produce request waiting in the inbox for its client's quota

_SENSOR_SCHEMA = ("user string, client_id string, sensor_user string, sensor_client string, quota long, "
                  "window_bytes long, window_ms long, throttled boolean")

@dataclass(frozen=True)
class QuotaStep:
    """What the client quotas made of a round's produce requests (see apply_client_quotas)."""

    held: DataFrame | None = None  # request_id, throttle_time_ms: requests served after waiting
    deferred: DataFrame | None = None  # inbox rows (and _deferred_since) of requests still waiting
    waiting_results: DataFrame | None = None  # result rows of requests that started waiting
    recorded: dict = field(default_factory=dict)  # sensor key -> (bytes served, quota)
    waiting: int = 0  # requests still waiting

def apply_client_quotas(spark: SparkSession, inbox: DataFrame, deferred: DataFrame | None,
                        inputs: RoundInputs, new_rows: int | None = None) -> tuple[DataFrame, QuotaStep]:
    """The produce requests this round serves, of its new inbox rows and those that waited, under
    their clients' producer_byte_rate (quotas.admit_within_quota); nothing to do, and no Spark job,
    when nothing waits and no produce quota is configured or no request is new (new_rows: the new
    inbox rows, from their files' statistics; None: not known)."""
    if deferred is None and (inputs.quota_sensors is None or new_rows == 0):
        return inbox, QuotaStep()
    now = inputs.now_ms
    candidates = inbox.withColumn("_deferred_since", F.lit(None).cast("long"))
    if deferred is not None:
        candidates = candidates.unionByName(deferred)
    candidates = candidates.localCheckpoint()
    requests = quotas.request_bytes(candidates, rules.record_size(F.col("key"), F.col("value")))
    pairs = [(r["user"], r["client_id"]) for r in requests.select("user", "client_id").distinct().collect()]
    rows = inputs.quota_sensors(pairs) if inputs.quota_sensors is not None else []  # O(clients)
    decided = quotas.admit_within_quota(requests, spark.createDataFrame(rows, _SENSOR_SCHEMA)).localCheckpoint()
    recorded, waiting = {}, 0
    for r in decided.groupBy("sensor_user", "sensor_client", "quota", "admitted").agg(  # O(sensors)
            F.sum("bytes").alias("bytes"), F.count(F.lit(1)).alias("n")).collect():
        if not r["admitted"]:
            waiting += r["n"]
        elif r["sensor_user"] is not None:
            recorded[(r["sensor_user"], r["sensor_client"])] = (int(r["bytes"]), int(r["quota"]))
    if not waiting and deferred is None:
        return inbox, QuotaStep(recorded=recorded)
    admitted = decided.filter("admitted").select(
        "request_id", (F.lit(now) - F.col("_deferred_since")).alias("throttle_time_ms"))
    held = admitted.filter(F.col("throttle_time_ms").isNotNull()).localCheckpoint()
    served = candidates.join(admitted.select("request_id"), on="request_id", how="left_semi").drop("_deferred_since")
    if not waiting:
        return served, QuotaStep(held=held, recorded=recorded)
    left = candidates.join(decided.filter(~F.col("admitted")).select("request_id"), on="request_id", how="left_semi")
    waiting_results = (
        left.filter(F.col("_deferred_since").isNull())
        .groupBy(*REQUEST_KEY, "acks").agg(F.count(F.lit(1)).alias("record_count"))
        .select(*REQUEST_KEY, F.lit(None).cast("long").alias("base_offset"), F.lit(None).cast("long").alias("last_offset"),
                "record_count", "acks", F.lit(STATUS_THROTTLED).alias("status"),
                F.lit(None).cast("string").alias("error_code"), F.lit(inputs.round_id).cast("long").alias("round_id"),
                F.lit(None).cast("long").alias("throttle_time_ms")))
    deferred_out = left.withColumn("_deferred_since", F.coalesce("_deferred_since", F.lit(now).cast("long")))
    return served, QuotaStep(held, pinned_without_history(deferred_out), waiting_results, recorded, waiting)

def with_throttle_time(results: DataFrame, held: DataFrame | None) -> DataFrame:
    if held is None:
        return results.withColumn("throttle_time_ms", F.lit(0).cast("long"))
    return (results.join(F.broadcast(held), on="request_id", how="left")
            .withColumn("throttle_time_ms", F.coalesce("throttle_time_ms", F.lit(0)).cast("long")))


def deferred_requests(storage: Storage, last_waiting: int | None) -> DataFrame | None:
    """The inbox rows of requests still waiting for their client's quota, from the tables (a new
    process, or a dropped carry): their newest result row says throttled, and the inbox versions of
    the round that wrote it hold their rows. None when the last round left none waiting."""
    if not last_waiting:
        return None
    waiting = (current_rows(storage.read("results"), REQUEST_KEY).filter(F.col("status") == STATUS_THROTTLED)
               .select("request_id", "round_id").distinct())
    rounds = storage.read("rounds").select(
        "round_id", "now_ms", "inbox_version",
        F.coalesce(F.lag("inbox_version").over(Window.orderBy("round_id")), F.lit(0)).alias("from_version"))
    spans = waiting.join(rounds, on="round_id", how="inner").localCheckpoint()
    bounds = spans.agg(F.min("from_version").alias("lo"), F.max("inbox_version").alias("hi")).first()
    if bounds["lo"] is None:
        return None
    return (storage.read_changes("inbox", bounds["lo"], bounds["hi"]).drop("_change_type", "_commit_timestamp")
            .join(spans.select("request_id", F.col("now_ms").alias("_deferred_since")), on="request_id", how="inner")
            .localCheckpoint())
