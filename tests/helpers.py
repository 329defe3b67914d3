"""What the end-to-end tests share: rounds by the test's clock, a partition's row, a replica's log."""

from __future__ import annotations

from pyspark.sql import functions as F


def advance_rounds(cluster, clock=None, n: int = 1, step: int = 500) -> list:
    """`n` rounds, each after `step` ms on `clock` (default: the cluster's); their reports."""
    clock = clock or cluster.clock
    reports = []
    for _ in range(n):
        clock.advance(step)
        reports.append(cluster.run_round())
    return reports


def advance_round(cluster, clock=None, ms: int = 500):
    """One round after `ms` ms on `clock` (default: the cluster's); its report."""
    return advance_rounds(cluster, clock, 1, ms)[0]


def partition_row(cluster, topic: str, partition: int = 0):
    """The partition's row of describe()."""
    return cluster.describe(topic).filter(F.col("partition") == partition).first()


def replica_log(cluster, topic: str, broker: int, fields: tuple = ("offset", "value"), partition: int | None = 0,
                isolation: str = "read_uncommitted") -> list[tuple]:
    """A replica's records in offset order as tuples of `fields`, keys and values decoded."""
    rows = cluster.read(topic, partition=partition, replica=broker, isolation=isolation).orderBy("offset").collect()
    return [tuple(r[f].decode() if isinstance(r[f], (bytes, bytearray)) else r[f] for f in fields) for r in rows]
