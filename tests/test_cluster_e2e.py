"""End to end on real Delta tables: 3 brokers, RF 3, acks=all committed in the round that appends."""

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipeline import Cluster
from pipeline.data.partitioner import partition_for_key

DESCRIBE_COLS = ["topic", "partition", "leader", "leader_epoch", "replicas", "isr", "high_watermark",
                 "log_end_offset", "log_start_offset"]
DESCRIBE_SCHEMA = ("topic string, partition int, leader int, leader_epoch int, replicas array<int>, isr array<int>, "
                   "high_watermark long, log_end_offset long, log_start_offset long")
KEYS = [f"key-{i}" for i in range(12)]


def describe(cluster):
    return cluster.describe("orders").select(*DESCRIBE_COLS)


def per_partition(keys, partitions=4):
    counts = [0] * partitions
    for k in keys:
        counts[partition_for_key(k.encode(), partitions)] += 1
    return counts


@pytest.fixture(scope="module")
def scenario(spark, tmp_path_factory):
    """Produce 12 keyed records with acks=all and 2 with acks=1, run three rounds, keep snapshots."""
    from pipeline import ManualClock

    clock = ManualClock(start_ms=1_000)
    root = str(tmp_path_factory.mktemp("e2e") / "cluster")
    cluster = Cluster.create(spark, root, brokers=3, clock=clock)
    cluster.create_topic("orders", partitions=4, replication_factor=3, config={"min.insync.replicas": "2"})
    all_id = cluster.produce("orders", [{"key": k, "value": f"value-{k}"} for k in KEYS], acks="all")
    one_id = cluster.produce("orders", [{"key": "key-0", "value": "again"}, {"value": b"\x00\xff", "partition": 2}], acks=1)
    cluster.create_topic("frames", partitions=3, replication_factor=2)
    frame = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(6)] + [(None, "n0"), (None, "n1"), (None, "n2")],
                                  "key string, value string")
    cluster.produce("frames", frame, acks=0)
    snaps = []
    for _ in range(3):
        clock.advance(500)
        report = cluster.run_round()
        snaps.append({
            "report": report,
            "describe": describe(cluster).localCheckpoint(),
            "results": cluster.produce_results().localCheckpoint(),
            "uncommitted": cluster.read("orders", isolation="read_uncommitted").count(),
            "committed": cluster.read("orders").count(),
        })
    return {"cluster": cluster, "snaps": snaps, "all_id": all_id, "one_id": one_id, "root": root, "clock": clock}


def expected_leo():
    counts = per_partition(KEYS)
    counts[partition_for_key(b"key-0", 4)] += 1
    counts[2] += 1  # the record with an explicit partition
    return counts


def test_round_one_appends_replicates_and_commits_with_the_follow_up_fetch(spark, scenario):
    """The followers' follow-up fetch offsets prove they wrote the records: the HW moves over them
    and acks=all is answered in the round that appended."""
    snap = scenario["snaps"][0]
    assert snap["report"].records_appended == 14 + 9
    assert snap["report"].records_replicated == 28 + 9  # two followers each for orders, one for frames
    assert snap["uncommitted"] == 14 and snap["committed"] == 14
    leo = expected_leo()
    # assignment starts at broker 0: leaders 0,1,2,0 with shifted followers
    expected = [("orders", p, r[0], 0, r, r, leo[p], leo[p], 0)
                for p, r in enumerate([[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 2, 1]])]
    assert_df_equality(snap["describe"], spark.createDataFrame(expected, DESCRIBE_SCHEMA),
                       ignore_row_order=True, ignore_nullable=True)
    statuses = {(r["request_id"], r["partition"]): r["status"] for r in snap["results"].collect()}
    assert set(statuses.values()) == {"acked"}
    assert snap["report"].requests_acked == len(statuses)
    assert snap["report"].active_partitions == 0


@pytest.mark.parametrize("index", [1, 2])
def test_rounds_after_the_committing_one_are_idle(scenario, index):
    report = scenario["snaps"][index]["report"]
    assert (report.records_appended, report.records_replicated, report.fetch_request_partitions,
            report.fetch_response_partitions, report.active_partitions) == (0, 0, 0, 0, 0)


def test_keyed_records_go_to_kafkas_default_partition(scenario):
    rows = scenario["cluster"].read("orders").filter(F.col("value").startswith(F.lit(b"value-"))).collect()
    for row in rows:
        assert row["partition"] == partition_for_key(row["key"], 4)
    assert len(rows) == 12


def test_replicas_identical_below_hw_and_offsets_dense(spark, scenario):
    cluster = scenario["cluster"]
    per_replica = [cluster.read("orders", replica=b).select("partition", "offset", "leader_epoch", "key", "value")
                   for b in range(3)]
    for other in per_replica[1:]:
        assert_df_equality(per_replica[0], other, ignore_row_order=True)
    gaps = per_replica[0].groupBy("partition").agg(
        (F.max("offset") - F.min("offset") + 1 - F.count("offset")).alias("gap"), F.min("offset").alias("lo"))
    assert {(r["gap"], r["lo"]) for r in gaps.collect()} == {(0, 0)}


def test_replicas_view_and_sql(spark, scenario):
    cluster = scenario["cluster"]
    rows = cluster.replicas("orders").collect()
    assert len(rows) == 12
    assert all(r["in_isr"] and r["lag"] == 0 for r in rows)
    assert sum(r["is_leader"] for r in rows) == 4
    under = spark.sql("SELECT * FROM replog.partitions WHERE size(isr) < size(replicas)").count()
    assert under == 0
    assert spark.sql("SELECT count(*) AS n FROM replog.rounds").first()["n"] == 3
    assert spark.sql("SELECT count(*) AS n FROM replog.committed WHERE topic = 'orders'").first()["n"] == 14
    assert spark.sql("SELECT count(*) AS n FROM replog.replicas WHERE NOT in_isr").first()["n"] == 0


def test_binary_values_and_null_keys_round_trip(scenario):
    values = {bytes(r["value"]) for r in scenario["cluster"].read("orders").collect()}
    assert b"\x00\xff" in values and b"again" in values


def test_read_from_offset_and_partition(scenario):
    cluster = scenario["cluster"]
    p = partition_for_key(b"key-0", 4)
    leo = expected_leo()[p]
    assert cluster.read("orders", partition=p, from_offset=1).count() == leo - 1


def test_open_resumes_the_cluster(spark, scenario):
    reopened = Cluster.open(spark, scenario["root"], clock=scenario["clock"])
    assert reopened.brokers == [0, 1, 2]
    assert_df_equality(describe(reopened), scenario["snaps"][1]["describe"], ignore_row_order=True)
    scenario["clock"].advance(500)
    assert reopened.run_round().round_id == 4
    scenario["cluster"] = reopened  # it holds the replication lease now: the old object is fenced


def test_dataframe_produce_uses_the_same_partitioner(spark, scenario):
    rows = scenario["cluster"].read("frames").collect()
    assert len(rows) == 9
    for row in rows:
        if row["key"] is not None:
            assert row["partition"] == partition_for_key(bytes(row["key"]), 3)
    null_key_partitions = {r["partition"] for r in rows if r["key"] is None}
    assert len(null_key_partitions) == 3  # null keys spread over the partitions
    statuses = {r["status"] for r in scenario["cluster"].produce_results().filter("topic = 'frames'").collect()}
    assert statuses == {"acked"}  # acks=0 never waits


def test_idle_round_writes_no_log_or_state(scenario):
    cluster = scenario["cluster"]
    tables = ["replica_state", "partitions", "results", "inbox"]
    before = [cluster.storage.version(t) for t in tables]
    logs = [cluster.storage.read_log(b).count() for b in cluster.brokers]
    scenario["clock"].advance(60_000)
    report = cluster.run_round()
    assert report.fetch_request_partitions == 0 and report.records_replicated == 0
    assert [cluster.storage.version(t) for t in tables] == before
    assert [cluster.storage.read_log(b).count() for b in cluster.brokers] == logs
