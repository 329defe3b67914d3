"""A round carries its pinned state to the next round of the same process (round.Carry) instead
of re-reading the tables it has just written; a commit by anyone else to those tables makes the
next round read them again."""

from pipeline import Cluster
from pipeline.round import table_versions


def committed(cluster, topic):
    return {r["partition"]: r["high_watermark"] for r in cluster.describe(topic).collect()}


def test_a_carried_round_sees_what_another_writer_committed_in_between(new_cluster, spark, clock):
    cluster = new_cluster(brokers=2)
    cluster.create_topic("t", partitions=1, replication_factor=2)
    cluster.produce("t", [{"value": "a"}], acks="all")
    clock.advance(500)
    cluster.run_round()
    carry = cluster._carry
    assert carry is not None and carry.versions == table_versions(cluster.storage)

    other = Cluster.open(spark, cluster.storage.root, clock=clock)  # another process, same root
    other.create_topic("u", partitions=2, replication_factor=2)
    other.produce("u", [{"value": "b", "partition": 1}], acks="all")
    assert table_versions(cluster.storage) != carry.versions

    for _ in range(2):
        clock.advance(500)
        cluster.run_round()
    assert committed(cluster, "t") == {0: 1}
    assert committed(cluster, "u") == {0: 0, 1: 1}
    assert [bytes(r["value"]) for r in cluster.read("u").collect()] == [b"b"]
    # the state it carries now is the tables' state, row for row
    state = cluster.storage.replica_state().drop("round_id")
    assert sorted(cluster._carry.state.collect()) == sorted(state.select(*cluster._carry.state.columns).collect())
