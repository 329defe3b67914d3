"""The leader's side of a produce request (Kafka's ReplicaManager.appendRecords and
Partition.appendRecordsToLeader), per (request, partition) of the round's inbox summary: the
checks that refuse it whole, and the base offset of each accepted request, as a record batch's.

Requests are given in append order and grouped by partition (`partition_index`, non-decreasing):
each accepted request's records take the offsets after the ones before it in its partition."""

from __future__ import annotations

import numpy as np

from pipeline.errors import ErrorCode
from pipeline.schemas import ACKS_ALL, NO_LEADER

__all__ = ["produce_error", "assign_base_offsets"]


def produce_error(is_known: np.ndarray, leader: np.ndarray, acks: np.ndarray, isr_size: np.ndarray,
                  min_isr: np.ndarray, record_error: np.ndarray) -> np.ndarray:
    """The error that refuses each (request, partition), or None, the first that applies:
    UNKNOWN_TOPIC_OR_PARTITION (no such partition), NOT_LEADER_OR_FOLLOWER (no leader),
    NOT_ENOUGH_REPLICAS (acks=all while the ISR is under min.insync.replicas), then the records'
    own (`record_error`, from the inbox summary: MESSAGE_TOO_LARGE, INVALID_RECORD). `min_isr`: the
    effective min ISR (control/partition_health.py)."""
    error = np.where(record_error == None, None, record_error)  # noqa: E711 (element-wise)
    error = np.where((acks == ACKS_ALL) & (isr_size < min_isr), ErrorCode.NOT_ENOUGH_REPLICAS, error)
    error = np.where(leader == NO_LEADER, ErrorCode.NOT_LEADER_OR_FOLLOWER, error)
    return np.where(~is_known, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, error).astype(object)


def assign_base_offsets(partition_index: np.ndarray, record_count: np.ndarray, accepted: np.ndarray,
                        leader_leo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each accepted request's base offset (-1 where refused), and each partition's leader LEO after
    the appends. `leader_leo` is per partition; the rest per request, sorted by partition and then
    in append order."""
    counts = np.where(accepted, record_count, 0).astype(np.int64)
    totals = np.bincount(partition_index, weights=counts, minlength=len(leader_leo)).astype(np.int64)
    before = np.cumsum(counts) - counts  # records of the requests before, all partitions
    first_of_partition = np.cumsum(totals) - totals
    base = leader_leo[partition_index] + before - first_of_partition[partition_index]
    return np.where(accepted, base, -1), leader_leo + totals
