"""Consumer groups: committed offsets (OffsetCommit / OffsetFetch), reads that continue from them
with Kafka's auto.offset.reset, and kafka-consumer-groups' lag."""

import pytest
from chispa import assert_df_equality

from pipeline import ManualClock
from pipeline.errors import ReplogError
from pipeline.control.groups import group_start_offsets, partitions_without_offset

STATE = "topic string, partition int, log_start_offset long, high_watermark long, log_end_offset long"
COMMITTED = "topic string, partition int, committed_offset long"
STARTS = "topic string, partition int, start_offset long, reset string"


def state_and_commits(spark):
    state = spark.createDataFrame([("t", 0, 0, 10, 12), ("t", 1, 0, 10, 10), ("t", 2, 5, 10, 10),
                                   ("t", 3, 0, 10, 10), ("t", 4, 0, 10, 12)], STATE)
    # p0 in range; p1 none; p2 below the log start (deleted); p3 past the log end; p4 between HW and LEO
    committed = spark.createDataFrame([("t", 0, 4), ("t", 2, 3), ("t", 3, 11), ("t", 4, 11)], COMMITTED)
    return state, committed


@pytest.mark.parametrize("reset, p1, p2, p3", [("earliest", 0, 5, 0), ("latest", 10, 10, 10),
                                              ("none", None, None, None)])
def test_group_start_offsets_exact_rule(spark, reset, p1, p2, p3):
    state, committed = state_and_commits(spark)
    expected = spark.createDataFrame([("t", 0, 4, None), ("t", 1, p1, reset), ("t", 2, p2, reset),
                                      ("t", 3, p3, reset), ("t", 4, 11, None)], STARTS)
    assert_df_equality(group_start_offsets(state, committed, reset), expected, ignore_row_order=True,
                       ignore_nullable=True)


def test_partitions_without_offset(spark):
    state, committed = state_and_commits(spark)
    assert_df_equality(partitions_without_offset(state, committed),
                       spark.createDataFrame([("t", 1, None), ("t", 2, 3), ("t", 3, 11)], COMMITTED),
                       ignore_row_order=True, ignore_nullable=True)


@pytest.fixture(scope="module")
def cluster(spark, tmp_path_factory):
    from pipeline import Cluster
    clock = ManualClock(start_ms=1_000)
    # one broker, RF 1: committed in the round that appends (the HW is the leader's LEO)
    cluster = Cluster.create(spark, str(tmp_path_factory.mktemp("groups") / "c"), brokers=1, clock=clock)
    cluster.create_topic("t", partitions=2, replication_factor=1)
    cluster.produce("t", [{"value": f"a{i}", "partition": 0} for i in range(6)]
                    + [{"value": f"b{i}", "partition": 1} for i in range(4)], acks=1)
    clock.advance(500)
    cluster.run_round()
    return cluster


def values(df):
    return sorted((r["partition"], r["offset"], bytes(r["value"]).decode()) for r in df.collect())


def test_commit_fetch_read_and_lag(spark, cluster):
    cluster.commit_offsets("g", {("t", 0): 4}, metadata="batch 7")
    assert [tuple(r) for r in cluster.committed_offsets("g").collect()] == [("t", 0, 4, "batch 7", 1_500)]
    # p0 continues from 4; p1 has no offset: latest (Kafka's default) reads nothing, earliest all
    assert values(cluster.read("t", group="g")) == [(0, 4, "a4"), (0, 5, "a5")]
    assert values(cluster.read("t", group="g", auto_offset_reset="earliest")) == [
        (0, 4, "a4"), (0, 5, "a5"), (1, 0, "b0"), (1, 1, "b1"), (1, 2, "b2"), (1, 3, "b3")]
    assert values(cluster.read("t", partition=1, group="other", auto_offset_reset="earliest"))[0] == (1, 0, "b0")

    cluster.commit_offsets("g", {("t", 0): 6, ("t", 1): 1})  # replaces p0, adds p1: one commit
    lag = spark.sql("SELECT * FROM replog.consumer_lag WHERE group_id = 'g'")
    assert_df_equality(lag, spark.createDataFrame([("g", "t", 0, 6, 6, 0), ("g", "t", 1, 1, 4, 3)],
                                                  "group_id string, topic string, partition int, current_offset long, "
                                                  "log_end_offset long, lag long"),
                       ignore_row_order=True, ignore_nullable=True)
    assert cluster.consumer_lag("g").count() == 2 and cluster.consumer_lag("nobody").count() == 0
    assert values(cluster.read("t", group="g", auto_offset_reset="none")) == [(1, 1, "b1"), (1, 2, "b2"), (1, 3, "b3")]


def test_group_errors_write_nothing(cluster):
    before = cluster.storage.version("group_offsets")
    cases = [
        (lambda: cluster.commit_offsets("", {("t", 0): 1}), "INVALID_GROUP_ID"),
        (lambda: cluster.commit_offsets("g2", {("t", 0): 1, ("nope", 0): 1}), "UNKNOWN_TOPIC_OR_PARTITION"),
        (lambda: cluster.commit_offsets("g2", {("t", 0): 1, ("t", 2): 1}), "UNKNOWN_TOPIC_OR_PARTITION"),
        (lambda: cluster.commit_offsets("g2", {("t", 0): 1}, metadata="x" * 4097), "OFFSET_METADATA_TOO_LARGE"),
        (lambda: cluster.read("t", group="fresh", auto_offset_reset="none").collect(), "NO_OFFSET_FOR_PARTITION"),
    ]
    for call, code in cases:
        with pytest.raises(ReplogError) as err:
            call()
        assert err.value.code == code
    for bad in [lambda: cluster.commit_offsets("g2", {("t", 0): -1}),
                lambda: cluster.commit_offsets("g2", {}),
                lambda: cluster.read("t", group="g2", from_offset=0),
                lambda: cluster.read("t", group="g2", auto_offset_reset="smallest")]:
        with pytest.raises(ValueError):
            bad()
    assert cluster.storage.version("group_offsets") == before
    assert cluster.committed_offsets("g2").count() == 0
