"""A partition's health, one definition each (Kafka's Partition.scala gauges and kafka-topics'
describe filters), used by the round's gauges, the `replog.partitions` view's readers, the
command line's filters and the health check alike:

- under-replicated: the ISR is smaller than the replication factor, which during a reassignment
  is the replicas less those being added (Kafka's OngoingReassignmentState.replicationFactor);
- effective min ISR: min(min.insync.replicas, the replica count) (Partition.effectiveMinIsr: a
  min ISR above the replica count, which a reassignment that lowers the replication factor can
  leave, counts as the replica count);
- under min ISR: a partition with a leader whose ISR is smaller than its effective min ISR;
- at min ISR: a partition with a leader whose ISR is its effective min ISR;
- offline: no leader.

Each is given twice, side by side: as a Spark SQL expression over a partitions row (`replicas`,
`adding_replicas`, `isr`, `min_isr`, `leader`) and as a numpy rule over the round's arrays; a
test holds the two to the same counts through a reassignment that changes the replication
factor (tests/test_partition_health.py)."""

from __future__ import annotations

import numpy as np

from pipeline.schemas import NO_LEADER

__all__ = ["SQL", "under_replicated", "effective_min_isr", "under_min_isr", "at_min_isr", "offline", "gauges"]

_EFFECTIVE_MIN_ISR = "least(min_isr, size(replicas))"

# Spark SQL over a partitions row (adding_replicas never null: the view coalesces it to [])
SQL = {
    "under_replicated": "size(isr) < size(replicas) - size(adding_replicas)",
    "effective_min_isr": _EFFECTIVE_MIN_ISR,
    "under_min_isr": f"leader <> {NO_LEADER} AND size(isr) < {_EFFECTIVE_MIN_ISR}",
    "at_min_isr": f"leader <> {NO_LEADER} AND size(isr) = {_EFFECTIVE_MIN_ISR}",
    "offline": f"leader = {NO_LEADER}",
}


def under_replicated(isr_size: np.ndarray, replicas_size: np.ndarray, adding_size: np.ndarray) -> np.ndarray:
    return isr_size < replicas_size - adding_size


def effective_min_isr(min_isr: np.ndarray, replicas_size: np.ndarray) -> np.ndarray:
    return np.minimum(min_isr, replicas_size)


def under_min_isr(isr_size: np.ndarray, min_isr: np.ndarray, replicas_size: np.ndarray,
                  leader: np.ndarray) -> np.ndarray:
    return ~offline(leader) & (isr_size < effective_min_isr(min_isr, replicas_size))


def at_min_isr(isr_size: np.ndarray, min_isr: np.ndarray, replicas_size: np.ndarray, leader: np.ndarray) -> np.ndarray:
    return ~offline(leader) & (isr_size == effective_min_isr(min_isr, replicas_size))


def offline(leader: np.ndarray) -> np.ndarray:
    return leader == NO_LEADER


def gauges(isr_size: np.ndarray, replicas_size: np.ndarray, adding_size: np.ndarray, min_isr: np.ndarray,
           leader: np.ndarray) -> dict[str, int]:
    """The round's counts of each (UnderReplicatedPartitions, UnderMinIsrPartitionCount,
    AtMinIsrPartitionCount, OfflinePartitionsCount)."""
    return {"under_replicated_partitions": int(under_replicated(isr_size, replicas_size, adding_size).sum()),
            "under_min_isr_partitions": int(under_min_isr(isr_size, min_isr, replicas_size, leader).sum()),
            "at_min_isr_partitions": int(at_min_isr(isr_size, min_isr, replicas_size, leader).sum()),
            "offline_partitions": int(offline(leader).sum())}
