"""A partition's ISR and high watermark (Kafka's Partition.scala): maybeShrinkIsr's out-of-sync
replicas, maybeExpandIsr's joiners and maybeIncrementLeaderHW, over `[partitions, replicas]`
matrices in replica order (per-partition values are `[partitions]` vectors)."""

from __future__ import annotations

import numpy as np

from pipeline.control.replica import is_caught_up
from pipeline.control.partition_health import effective_min_isr

__all__ = ["out_of_sync_replicas", "maybe_expand_isr", "maybe_increment_leader_hw", "is_hw_frozen"]

# the minimum of no values: a partition whose every replica is left out of the HW keeps its HW
_NO_REPLICA = np.iinfo(np.int64).max


def out_of_sync_replicas(in_isr: np.ndarray, is_leader: np.ndarray, follower_leo: np.ndarray,
                         leader_leo: np.ndarray, last_caught_up_time_ms: np.ndarray, now_ms: int,
                         lag_time_max_ms: np.ndarray) -> np.ndarray:
    """Kafka's getOutOfSyncReplicas: the ISR followers that are not caught up (`leader_leo` and
    `lag_time_max_ms` per partition)."""
    caught_up = is_caught_up(follower_leo, leader_leo[:, None], last_caught_up_time_ms, now_ms,
                             lag_time_max_ms[:, None])
    return in_isr & ~is_leader & ~caught_up


def maybe_expand_isr(in_isr: np.ndarray, fetched: np.ndarray, fetch_offset: np.ndarray,
                     high_watermark: np.ndarray, leader_epoch_start_offset: np.ndarray) -> np.ndarray:
    """Kafka's maybeExpandIsr at a fetch: a follower outside the ISR whose fetch offset reached the
    leader's HW and the start offset of the leader's current epoch (KAFKA-7128) joins it. Returns the
    joiners."""
    return (fetched & ~in_isr & (fetch_offset >= high_watermark[:, None])
            & (fetch_offset >= leader_epoch_start_offset[:, None]))


def is_hw_frozen(isr_size: np.ndarray, min_isr: np.ndarray, replication_factor: np.ndarray) -> np.ndarray:
    """The HW does not advance while the ISR is smaller than the effective min ISR,
    min(min.insync.replicas, replication factor) (Kafka >= 3.7; partition_health.py)."""
    return isr_size < effective_min_isr(min_isr, replication_factor)


def maybe_increment_leader_hw(high_watermark: np.ndarray, replica_leo: np.ndarray, exists: np.ndarray,
                              is_leader: np.ndarray, in_isr: np.ndarray, may_join: np.ndarray,
                              min_isr: np.ndarray) -> np.ndarray:
    """Kafka's maybeIncrementLeaderHW: the smallest LEO of the leader, the ISR members and the
    replicas eligible to join it (`may_join`: caught up, on a broker that may be in the ISR); never
    backwards, and frozen while the ISR is under min ISR (`is_hw_frozen`). `replica_leo`: the
    leader's own LEO in its column, the LEO the leader last saw for each follower."""
    counts = exists & (is_leader | in_isr | may_join)
    candidate = np.where(counts, replica_leo, _NO_REPLICA).min(axis=1)
    candidate = np.where(candidate == _NO_REPLICA, high_watermark, candidate)
    frozen = is_hw_frozen((in_isr & exists).sum(axis=1), min_isr, exists.sum(axis=1))
    return np.where(frozen, high_watermark, np.maximum(high_watermark, candidate))
