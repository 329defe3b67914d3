"""Kafka's partition health, one definition (control/partition_health.py), and every reader of it
agreeing through reassignments that change the replication factor: the round's gauges, SQL over
`replog.partitions`, `replog topics --describe`'s filters and the health check.

Kafka's UnderReplicatedPartitions counts a partition whose ISR is smaller than its replication
factor, which during a reassignment leaves out the replicas being added
(OngoingReassignmentState.replicationFactor); under and at min ISR compare the ISR with the
effective min ISR, min(min.insync.replicas, replica count) (Partition.effectiveMinIsr)."""

import argparse

import numpy as np

from jobs import check_health
from pipeline.cli import FILTERS, describe_lines
from pipeline.control import partition_health

A = np.array


def test_the_rules_by_kafkas_numbers():
    # replicas 4 of which 1 is being added, ISR 3: the replication factor is 3, not under-replicated
    assert partition_health.under_replicated(A([3, 2, 3]), A([4, 4, 3]), A([1, 1, 0])).tolist() == [False, True, False]
    # min.insync.replicas 3 on 1 replica (a reassignment lowered the replication factor): effectively 1
    assert partition_health.effective_min_isr(A([3, 2, 2]), A([1, 3, 2])).tolist() == [1, 2, 2]
    leader = A([0, 0, -1, 1])
    isr, min_isr, replicas = A([1, 1, 0, 2]), A([3, 2, 2, 2]), A([1, 3, 3, 3])
    assert partition_health.under_min_isr(isr, min_isr, replicas, leader).tolist() == [False, True, False, False]
    assert partition_health.at_min_isr(isr, min_isr, replicas, leader).tolist() == [True, False, False, True]
    assert partition_health.gauges(isr, replicas, A([0, 0, 0, 0]), min_isr, leader) == {
        "under_replicated_partitions": 3, "under_min_isr_partitions": 1, "at_min_isr_partitions": 2,
        "offline_partitions": 1}


def _readers(spark, cluster, report, capsys) -> dict:
    """What each reader counts: the round's gauges, SQL over replog.partitions, the CLI's filters and
    the health check's summary."""
    sql = spark.sql("SELECT " + ", ".join(f"count_if({partition_health.SQL[n]}) AS {n}" for n in (
        "under_replicated", "under_min_isr", "at_min_isr", "offline")) + " FROM replog.partitions").first()
    flags = {flag: False for flag in FILTERS}

    def cli(flag: str) -> int:
        args = argparse.Namespace(topic=None, **{**flags, flag: True})
        return len(list(describe_lines(cluster, args)))

    capsys.readouterr()
    check_health.main(["--root", cluster.storage.root, "--show", "0"])
    summary = capsys.readouterr()
    return {
        "gauges": (report.under_replicated_partitions, report.under_min_isr_partitions,
                   report.at_min_isr_partitions, report.offline_partitions),
        "sql": (sql["under_replicated"], sql["under_min_isr"], sql["at_min_isr"], sql["offline"]),
        "cli": (cli("under_replicated_partitions"), cli("under_min_isr_partitions"), cli("unavailable_partitions")),
        "health": (summary.out + summary.err).strip().split(": ", 1)[1],
    }


def test_every_reader_agrees_through_reassignments_that_change_the_replication_factor(spark, new_cluster, clock,
                                                                                      capsys):
    # (a long replica.lag.time.max.ms: only the reassignments and a fenced broker change the ISRs)
    cluster = new_cluster(brokers=4, config={"replica.lag.time.max.ms": 600_000})
    cluster.create_topic("t", partitions=3, replication_factor=3, config={"min.insync.replicas": 3})
    assert [r["replicas"] for r in cluster.describe("t").orderBy("partition").collect()] == [
        [0, 1, 2], [1, 2, 3], [2, 3, 0]]
    for _ in range(3):
        clock.advance(500)
        cluster.run_round()
    # p0 grows to 4 replicas, the added one (broker 3, paused) out of the ISR: adding;
    # p1 shrinks to its leader alone: done at once, min.insync.replicas 3 on 1 replica
    cluster.pause_fetcher(3)
    cluster.reassign_partitions({("t", 0): [0, 1, 2, 3], ("t", 1): [1]})
    for _ in range(2):
        clock.advance(500)
        report = cluster.run_round()
    now = {r["partition"]: r for r in cluster.describe("t").collect()}
    assert (now[0]["replicas"], now[0]["isr"], now[0]["adding_replicas"]) == ([0, 1, 2, 3], [0, 1, 2], [3])
    assert (now[1]["replicas"], now[1]["isr"]) == ([1], [1])
    # p0: 3 in sync of a replication factor of 3 (the replica being added not counted), at its
    # effective min ISR 3; p1: 1 of 1, at its effective min ISR 1; p2: 3 of 3, at min ISR 3
    assert _readers(spark, cluster, report, capsys) == {
        "gauges": (0, 0, 3, 0), "sql": (0, 0, 3, 0), "cli": (0, 0, 0),
        "health": "healthy: 3 partitions: 0 offline, 0 under min ISR, 0 under-replicated"}

    # broker 0 (p0's leader, p2's follower) stops: fenced, it leaves both ISRs
    cluster.stop_broker(0)
    clock.advance(cluster.config["broker.session.timeout.ms"] + 500)
    cluster.run_round()
    clock.advance(500)
    report = cluster.run_round()
    after = {r["partition"]: r for r in cluster.describe("t").collect()}
    assert (sorted(after[0]["isr"]), after[0]["adding_replicas"], sorted(after[2]["isr"])) == ([1, 2], [3], [2, 3])
    # p0 and p2: 2 in sync of 3, under their min ISR 3; p1 still at its effective min ISR
    assert _readers(spark, cluster, report, capsys) == {
        "gauges": (2, 2, 1, 0), "sql": (2, 2, 1, 0), "cli": (2, 2, 0),
        "health": "UNHEALTHY: 3 partitions: 0 offline, 2 under min ISR, 2 under-replicated"}
