"""The log start offset (Kafka's UnifiedLog.logStartOffset): delete_records and time or size
retention move a leader's, never back and never past its high watermark; a follower takes its
leader's from each fetch response (ReplicaFetcherThread.processPartitionData)."""

from __future__ import annotations

import numpy as np

__all__ = ["maybe_increment_log_start_offset", "follower_log_start_offset"]


def maybe_increment_log_start_offset(current: np.ndarray, high_watermark: np.ndarray,
                                     requested: np.ndarray) -> np.ndarray:
    """The leader's log start offset after a request to move it to `requested` (negative: none):
    it only moves forward, and no further than the high watermark."""
    return np.maximum(current, np.minimum(high_watermark, np.where(requested >= 0, requested, current)))


def follower_log_start_offset(own: np.ndarray, leader: np.ndarray) -> np.ndarray:
    """A follower's log start offset after a fetch response carrying its leader's `leader`."""
    return np.maximum(own, leader)
