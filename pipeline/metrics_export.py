"""Kafka's replica-manager, fetcher, fetch-session, partition and log metrics in the Prometheus
text format, read from the cluster's tables when Prometheus scrapes (not in the round).

    server = serve_metrics(cluster, port=9404)     # http://127.0.0.1:9404/metrics
    server.shutdown()

Names follow the Prometheus JMX exporter's spelling of Kafka's MBeans (`kafka_<domain>_<type>_
<name>`, lower case), with Kafka's labels: a broker's gauges by `broker` (Kafka's per-broker
MBeans: ReplicaManager, ReplicaFetcherManager, FetchSessionCache), a partition's by `topic` and
`partition` (kafka.cluster:type=Partition, kafka.log:type=Log). The controller's offline count
and the meters the round counts cluster-wide (ISR shrinks and expands) carry no broker label.
`replog_round_*` are the newest round's own figures.

A partition's gauges are counted where Kafka counts them: on its leader (a partition without a
leader counts in the controller's OfflinePartitionsCount only). The health rules are those of
control/partition_health.py, so a scrape agrees with `replog topics` and the round's gauges."""

from __future__ import annotations

import threading
from typing import Any, Iterator

from pipeline.control.partition_health import SQL

__all__ = ["ReplogCollector", "serve_metrics", "MetricsServer"]

_RM = "kafka_server_replicamanager_"
_BROKER_GAUGES = [  # (metric, the column of the per-leader aggregate, help)
    (_RM + "partitioncount", "partitions", "replicas this broker hosts (Kafka's PartitionCount)"),
    (_RM + "leadercount", "leaders", "partitions this broker leads (LeaderCount)"),
    (_RM + "underreplicatedpartitions", "under_replicated",
     "partitions this broker leads whose ISR is smaller than the replication factor (UnderReplicatedPartitions)"),
    (_RM + "underminisrpartitioncount", "under_min_isr",
     "partitions this broker leads whose ISR is under the effective min ISR (UnderMinIsrPartitionCount)"),
    (_RM + "atminisrpartitioncount", "at_min_isr",
     "partitions this broker leads whose ISR is the effective min ISR (AtMinIsrPartitionCount)"),
]
_PARTITION_GAUGES = [  # (metric, column, help)
    ("kafka_cluster_partition_underreplicated", "under_replicated", "1 when the partition is under-replicated"),
    ("kafka_cluster_partition_underminisr", "under_min_isr", "1 when the ISR is under the effective min ISR"),
    ("kafka_cluster_partition_atminisr", "at_min_isr", "1 when the ISR is the effective min ISR"),
    ("kafka_cluster_partition_replicascount", "replicas_count", "the partition's replicas"),
    ("kafka_cluster_partition_insyncreplicascount", "isr_count", "the partition's in-sync replicas"),
    ("kafka_log_log_logendoffset", "log_end_offset", "the leader's log end offset"),
    ("kafka_log_log_logstartoffset", "log_start_offset", "the leader's log start offset"),
    ("replog_partition_high_watermark", "high_watermark", "the partition's high watermark (committed below it)"),
    ("replog_partition_leader", "leader", "the partition's leader broker (-1: offline)"),
]
_ROUND_FIGURES = [  # (metric, rounds column, help)
    ("replog_round_id", "round_id", "the newest round"),
    ("replog_round_now_ms", "now_ms", "the cluster clock at the newest round"),
    ("replog_round_duration_ms", "duration_ms", "the newest round's duration"),
    ("replog_round_records_appended", "records_appended", "records the newest round appended on leaders"),
    ("replog_round_records_replicated", "records_replicated", "records the newest round copied to followers"),
    ("replog_round_hw_advances", "hw_advances", "partitions whose high watermark the newest round moved up"),
    ("replog_round_pending_requests", "pending_requests", "produce requests waiting for acks after the newest round"),
    ("replog_round_active_partitions", "active_partitions", "partitions not yet settled after the newest round"),
]
# cluster-wide figures of replog.metrics (the newest round), by Kafka's MBean
_CLUSTER_METRICS = {
    "OfflinePartitionsCount": ("kafka_controller_kafkacontroller_offlinepartitionscount",
                               "partitions without a leader"),
    "IsrShrinksPerSec": (_RM + "isrshrinkspersec", "ISR shrinks per second over the last minute of cluster time"),
    "IsrExpandsPerSec": (_RM + "isrexpandspersec", "ISR expansions per second over the last minute of cluster time"),
    "IncrementalFetchSessionEvictionsPerSec": ("kafka_server_fetchsessioncache_incrementalfetchsessionevictionspersec",
                                               "fetch sessions evicted per second over the last minute"),
}


class ReplogCollector:
    """A prometheus_client collector: each `collect()` reads the cluster's views once (a handful
    of small Spark jobs; the partition gauges are one row per partition)."""

    def __init__(self, cluster: Any):
        self.cluster = cluster
        self.lock = threading.Lock()  # one scrape at a time: a second waits for the first's reads

    def collect(self) -> Iterator[Any]:
        with self.lock:
            yield from self._families()

    def _families(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily
        described = self.cluster.describe().selectExpr(
            "topic", "partition", "leader", "replicas", "isr", "high_watermark", "log_end_offset", "log_start_offset",
            f"CAST({SQL['under_replicated']} AS INT) AS under_replicated",
            f"CAST({SQL['under_min_isr']} AS INT) AS under_min_isr",
            f"CAST({SQL['at_min_isr']} AS INT) AS at_min_isr",
            "size(replicas) AS replicas_count", "size(isr) AS isr_count")
        rows = described.collect()  # one row per partition, at scrape time (off the round path)
        counts = ("partitions", "leaders", "under_replicated", "under_min_isr", "at_min_isr")
        per_broker = {r["broker"]: dict.fromkeys(counts, 0)  # O(brokers)
                      for r in self.cluster.broker_states().select("broker").collect()}
        for r in rows:
            for b in r["replicas"]:
                per_broker.setdefault(b, dict.fromkeys(counts, 0))["partitions"] += 1
            if r["leader"] in per_broker:
                lead = per_broker[r["leader"]]
                lead["leaders"] += 1
                for column in ("under_replicated", "under_min_isr", "at_min_isr"):
                    lead[column] += r[column]
        for metric, column, text in _BROKER_GAUGES:
            family = GaugeMetricFamily(metric, text, labels=["broker"])
            for b in sorted(per_broker):
                family.add_metric([str(b)], per_broker[b][column])
            yield family
        yield from self._fetcher_families(sorted(per_broker))
        for metric, column, text in _PARTITION_GAUGES:
            family = GaugeMetricFamily(metric, text, labels=["topic", "partition"])
            for r in rows:
                family.add_metric([r["topic"], str(r["partition"])], r[column])
            yield family
        yield from self._round_families()

    def _fetcher_families(self, brokers: list[int]) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily
        lag = {r["broker"]: r["max_lag"] for r in self.cluster.replicas().filter("NOT is_leader")
               .groupBy("broker").agg({"lag": "max"}).withColumnRenamed("max(lag)", "max_lag").collect()}
        family = GaugeMetricFamily("kafka_server_replicafetchermanager_maxlag",
                                   "the largest lag, in records, of this broker's follower replicas (MaxLag)",
                                   labels=["broker"])
        for b in brokers:
            family.add_metric([str(b)], lag.get(b) or 0)
        yield family
        sessions = {r["leader"]: (r["sessions"], r["partitions"]) for r in self.cluster.fetch_sessions()
                    .groupBy("leader").agg({"session_id": "count", "partitions": "sum"})
                    .toDF("leader", "sessions", "partitions").collect()}
        for metric, index, text in (
                ("kafka_server_fetchsessioncache_numincrementalfetchsessions", 0,
                 "incremental fetch sessions in this leader's cache"),
                ("kafka_server_fetchsessioncache_numincrementalfetchpartitionscached", 1,
                 "partitions cached by this leader's fetch sessions")):
            family = GaugeMetricFamily(metric, text, labels=["broker"])
            for b in brokers:
                family.add_metric([str(b)], (sessions.get(b) or (0, 0))[index] or 0)
            yield family

    def _round_families(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily
        newest = self.cluster.storage.read("rounds").orderBy("round_id", ascending=False).limit(1).collect()
        for metric, column, text in _ROUND_FIGURES:
            family = GaugeMetricFamily(metric, text)
            if newest and newest[0][column] is not None:
                family.add_metric([], newest[0][column])
            yield family
        values = {r["name"]: r["value"] for r in self.cluster.metrics().collect()}  # O(metric names)
        for name, (metric, text) in _CLUSTER_METRICS.items():
            family = GaugeMetricFamily(metric, text)
            if values.get(name) is not None:
                family.add_metric([], values[name])
            yield family


class MetricsServer:
    """The HTTP server `serve_metrics` started, on a daemon thread."""

    def __init__(self, server: Any, thread: threading.Thread):
        self.server, self.thread = server, thread
        self.port = server.server_address[1]

    def shutdown(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(cluster: Any, port: int = 9404, addr: str = "127.0.0.1") -> MetricsServer:
    """Serves `/metrics` (Prometheus text format) for `cluster` on `addr:port` (0: any free port)."""
    from prometheus_client import CollectorRegistry, start_http_server
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReplogCollector(cluster))
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server, thread)
