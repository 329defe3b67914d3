"""Consumers' KIP-227 sessions through real rounds and Delta tables: read_incremental returns only
partitions with committed records the consumer has not read, in incremental fetches of
unprivileged sessions that yield their cache slots to the followers' sessions; across eviction,
FETCH_SESSION_ID_NOT_FOUND and INVALID_FETCH_SESSION_EPOCH every committed record is returned
exactly once."""

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from pipeline.errors import ErrorCode, ReplogError
from tests.helpers import advance_rounds


def produce(cluster, topic, partition, values):
    cluster.produce(topic, [{"value": v, "partition": partition} for v in values], acks="all")


def rows(df):
    return sorted((r["partition"], r["offset"], bytes(r["value"]).decode()) for r in df.collect())


def kinds(cluster, consumer_id):
    return sorted((c.leader, c.kind, c.error_code) for c in cluster.consumer_fetch_requests(consumer_id))


def carried(cluster, consumer_id):
    """{leader: partitions its response carried} of the consumer's last call."""
    return {c.leader: c.response_partitions for c in cluster.consumer_fetch_requests(consumer_id)}


def committed(cluster, topic):
    return {r["partition"]: r["high_watermark"] for r in cluster.describe(topic).collect()}


def test_read_incremental_returns_only_new_committed_records_through_incremental_sessions(new_cluster, clock):
    cluster = new_cluster(brokers=2)
    cluster.create_topic("t", partitions=4, replication_factor=2)  # leaders 0, 1, 0, 1
    produce(cluster, "t", 0, ["a0", "a1"])
    produce(cluster, "t", 1, ["b0"])
    advance_rounds(cluster, clock, 2)
    assert committed(cluster, "t") == {0: 2, 1: 1, 2: 0, 3: 0}

    assert rows(cluster.read_incremental("c1", "t")) == [(0, 0, "a0"), (0, 1, "a1"), (1, 0, "b0")]
    first = cluster.consumer_fetch_requests("c1")
    assert sorted((c.leader, c.kind) for c in first) == [(0, "full"), (1, "full")]
    assert all(c.session_id != 0 for c in first)
    assert carried(cluster, "c1") == {0: 2, 1: 2}  # a full response carries every partition

    # nothing new: both leaders answer incrementally, with no partition and no record
    assert rows(cluster.read_incremental("c1", "t")) == []
    assert kinds(cluster, "c1") == [(0, "incremental", None), (1, "incremental", None)]
    assert carried(cluster, "c1") == {0: 0, 1: 0}
    assert {c.session_id for c in cluster.consumer_fetch_requests("c1")} == {c.session_id for c in first}

    produce(cluster, "t", 2, ["c0", "c1"])
    produce(cluster, "t", 0, ["a2"])
    advance_rounds(cluster, clock, 2)
    assert rows(cluster.read_incremental("c1", "t")) == [(0, 2, "a2"), (2, 0, "c0"), (2, 1, "c1")]
    assert kinds(cluster, "c1") == [(0, "incremental", None), (1, "incremental", None)]
    assert carried(cluster, "c1") == {0: 2, 1: 0}  # partitions 0 and 2 (leader 0) changed, 1 and 3 not

    # another consumer has positions of its own and starts from the log start
    assert len(rows(cluster.read_incremental("c2", "t"))) == 6

    # the consumers' sessions are unprivileged entries of the leaders' caches, next to the followers'
    advance_rounds(cluster, clock, 1)
    cache = {(s["leader"], s["fetcher"]): s["privileged"] for s in cluster.fetch_sessions().collect()}
    assert cache == {(0, "replica-1"): True, (1, "replica-0"): True, (0, "consumer-c1"): False,
                     (1, "consumer-c1"): False, (0, "consumer-c2"): False, (1, "consumer-c2"): False}
    metrics = {r["name"]: r["value"] for r in cluster.metrics().collect()}
    assert metrics["NumIncrementalFetchSessions"] == 6


def test_followers_evict_consumer_sessions_and_nothing_is_lost_or_returned_twice(new_cluster, clock):
    cluster = new_cluster(brokers=2, config={"max.incremental.fetch.session.cache.slots": 1})
    cluster.create_topic("t", partitions=2, replication_factor=2)
    assert rows(cluster.read_incremental("c", "t")) == []  # before any round: the slots are free
    assert kinds(cluster, "c") == [(0, "full", None), (1, "full", None)]
    sessions_before = {c.leader: c.session_id for c in cluster.consumer_fetch_requests("c")}
    assert all(sessions_before.values())

    produce(cluster, "t", 0, ["x0", "x1"])
    produce(cluster, "t", 1, ["y0"])
    clock.advance(500)
    first = cluster.run_round()  # each follower's new privileged session evicts the consumer's
    assert first.fetch_session_evictions == 2
    advance_rounds(cluster, clock, 1)
    assert committed(cluster, "t") == {0: 2, 1: 1}

    seen = rows(cluster.read_incremental("c", "t"))
    assert seen == []  # both sessions are gone: the leaders say so and serve nothing
    assert carried(cluster, "c") == {0: 0, 1: 0}
    assert kinds(cluster, "c") == [(0, "error", ErrorCode.FETCH_SESSION_ID_NOT_FOUND),
                                   (1, "error", ErrorCode.FETCH_SESSION_ID_NOT_FOUND)]
    seen += rows(cluster.read_incremental("c", "t"))
    # a full fetch again; the privileged followers keep their slots, so no session (id 0)
    assert [(c.kind, c.session_id) for c in cluster.consumer_fetch_requests("c")] == [("full", 0), ("full", 0)]
    produce(cluster, "t", 1, ["y1"])
    advance_rounds(cluster, clock, 2)
    seen += rows(cluster.read_incremental("c", "t"))
    assert seen == [(0, 0, "x0"), (0, 1, "x1"), (1, 0, "y0"), (1, 1, "y1")]


def test_read_incremental_refuses_unknown_topics_and_bad_consumer_ids(new_cluster):
    cluster = new_cluster(brokers=1)
    cluster.create_topic("t", partitions=1, replication_factor=1)
    with pytest.raises(ReplogError) as err:
        cluster.read_incremental("c", "nope")
    assert err.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(ValueError):
        cluster.read_incremental("", "t")
    # neither call wrote a session or a position
    assert cluster.storage.read("client_sessions").count() == 0
    assert cluster.storage.read("consumer_positions").filter(F.col("consumer_id") == "c").count() == 0


def test_a_replayed_consumer_fetch_gets_invalid_fetch_session_epoch_and_nothing_is_lost_or_returned_twice(
        new_cluster, clock):
    cluster = new_cluster(brokers=2)
    cluster.create_topic("t", partitions=2, replication_factor=2)  # leaders 0, 1
    produce(cluster, "t", 0, ["a0"])
    produce(cluster, "t", 1, ["b0"])
    advance_rounds(cluster, clock, 2)
    seen = rows(cluster.read_incremental("c", "t"))
    seen += rows(cluster.read_incremental("c", "t"))  # incremental: epoch 2 used, the leaders expect 3
    # the consumer sends its last request to leader 0 again (its handle one epoch back)
    DeltaTable.forPath(cluster.spark, cluster.storage.path("client_sessions")).update(
        (F.col("kind") == "handle") & (F.col("fetcher") == "consumer-c") & (F.col("leader") == 0),
        {"epoch": F.col("epoch") - 1})
    produce(cluster, "t", 0, ["a1"])
    produce(cluster, "t", 1, ["b1"])
    advance_rounds(cluster, clock, 2)
    seen += rows(cluster.read_incremental("c", "t"))
    assert kinds(cluster, "c") == [(0, "error", ErrorCode.INVALID_FETCH_SESSION_EPOCH), (1, "incremental", None)]
    assert carried(cluster, "c") == {0: 0, 1: 1}  # the errored leader served nothing
    seen += rows(cluster.read_incremental("c", "t"))
    after = cluster.consumer_fetch_requests("c")
    assert sorted((c.leader, c.kind) for c in after) == [(0, "full"), (1, "incremental")]
    assert [c.session_id != 0 for c in after] == [True, True]  # a new session with leader 0
    seen += rows(cluster.read_incremental("c", "t"))
    assert kinds(cluster, "c") == [(0, "incremental", None), (1, "incremental", None)]
    assert sorted(seen) == [(0, 0, "a0"), (0, 1, "a1"), (1, 0, "b0"), (1, 1, "b1")]
