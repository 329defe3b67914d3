"""Reassignment end to end on real Delta tables (KIP-455, kafka-reassign-partitions): raising the
replication factor while acks=all producers keep going, the new replica bootstrapping from the
leader's log start offset until it joins the ISR and later leading after a failover; moving every
replica off a decommissioned broker; and the requests a user can get wrong."""

import pytest
from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock
from pipeline.errors import ReplogError
from tests.helpers import advance_round, partition_row, replica_log

EPOCH_MS = 1_700_000_000_000


def _statuses(cluster, request_ids):
    rows = cluster.produce_results().filter(F.col("request_id").isin(request_ids)).collect()
    return sorted({r["status"] for r in rows})


def test_raising_the_replication_factor_while_producing_with_acks_all(spark, tmp_path):
    clock = ManualClock(start_ms=EPOCH_MS)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=3, config={"min.insync.replicas": 2}, clock=clock)
    cluster.create_topic("t", partitions=2, replication_factor=2)
    before = partition_row(cluster, "t")
    old, new = list(before["replicas"]), next(b for b in range(3) if b not in before["replicas"])
    requests = [cluster.produce("t", [{"value": f"a{i}", "partition": 0} for i in range(5)], acks="all")]
    advance_round(cluster, clock), advance_round(cluster, clock)
    cluster.delete_records("t", 0, 2)  # the new replica starts from the leader's log start offset
    advance_round(cluster, clock)

    cluster.reassign_partitions({("t", 0): old + [new]})
    requests.append(cluster.produce("t", [{"value": f"b{i}", "partition": 0} for i in range(3)], acks="all"))
    advance_round(cluster, clock)
    p = partition_row(cluster, "t")
    assert (p["replicas"], p["isr"], p["adding_replicas"], p["removing_replicas"]) == (old + [new], old, [new], [])
    assert p["partition_epoch"] == before["partition_epoch"] + 1 and p["leader_epoch"] == before["leader_epoch"]
    progress = cluster.reassignments().collect()
    assert [(r["topic"], r["partition"], r["adding"], r["records_left"]) for r in progress] == [
        ("t", 0, [new], p["log_end_offset"] - 2)]
    assert progress[0]["bytes_left"] > 0
    # bootstrapping: out of the ISR; as Kafka counts it, not under-replicated (its replication factor
    # leaves out the replica being added: control/partition_health.py)
    assert cluster.rounds().orderBy(F.col("round_id").desc()).first()["under_replicated_partitions"] == 0

    for _ in range(6):
        requests.append(cluster.produce("t", [{"value": f"c{clock.now_ms()}", "partition": 0}], acks="all"))
        advance_round(cluster, clock)
    advance_round(cluster, clock), advance_round(cluster, clock)
    p = partition_row(cluster, "t")
    assert (p["replicas"], p["isr"], p["adding_replicas"]) == (old + [new], old + [new], [])
    assert p["leader_epoch"] == before["leader_epoch"] + 1  # completing bumps the leader epoch (KIP-455)
    assert cluster.reassignments().count() == 0
    assert _statuses(cluster, requests) == ["acked"]
    leader_log = replica_log(cluster, "t", p["leader"])
    assert leader_log[0][0] == 2 and replica_log(cluster, "t", new) == leader_log
    assert cluster.rounds().orderBy(F.col("round_id").desc()).first()["under_replicated_partitions"] == 0

    # a failover to the new replica: the other two crash, it is the last live ISR member
    for b in old:
        cluster.stop_broker(b)
    clock.advance(10_000)
    advance_round(cluster, clock), advance_round(cluster, clock)
    p = partition_row(cluster, "t")
    assert (p["leader"], p["isr"]) == (new, [new])
    assert [v for _, v in replica_log(cluster, "t", new)] == [v for _, v in leader_log]
    served = cluster.read("t", partition=0).orderBy("offset").collect()
    assert [r["offset"] for r in served] == [o for o, _ in leader_log]
    late = cluster.produce("t", [{"value": "after", "partition": 0}], acks=1)
    advance_round(cluster, clock)
    assert _statuses(cluster, [late]) == ["acked"]
    assert replica_log(cluster, "t", new)[-1] == (leader_log[-1][0] + 1, "after")


def test_decommissioning_a_broker_moves_every_replica_off_it(spark, tmp_path):
    clock = ManualClock(start_ms=EPOCH_MS)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=3, clock=clock)
    cluster.create_topic("t", partitions=3, replication_factor=2)
    cluster.create_topic("u", partitions=1, replication_factor=3)
    with pytest.raises(ReplogError) as refused:  # u has RF 3 and no fourth broker to go to
        cluster.decommission_broker(0)
    assert refused.value.code == "INVALID_REPLICATION_FACTOR" and "u-0" in str(refused.value)
    assert cluster.reassignments().count() == 0
    assert not cluster.broker_states().filter("broker = 0").first()["decommissioned"]

    assert cluster.add_broker() == 3
    assert spark.sql("SELECT count(*) AS n FROM replog.brokers").first()["n"] == 4
    ids = [cluster.produce(t, [{"value": f"{t}{i}"} for i in range(6)], acks="all") for t in ("t", "u")]
    advance_round(cluster, clock), advance_round(cluster, clock)
    committed = {t: sorted(r["value"] for r in cluster.read(t).collect()) for t in ("t", "u")}
    hosted = [r for r in cluster.replicas().collect() if r["broker"] == 0]
    plan = cluster.decommission_broker(0)
    assert sorted(plan) == sorted((r["topic"], r["partition"]) for r in hosted)
    assert all(0 not in target and len(target) == len(partition_row(cluster, t, p)["replicas"])
               for (t, p), target in plan.items())
    with pytest.raises(ReplogError) as taken:  # no new replica goes to a broker being decommissioned
        cluster.reassign_partitions({("t", 0): [0, 1]})
    assert taken.value.code == "INVALID_REPLICA_ASSIGNMENT"
    ids.append(cluster.produce("t", [{"value": "during"}], acks="all"))
    for _ in range(8):
        advance_round(cluster, clock)
        if cluster.reassignments().count() == 0:
            break
    assert cluster.reassignments().count() == 0
    assert cluster.replicas().filter("broker = 0").count() == 0
    assert cluster.storage.read_log(0).count() == 0
    assert all(0 not in r["replicas"] and 0 not in r["isr"] for r in cluster.describe().collect())
    assert _statuses(cluster, ids) == ["acked"]
    assert sorted(r["value"] for r in cluster.read("u").collect()) == committed["u"]
    assert sorted(r["value"] for r in cluster.read("t").collect()) == sorted(committed["t"] + [b"during"])
    assert cluster.broker_states().filter("broker = 0").first()["decommissioned"]


def test_reassignment_requests_a_user_can_get_wrong_write_nothing(spark, tmp_path):
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=3, clock=ManualClock(start_ms=EPOCH_MS))
    cluster.create_topic("t", partitions=1, replication_factor=2)
    version = cluster.storage.version("admin")
    for assignment, code, words in [
        ({("nope", 0): [0, 1]}, "UNKNOWN_TOPIC_OR_PARTITION", "unknown topic"),
        ({("t", 1): [0, 1]}, "UNKNOWN_TOPIC_OR_PARTITION", "no partition 1"),
        ({("t", 0): []}, "INVALID_REPLICA_ASSIGNMENT", "empty"),
        ({("t", 0): [1, 1]}, "INVALID_REPLICA_ASSIGNMENT", "duplicate"),
        ({("t", 0): [0, 7]}, "INVALID_REPLICA_ASSIGNMENT", "unknown brokers [7]"),
        ({("t", 0): "01"}, "INVALID_REPLICA_ASSIGNMENT", "list of broker ids"),
        ({}, "INVALID_REPLICA_ASSIGNMENT", "non-empty"),
    ]:
        with pytest.raises(ReplogError) as error:
            cluster.reassign_partitions(assignment)
        assert error.value.code == code and words in str(error.value), (assignment, str(error.value))
    with pytest.raises(ReplogError) as error:
        cluster.decommission_broker(9)
    assert error.value.code == "BROKER_NOT_AVAILABLE"
    assert cluster.storage.version("admin") == version
