"""The Spark SQL surface: the same SELECTs back `describe()`, `replicas()` and the `replog.*` views."""

from __future__ import annotations

from pyspark.sql import SparkSession

from pipeline.storage import Storage

__all__ = ["partitions_sql", "replicas_sql", "results_sql", "logs_sql", "committed_sql", "register_views", "DATABASE"]

DATABASE = "replog"


def _t(storage: Storage, table: str) -> str:
    return f"delta.`{storage.path(table)}`"


def partitions_sql(storage: Storage, min_isr_default: int) -> str:
    return f"""
SELECT p.topic, p.partition, p.leader, p.leader_epoch, p.partition_epoch, p.replicas, p.isr,
       s.high_watermark, s.log_end_offset, s.log_start_offset,
       CAST(coalesce(get_json_object(t.config, "$['min.insync.replicas']"), '{min_isr_default}') AS INT) AS min_isr
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
SELECT request_id, topic, partition, base_offset, last_offset, acks, status, error_code
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


def register_views(spark: SparkSession, storage: Storage, brokers: list[int], min_isr_default: int) -> None:
    """`replog.partitions`, `replog.replicas`, `replog.rounds`, `replog.produce_results`,
    `replog.committed` in the session catalog, pointing at this cluster's tables."""
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    views = {
        "partitions": partitions_sql(storage, min_isr_default),
        "replicas": replicas_sql(storage),
        "rounds": f"SELECT * FROM {_t(storage, 'rounds')}",
        "produce_results": results_sql(storage),
        "committed": committed_sql(storage, brokers),
    }
    for name, sql in views.items():
        spark.sql(f"CREATE OR REPLACE VIEW {DATABASE}.{name} AS {sql}")
