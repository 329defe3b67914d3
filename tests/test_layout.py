"""A root made by an older release: Cluster.open brings its tables and columns up to this release's
layout once (Storage.upgrade, the cluster table's replog.layout property), and a root already at it
costs no Delta log reads. Real Delta tables; an old root is made by taking from a new one what an
older release did not write."""

import os
import shutil

from pyspark.sql import functions as F

from pipeline import Cluster
from pipeline.storage import LAYOUT, LAYOUT_PROPERTY
from tests.helpers import advance_round


def _committed_values(cluster):
    return sorted(r["value"] for r in cluster.read("orders").select(F.col("value").cast("string").alias("value")).collect())


def _without_column(spark, path, column):
    """The table at `path` rewritten without `column`, as a release before the column wrote it."""
    spark.read.format("delta").load(path).drop(column).localCheckpoint() \
        .write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)


def test_an_old_root_gets_the_tables_and_columns_it_lacks_once_and_keeps_its_data(spark, new_cluster, clock):
    cluster = new_cluster()
    storage = cluster.storage
    assert storage.layout() == LAYOUT  # a new root says its layout
    cluster.create_topic("orders", partitions=2, replication_factor=3)
    first = cluster.produce("orders", [{"value": "a", "partition": 0}, {"value": "b", "partition": 1}], acks="all")
    advance_round(cluster, clock)
    # what a root of a release before client quotas, the controller's elections and the layout
    # property looks like: no such tables, no throttle_time_ms in results, no property
    spark.sql(f"ALTER TABLE delta.`{storage.path('cluster')}` UNSET TBLPROPERTIES ('{LAYOUT_PROPERTY}')")
    for table in ("client_quotas", "elections"):
        shutil.rmtree(storage.path(table))
    _without_column(spark, storage.path("results"), "throttle_time_ms")
    assert storage.layout() == 0

    reopened = Cluster.open(spark, storage.root, clock=clock)

    assert storage.layout() == LAYOUT
    assert all(os.path.isdir(os.path.join(storage.path(t), "_delta_log")) for t in ("client_quotas", "elections"))
    assert "throttle_time_ms" in storage.read("results").columns
    assert storage.upgrade() == {}  # once: nothing is left to add
    second = reopened.produce("orders", [{"value": "c", "partition": 0}], acks="all")
    advance_round(reopened, clock)
    results = {r["request_id"]: (r["status"], r["throttle_time_ms"]) for r in reopened.produce_results().collect()}
    assert results == {first: ("acked", 0), second: ("acked", 0)}
    old_rows = storage.read("results").filter(F.col("request_id") == first).select("throttle_time_ms").collect()
    assert [r[0] for r in old_rows] == [None, None]  # one per partition, written before the column: null, which the view reads as 0
    assert _committed_values(reopened) == ["a", "b", "c"]
    assert reopened.describe_client_quotas() == [] and reopened.elections().count() == 0


def test_upgrade_reports_what_it_added_and_a_current_root_is_checked_by_its_files_only(spark, new_cluster):
    storage = new_cluster().storage
    spark.sql(f"ALTER TABLE delta.`{storage.path('cluster')}` SET TBLPROPERTIES ('{LAYOUT_PROPERTY}' = '0')")
    shutil.rmtree(storage.path("lease"))
    _without_column(spark, storage.path("rounds"), "throttled_requests")
    _without_column(spark, storage.path("brokers"), "decommissioned")

    assert storage.upgrade() == {"lease": ["<table>"], "rounds": ["throttled_requests"],
                                 "brokers": ["decommissioned"]}
    assert storage.layout() == LAYOUT

    # at LAYOUT, a missing table that a later release added is still made again (a file check),
    # but no table's Delta log is read for its columns
    shutil.rmtree(storage.path("lease"))
    _without_column(spark, storage.path("rounds"), "throttled_requests")
    assert storage.upgrade() == {"lease": ["<table>"]}
    assert "throttled_requests" not in storage.read("rounds").columns


def test_open_without_views_leaves_the_session_catalog_alone(spark, new_cluster):
    """The command line opens a root without the replog.* views (Cluster.open(views=False)); the
    API's default registers them for the root opened."""
    cluster = new_cluster()
    cluster.create_topic("orders", partitions=3, replication_factor=2)
    spark.sql("DROP VIEW IF EXISTS replog.partitions")

    Cluster.open(spark, cluster.storage.root, views=False)
    assert not spark.catalog.tableExists("replog.partitions")

    Cluster.open(spark, cluster.storage.root)
    assert spark.sql("SELECT count(*) AS n FROM replog.partitions WHERE topic = 'orders'").first()["n"] == 3


LOG_STATS = "delta.dataSkippingStatsColumns"
TABLE_STATS = "delta.dataSkippingNumIndexedCols"


def _stats_setting(spark, path):
    rows = spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()
    props = {r["key"]: r["value"] for r in rows}
    return props.get(LOG_STATS) or props.get(TABLE_STATS)


def test_a_root_of_layout_1_gets_statistics_on_the_columns_reads_skip_by_and_keeps_skipping(spark, new_cluster,
                                                                                            clock):
    """Layout 2: the logs keep file statistics on topic, partition, offset and timestamp, and
    replica_state and results on their three leading key columns, not on every column."""
    cluster = new_cluster()
    storage = cluster.storage
    logs = [storage.log_path(b) for b in cluster.brokers]
    tables = [storage.path("replica_state"), storage.path("results")]
    expected = ["topic,partition,offset,timestamp"] * len(logs) + ["3"] * len(tables)
    assert [_stats_setting(spark, p) for p in logs + tables] == expected
    cluster.create_topic("orders", partitions=1, replication_factor=3)
    cluster.produce("orders", [{"value": "a", "partition": 0}], acks="all")
    advance_round(cluster, clock)
    # a root of layout 1: Delta's default statistics
    for path in logs:
        spark.sql(f"ALTER TABLE delta.`{path}` UNSET TBLPROPERTIES ('{LOG_STATS}')")
    for path in tables:
        spark.sql(f"ALTER TABLE delta.`{path}` UNSET TBLPROPERTIES ('{TABLE_STATS}')")
    spark.sql(f"ALTER TABLE delta.`{storage.path('cluster')}` SET TBLPROPERTIES ('{LAYOUT_PROPERTY}' = '1')")

    assert storage.upgrade(cluster.brokers) == {"replica_state": [TABLE_STATS], "results": [TABLE_STATS],
                                                **{f"log {b}": [LOG_STATS] for b in cluster.brokers}}
    assert [_stats_setting(spark, p) for p in logs + tables] == expected
    assert storage.layout() == LAYOUT and storage.upgrade(cluster.brokers) == {}

    reopened = Cluster.open(spark, storage.root, clock=clock)
    reopened.produce("orders", [{"value": "b", "partition": 0}], acks="all")
    advance_round(reopened, clock)
    assert _committed_values(reopened) == ["a", "b"]
    # offsets and timestamps still have statistics: a read of one skips the file of the other
    log = spark.read.format("delta").load(logs[0])
    assert len(log.inputFiles()) == 2
    assert len(log.filter(F.col("offset") == 1).inputFiles()) == 1
    stamps = sorted(r["timestamp"] for r in log.select("timestamp").collect())
    assert len(stamps) == 2 and stamps[0] < stamps[1]  # a at t=0, b half a second later
    assert len(log.filter(F.col("timestamp") < stamps[1]).inputFiles()) == 1
