"""Kafka's rack-unaware replica assignment: round-robin leaders from a start index, followers shifted."""

from __future__ import annotations

__all__ = ["assign_replicas"]


def _replica_index(first: int, shift: int, j: int, n_brokers: int) -> int:
    step = 1 + (shift + j) % (n_brokers - 1)
    return (first + step) % n_brokers


def assign_replicas(brokers: list[int], partitions: int, replication_factor: int,
                    start_index: int = 0) -> list[list[int]]:
    """Replica lists per partition, the first replica being the preferred leader.

    Leaders go round-robin over the brokers from `start_index`, so every broker leads floor(P/B) or
    ceil(P/B) partitions; the follower shift grows by one each time the leaders wrap around, which
    spreads followers as Kafka's AdminUtils does.

    >>> assign_replicas([0, 1, 2], 3, 2)
    [[0, 1], [1, 2], [2, 0]]
    """
    n = len(brokers)
    shift = start_index
    out = []
    for p in range(partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start_index) % n
        replicas = [brokers[first]]
        replicas += [brokers[_replica_index(first, shift, j, n)] for j in range(replication_factor - 1)]
        out.append(replicas)
    return out
