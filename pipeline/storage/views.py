"""The Spark SQL surface: the same SELECTs back `describe()`, `replicas()` and the `replog.*` views."""

from __future__ import annotations

from pyspark.sql import SparkSession

from pipeline.control.topic_config import effective_setting_sql
from pipeline.storage.locations import log_problem
from pipeline.control.replication import RECORD_OVERHEAD_BYTES
from pipeline.schemas import BROKER_GAUGES, REPLICA_KEY
from pipeline.storage import Storage, current_rows_sql

__all__ = ["partitions_sql", "replicas_sql", "results_sql", "logs_sql", "committed_sql", "metrics_sql",
           "metrics_history_sql",
           "lagging_replicas_sql", "fetch_sessions_sql", "consumer_lag_sql", "brokers_sql", "reassignments_sql",
           "register_views", "DATABASE", "RATE_WINDOW_MS"]

DATABASE = "replog"
# Kafka's *PerSec meters report a one-minute rate; here: events per second over the trailing minute
# of the cluster clock.
RATE_WINDOW_MS = 60_000


def _t(storage: Storage, table: str) -> str:
    if table == "replica_state":  # append-only: each replica's newest row (Storage.replica_state)
        return current_rows_sql(f"delta.`{storage.path(table)}`", REPLICA_KEY)
    return f"delta.`{storage.path(table)}`"


def partitions_sql(storage: Storage, min_isr_default: int) -> str:
    return f"""
SELECT p.topic, p.partition, p.leader, p.leader_epoch, p.partition_epoch, p.replicas, p.isr,
       s.high_watermark, s.log_end_offset, s.log_start_offset,
       coalesce(p.adding_replicas, array()) AS adding_replicas,
       coalesce(p.removing_replicas, array()) AS removing_replicas,
       CAST({effective_setting_sql("min.insync.replicas", min_isr_default, "t.config")} AS INT) AS min_isr
FROM {_t(storage, 'partitions')} p
JOIN {_t(storage, 'topics')} t ON t.topic = p.topic
LEFT JOIN {_t(storage, 'replica_state')} s
  ON s.topic = p.topic AND s.partition = p.partition AND s.broker = p.leader"""


def replicas_sql(storage: Storage) -> str:
    return f"""
SELECT s.topic, s.partition, s.broker, s.broker = p.leader AS is_leader,
       array_contains(p.isr, s.broker) AS in_isr, s.log_end_offset, s.high_watermark,
       l.log_end_offset - s.log_end_offset AS lag, s.last_caught_up_time_ms
FROM {_t(storage, 'replica_state')} s
JOIN {_t(storage, 'partitions')} p ON p.topic = s.topic AND p.partition = s.partition
LEFT JOIN {_t(storage, 'replica_state')} l
  ON l.topic = s.topic AND l.partition = s.partition AND l.broker = p.leader"""


def results_sql(storage: Storage) -> str:
    return f"""
SELECT request_id, topic, partition, base_offset, last_offset, acks, status, error_code,
       CASE WHEN status = 'throttled' THEN NULL ELSE coalesce(throttle_time_ms, 0) END AS throttle_time_ms
FROM (SELECT *, row_number() OVER (PARTITION BY request_id, topic, partition ORDER BY round_id DESC) AS _n
      FROM {_t(storage, 'results')}) WHERE _n = 1"""


def logs_sql(storage: Storage, brokers: list[int]) -> str:
    """Every broker's log, with the hosting broker as a column."""
    return "\nUNION ALL\n".join(
        f"SELECT {b} AS broker, * FROM delta.`{storage.log_path(b)}`" for b in brokers)


def committed_sql(storage: Storage, brokers: list[int]) -> str:
    """Records below each partition's high watermark, served from its leader."""
    return f"""
SELECT l.topic, l.partition, l.offset, l.leader_epoch, l.timestamp, l.key, l.value
FROM ({logs_sql(storage, brokers)}) l
JOIN {_t(storage, 'partitions')} p ON p.topic = l.topic AND p.partition = l.partition AND p.leader = l.broker
JOIN {_t(storage, 'replica_state')} s
  ON s.topic = l.topic AND s.partition = l.partition AND s.broker = l.broker
WHERE l.offset >= s.log_start_offset AND l.offset < s.high_watermark"""


_ROUND_GAUGES = [("UnderReplicatedPartitions", "under_replicated_partitions"),
                 ("UnderMinIsrPartitionCount", "under_min_isr_partitions"),
                 ("AtMinIsrPartitionCount", "at_min_isr_partitions"),
                 ("OfflinePartitionsCount", "offline_partitions"),
                 ("MaxLag", "max_lag"),
                 ("IsrShrinksPerSec", "shrinks_per_sec"),
                 ("IsrExpandsPerSec", "expands_per_sec"),
                 ("NumIncrementalFetchSessions", "incremental_fetch_sessions"),
                 ("NumIncrementalFetchPartitionsCached", "incremental_fetch_partitions_cached"),
                 ("IncrementalFetchSessionEvictionsPerSec", "evictions_per_sec")]


def metrics_sql(storage: Storage) -> str:
    """Kafka's replica-manager metrics, by their names, as of the newest round, and the log
    cleaner's as of its newest pass (Cluster.metrics(); the view replog.metrics keeps every
    round's: metrics_history_sql)."""
    rounds = _t(storage, "rounds")
    gauges = ", ".join(f"'{name}', CAST({col} AS DOUBLE)" for name, col in [
        *_ROUND_GAUGES,
        # the log cleaner's (Kafka's LogCleaner and LogCleanerManager gauges), from its newest pass
        ("uncleanable-partitions-count", "coalesce(cleaner.uncleanable_partitions, 0)"),
        ("max-clean-time-secs", "coalesce(cleaner.clean_time_ms, 0) / 1000.0"),
        ("max-compaction-delay-secs", "coalesce(cleaner.max_compaction_delay_ms, 0) / 1000"),
        ("max-dirty-percent", "coalesce(cleaner.max_dirty_percent, 0)"),
    ])
    return f"""
WITH last AS (SELECT * FROM {rounds} ORDER BY round_id DESC LIMIT 1),
     recent AS (SELECT CAST(coalesce(sum(r.isr_shrinks), 0) AS DOUBLE) / {RATE_WINDOW_MS // 1000} AS shrinks_per_sec,
                       CAST(coalesce(sum(r.isr_expands), 0) AS DOUBLE) / {RATE_WINDOW_MS // 1000} AS expands_per_sec,
                       CAST(coalesce(sum(r.fetch_session_evictions), 0) AS DOUBLE) / {RATE_WINDOW_MS // 1000}
                         AS evictions_per_sec
                FROM {rounds} r CROSS JOIN last WHERE r.now_ms > last.now_ms - {RATE_WINDOW_MS})
SELECT stack(14, {gauges}) AS (name, value), last.round_id, last.now_ms
FROM last CROSS JOIN recent
LEFT JOIN (SELECT * FROM {_t(storage, 'cleaner_runs')} ORDER BY run_id DESC LIMIT 1) cleaner ON true"""


def metrics_history_sql(storage: Storage) -> str:
    """`replog.metrics`: the metrics of every round, not only the newest (name, value, broker,
    round_id, now_ms). Cluster-wide figures have no broker (the *PerSec rates over the minute of
    cluster time up to each round, as metrics_sql); the fetch session caches' figures come once
    per leader broker too (NumIncrementalFetchSessions and NumIncrementalFetchPartitionsCached
    are per-broker gauges in Kafka), from the caches each round recorded; and each broker's
    replica-manager gauges as the round left them (PartitionCount, LeaderCount,
    UnderReplicatedPartitions, UnderMinIsrPartitionCount, AtMinIsrPartitionCount, and the fetcher
    manager's MaxLag: pipeline/round/figures.py), from rounds that kept them."""
    rounds = _t(storage, "rounds")
    window = f"(ORDER BY now_ms RANGE BETWEEN {RATE_WINDOW_MS - 1} PRECEDING AND CURRENT ROW)"
    gauges = ", ".join(f"'{name}', CAST({col} AS DOUBLE)" for name, col in _ROUND_GAUGES)
    return f"""
WITH r AS (SELECT *, CAST(sum(isr_shrinks) OVER {window} AS DOUBLE) / {RATE_WINDOW_MS // 1000} AS shrinks_per_sec,
                     CAST(sum(isr_expands) OVER {window} AS DOUBLE) / {RATE_WINDOW_MS // 1000} AS expands_per_sec,
                     CAST(sum(fetch_session_evictions) OVER {window} AS DOUBLE) / {RATE_WINDOW_MS // 1000}
                       AS evictions_per_sec
           FROM {rounds})
SELECT name, value, CAST(NULL AS INT) AS broker, round_id, now_ms
FROM (SELECT stack({len(_ROUND_GAUGES)}, {gauges}) AS (name, value), round_id, now_ms FROM r)
UNION ALL
SELECT name, value, broker, round_id, now_ms
FROM (SELECT stack(2, 'NumIncrementalFetchSessions', CAST(count(*) AS DOUBLE),
                      'NumIncrementalFetchPartitionsCached', CAST(sum(s.size) AS DOUBLE)) AS (name, value),
             s.leader AS broker, round_id, now_ms
      FROM (SELECT round_id, now_ms, from_json(fetch_sessions, '{_SESSIONS_JSON}') AS j FROM {rounds})
      LATERAL VIEW explode(j.sessions) x AS s
      GROUP BY s.leader, round_id, now_ms)
UNION ALL
SELECT name, value, g.broker, round_id, now_ms
FROM (SELECT round_id, now_ms, from_json(broker_gauges, '{_BROKER_GAUGES_JSON}') AS gauges FROM {rounds})
LATERAL VIEW explode(gauges) x AS g
LATERAL VIEW stack({len(BROKER_GAUGES)}, {", ".join(f"'{n}', CAST(g.{n} AS DOUBLE)" for n in BROKER_GAUGES)}) y
  AS name, value"""


_BROKER_GAUGES_JSON = f"array<struct<broker: int, {', '.join(f'{n}: bigint' for n in BROKER_GAUGES)}>>"

_SESSIONS_JSON = ("struct<sessions: array<struct<leader: int, fetcher: string, privileged: boolean, session_id: int, "
                  "epoch: int, created_ms: bigint, last_used_ms: bigint, size: int>>, "
                  "handles: array<struct<fetcher: string, leader: int, session_id: int, epoch: int>>>")


def fetch_sessions_sql(storage: Storage) -> str:
    """Every leader's KIP-227 session cache as of the newest round: one row per session, with the
    epoch the leader expects next and the partitions it caches."""
    return f"""
SELECT s.leader, s.fetcher, s.privileged, s.session_id, s.epoch, s.created_ms, s.last_used_ms,
       s.size AS partitions, last.round_id
FROM (SELECT round_id, from_json(fetch_sessions, '{_SESSIONS_JSON}') AS j
      FROM {_t(storage, 'rounds')} ORDER BY round_id DESC LIMIT 1) last
LATERAL VIEW explode(last.j.sessions) x AS s"""


def consumer_lag_sql(storage: Storage) -> str:
    """kafka-consumer-groups --describe's columns for every committed partition: the group's
    offset, the partition's high watermark on its leader (what ListOffsets LATEST answers a
    consumer) and the difference."""
    return f"""
SELECT g.group_id, g.topic, g.partition, g.committed_offset AS current_offset,
       s.high_watermark AS log_end_offset, greatest(s.high_watermark - g.committed_offset, 0) AS lag
FROM {_t(storage, 'group_offsets')} g
JOIN {_t(storage, 'partitions')} p ON p.topic = g.topic AND p.partition = g.partition
LEFT JOIN {_t(storage, 'replica_state')} s
  ON s.topic = p.topic AND s.partition = p.partition AND s.broker = p.leader"""


def lagging_replicas_sql(storage: Storage) -> str:
    """Followers by how far they lag: records behind the leader's LEO, and ms since last caught up
    (by the cluster clock of the newest round)."""
    return f"""
SELECT r.topic, r.partition, r.broker, r.in_isr, r.lag AS lag_records,
       CASE WHEN r.lag = 0 THEN 0 ELSE last.now_ms - r.last_caught_up_time_ms END AS lag_ms
FROM ({replicas_sql(storage)}) r
CROSS JOIN (SELECT max(now_ms) AS now_ms FROM {_t(storage, 'rounds')}) last
WHERE NOT r.is_leader
ORDER BY lag_records DESC, lag_ms DESC, r.topic, r.partition, r.broker"""


def brokers_sql(storage: Storage) -> str:
    """Each broker's process state and storage location; a running broker heartbeats at every round."""
    return f"""
SELECT b.broker, coalesce(b.state, 'running') AS state,
       CASE WHEN coalesce(b.state, 'running') = 'running' THEN greatest(b.last_heartbeat_ms, r.now_ms)
            ELSE b.last_heartbeat_ms END AS last_heartbeat_ms,
       b.fetcher_paused, coalesce(b.log_lost, false) AS log_lost,
       coalesce(b.decommissioned, false) AS decommissioned,
       CASE WHEN b.path RLIKE '^(/|[A-Za-z][A-Za-z0-9+.-]+:/)' THEN b.path
            ELSE concat('{storage.join("")}', b.path) END AS location,
       b.log_dir_failure
FROM {_t(storage, 'brokers')} b
CROSS JOIN (SELECT max(now_ms) AS now_ms FROM {_t(storage, 'rounds')}) r"""


def reassignments_sql(storage: Storage, brokers: list[int]) -> str:
    """Partitions with a reassignment in progress: the replicas, the ISR, the replicas being added
    and removed, and what the adding replicas still have to fetch from the leader (records, and
    bytes as the fetch limits count them)."""
    return f"""
WITH p AS (SELECT * FROM {_t(storage, 'partitions')}
           WHERE size(coalesce(adding_replicas, array())) > 0 OR size(coalesce(removing_replicas, array())) > 0),
     s AS (SELECT * FROM {_t(storage, 'replica_state')}),
     behind AS (SELECT a.topic, a.partition, a.leader, a.broker, coalesce(f.log_end_offset, 0) AS leo,
                       l.log_end_offset AS leader_leo
                FROM (SELECT topic, partition, leader, explode(adding_replicas) AS broker FROM p) a
                LEFT JOIN s f ON f.topic = a.topic AND f.partition = a.partition AND f.broker = a.broker
                LEFT JOIN s l ON l.topic = a.topic AND l.partition = a.partition AND l.broker = a.leader),
     bytes AS (SELECT b.topic, b.partition,
                      sum(coalesce(octet_length(g.key), 0) + coalesce(octet_length(g.value), 0) + {RECORD_OVERHEAD_BYTES})
                        AS bytes_left
               FROM behind b JOIN ({logs_sql(storage, brokers)}) g
                 ON g.topic = b.topic AND g.partition = b.partition AND g.broker = b.leader
                AND g.offset >= b.leo AND g.offset < b.leader_leo
               GROUP BY b.topic, b.partition),
     records AS (SELECT topic, partition, sum(greatest(leader_leo - leo, 0)) AS records_left
                 FROM behind GROUP BY topic, partition)
SELECT p.topic, p.partition, p.replicas, p.isr, coalesce(p.adding_replicas, array()) AS adding,
       coalesce(p.removing_replicas, array()) AS removing, CAST(coalesce(r.records_left, 0) AS BIGINT) AS records_left,
       CAST(coalesce(y.bytes_left, 0) AS BIGINT) AS bytes_left
FROM p LEFT JOIN records r ON r.topic = p.topic AND r.partition = p.partition
LEFT JOIN bytes y ON y.topic = p.topic AND y.partition = p.partition"""


def register_views(spark: SparkSession, storage: Storage, brokers: list[int], min_isr_default: int) -> None:
    """`replog.partitions`, `replog.replicas`, `replog.rounds`, `replog.produce_results`,
    `replog.committed`, `replog.metrics`, `replog.lagging_replicas`, `replog.fetch_sessions`,
    `replog.consumer_lag`, `replog.brokers`, `replog.elections`, `replog.reassignments`,
    `replog.client_quotas` in the session catalog,
    pointing at this cluster's tables."""
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    # the logs that are sound: a view over a broker's failed location could not be read
    brokers = [b for b in brokers if log_problem(storage, b) is None]
    views = {
        "partitions": partitions_sql(storage, min_isr_default),
        "replicas": replicas_sql(storage),
        "rounds": f"SELECT * FROM {_t(storage, 'rounds')}",
        "produce_results": results_sql(storage),
        "committed": committed_sql(storage, brokers),
        "metrics": metrics_history_sql(storage),
        "lagging_replicas": lagging_replicas_sql(storage),
        "fetch_sessions": fetch_sessions_sql(storage),
        "consumer_lag": consumer_lag_sql(storage),
        "brokers": brokers_sql(storage),
        "elections": f"SELECT * FROM {_t(storage, 'elections')}",
        "reassignments": reassignments_sql(storage, brokers),
        # kafka-configs --describe --entity-type users|clients: '<default>' is the default entity
        "client_quotas": f"SELECT user, client_id, producer_byte_rate, consumer_byte_rate, updated_ms "
                         f"FROM {_t(storage, 'client_quotas')}",
    }
    for name, sql in views.items():
        spark.sql(f"CREATE OR REPLACE VIEW {DATABASE}.{name} AS {sql}")
