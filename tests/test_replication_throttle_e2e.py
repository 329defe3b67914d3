"""Replication quotas (KIP-73) end to end: a replica a reassignment adds catches up at the
follower throttle's rate by the cluster clock, while the followers already in the ISR (listed as
throttled too) keep up and acks=all requests go on committing."""

from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock
from pipeline.control.replication import RECORD_OVERHEAD_BYTES

EPOCH_MS = 1_700_000_000_000
RATE = 10 * 1024  # bytes per second
SIZE = 100 + RECORD_OVERHEAD_BYTES  # a 100-byte value, no key


def _moved_bytes(cluster, broker):
    return cluster.read("t", partition=0, replica=broker, isolation="read_uncommitted").count() * SIZE


def test_a_bootstrapping_replica_is_held_to_the_throttled_rate_while_the_isr_keeps_up(spark, tmp_path):
    clock = ManualClock(start_ms=EPOCH_MS)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=3, config={"min.insync.replicas": 2}, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=2)
    old = list(cluster.describe("t").first()["replicas"])
    new = next(b for b in range(3) if b not in old)
    cluster.produce("t", [{"value": "v" * 100, "partition": 0} for _ in range(400)], acks="all")
    clock.advance(1000), cluster.run_round(), clock.advance(1000), cluster.run_round()

    cluster.alter_configs("brokers", set={"follower.replication.throttled.rate": RATE})
    cluster.alter_configs("topics", "t", set={"follower.replication.throttled.replicas": "*"})
    cluster.reassign_partitions({("t", 0): old + [new]})
    started_ms = clock.now_ms()  # the throttle's budget accrues from here
    acked, moved, drawn = [], [], 0
    for _ in range(5):
        acked.append(cluster.produce("t", [{"value": "w" * 100, "partition": 0} for _ in range(5)], acks="all"))
        clock.advance(1000)
        report = cluster.run_round()
        moved.append(_moved_bytes(cluster, new))
        drawn += report.throttled_bytes.get(("follower", new), 0)
        elapsed_s = (clock.now_ms() - started_ms) / 1000
        assert drawn <= RATE * elapsed_s  # never above the rate, by the clock
        # everything it moved was throttled, but in a round where it joined the ISR (KIP-73: an ISR
        # member is not throttled; one that catches up joins at its follow-up fetch, and takes the rest)
        assert moved[-1] == drawn or report.isr_expands
        leader_leo = cluster.describe("t").first()["log_end_offset"]
        isr_follower = next(r for r in cluster.replicas("t").collect() if r["broker"] == old[1])
        assert isr_follower["log_end_offset"] == leader_leo  # the in-sync follower is not held back
    # the first round adds the replica (it fetches from the next); then it moves about RATE a second
    assert moved[0] == 0 and moved[-1] >= 0.9 * RATE * 4
    assert all(b - a <= 2 * RATE for a, b in zip(moved, moved[1:]))
    statuses = {r["status"] for r in cluster.produce_results().filter(F.col("request_id").isin(acked[:-1])).collect()}
    assert statuses == {"acked"}
    for _ in range(6):  # it catches up (405 + 25 records at ~85 a second), joins, the reassignment completes
        clock.advance(1000)
        cluster.run_round()
    p = cluster.describe("t").first()
    assert (p["replicas"], sorted(p["isr"]), p["adding_replicas"]) == (old + [new], sorted(old + [new]), [])
