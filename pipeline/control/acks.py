"""When a produce request is answered (Kafka's DelayedProduce): acks=0 and acks=1 once the leader
appended, acks=all once the HW passed the request's last offset, or with
NOT_ENOUGH_REPLICAS_AFTER_APPEND once the ISR fell under min.insync.replicas."""

from __future__ import annotations

import numpy as np

from pipeline.acks import STATUS_ACKED, STATUS_ERROR, STATUS_PENDING
from pipeline.errors import ErrorCode
from pipeline.schemas import ACKS_ALL

__all__ = ["request_status"]


def request_status(error: np.ndarray, acks: np.ndarray, last_offset: np.ndarray, high_watermark: np.ndarray,
                   isr_size: np.ndarray, min_isr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Status and error code of each request after the round (per request; the partition's
    `high_watermark`, `isr_size` and `min_isr` given per request). `min_isr`: the
    effective min ISR (control/partition_health.py)."""
    refused = error != None  # noqa: E711 (element-wise)
    waits = acks == ACKS_ALL
    under_min_isr = isr_size < min_isr
    reached = high_watermark > last_offset
    status = np.where(refused | (waits & under_min_isr), STATUS_ERROR,
                      np.where(~waits | reached, STATUS_ACKED, STATUS_PENDING)).astype(object)
    code = np.where(refused, error, np.where(waits & under_min_isr & ~refused,
                                             ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, None)).astype(object)
    return status, code
