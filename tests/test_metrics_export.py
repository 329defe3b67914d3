"""The Prometheus endpoint (pipeline/metrics_export.py), scraped over HTTP from a real cluster: a
paused follower leaves the ISR of the partition that moves on (a follower at the leader's log end
stays in sync: Kafka's Replica.isFollowerInSync), and the scrape says so broker by broker and partition by
partition, by the same rules as `replog topics` and the round's gauges."""

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from pipeline.metrics_export import serve_metrics
from tests.helpers import advance_round, advance_rounds


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_scrape_counts_each_brokers_and_partitions_health(new_cluster, clock):
    cluster = new_cluster(brokers=3)
    cluster.create_topic("orders", partitions=2, replication_factor=3, config={"min.insync.replicas": "2"})
    cluster.produce("orders", [{"value": "a", "partition": 0}, {"value": "b", "partition": 1}], acks="all")
    advance_round(cluster)
    cluster.pause_fetcher(2)
    cluster.produce("orders", [{"value": v, "partition": 0} for v in "cde"], acks="1")
    advance_rounds(cluster, n=2, step=31_000)  # past replica.lag.time.max.ms: broker 2 leaves p0's ISR

    server = serve_metrics(cluster, port=0)
    try:
        metrics = scrape(server.port)
    finally:
        server.shutdown()

    def broker(name):
        return [metrics[(f"kafka_server_{name}", (("broker", str(b)),))] for b in range(3)]

    def partition(name):
        return [metrics[(name, (("partition", str(p)), ("topic", "orders")))] for p in range(2)]

    assert broker("replicamanager_partitioncount") == [2, 2, 2]
    assert broker("replicamanager_leadercount") == [1, 1, 0]
    assert broker("replicamanager_underreplicatedpartitions") == [1, 0, 0]
    assert broker("replicamanager_atminisrpartitioncount") == [1, 0, 0]
    assert broker("replicamanager_underminisrpartitioncount") == [0, 0, 0]
    assert broker("replicafetchermanager_maxlag") == [0, 0, 3]  # broker 2 misses c, d and e of p0
    assert broker("fetchsessioncache_numincrementalfetchsessions")[2] == 0  # broker 2 leads nothing
    assert partition("kafka_cluster_partition_underreplicated") == [1, 0]
    assert partition("kafka_cluster_partition_insyncreplicascount") == [2, 3]
    assert partition("kafka_cluster_partition_replicascount") == [3, 3]
    assert partition("kafka_log_log_logendoffset") == [4, 1]
    assert partition("replog_partition_high_watermark") == [4, 1]
    assert metrics[("kafka_controller_kafkacontroller_offlinepartitionscount", ())] == 0
    assert metrics[("replog_round_id", ())] == 3
    assert metrics[("kafka_server_replicamanager_isrshrinkspersec", ())] == 1 / 60


def test_replog_metrics_keeps_every_rounds_figures_and_each_leaders_session_cache(new_cluster, spark):
    cluster = new_cluster(brokers=3)
    cluster.create_topic("orders", partitions=2, replication_factor=3)
    cluster.produce("orders", [{"value": "a", "partition": 0}], acks="all")
    advance_round(cluster)  # t = 500
    cluster.pause_fetcher(2)
    cluster.produce("orders", [{"value": "b", "partition": 0}], acks="1")
    advance_rounds(cluster, n=2, step=31_000)  # t = 31,500: broker 2 leaves p0's ISR; t = 62,500

    def history(name, broker=None):
        where = "broker IS NULL" if broker is None else f"broker = {broker}"
        return [(r["round_id"], r["value"]) for r in spark.sql(
            f"SELECT round_id, value FROM replog.metrics WHERE name = '{name}' AND {where} ORDER BY round_id").collect()]

    # the shrink at 31.5 s counts in the minute of cluster time up to each later round
    assert history("IsrShrinksPerSec") == [(1, 0.0), (2, 1 / 60), (3, 1 / 60)]
    assert history("UnderReplicatedPartitions") == [(1, 0.0), (2, 1.0), (3, 1.0)]
    # each broker's replica-manager gauges, round by round: p0 (led by 0) under-replicated from
    # the shrink on, broker 2 one record behind on it (MaxLag)
    def per_broker(name):
        return [[v for _, v in history(name, b)] for b in range(3)]

    assert per_broker("PartitionCount") == [[2, 2, 2]] * 3
    assert per_broker("LeaderCount") == [[1, 1, 1], [1, 1, 1], [0, 0, 0]]
    assert per_broker("UnderReplicatedPartitions") == [[0, 1, 1], [0, 0, 0], [0, 0, 0]]
    assert per_broker("AtMinIsrPartitionCount") == [[0, 0, 0], [0, 0, 0], [0, 0, 0]]  # (min ISR 1)
    assert per_broker("UnderMinIsrPartitionCount") == [[0, 0, 0]] * 3
    assert per_broker("MaxLag") == [[0, 0, 0], [0, 0, 0], [0, 1, 1]]
    # each leader (brokers 0 and 1) caches a session per follower; broker 2 leads nothing
    cached = spark.sql("SELECT DISTINCT broker FROM replog.metrics WHERE broker IS NOT NULL "
                       "AND name = 'NumIncrementalFetchSessions'").collect()
    assert sorted(r["broker"] for r in cached) == [0, 1]
    per_leader = [sum(v for _, v in history("NumIncrementalFetchSessions", b)) for b in (0, 1)]
    assert sum(per_leader) == sum(v for _, v in history("NumIncrementalFetchSessions"))
