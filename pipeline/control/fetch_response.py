"""How much of each partition a fetch response carries (Kafka's ReplicaManager.readFromLocalLog):
partitions in the request's order, each read up to min(its max bytes, the bytes the response has
left), whole record batches only; until a partition has returned data the first batch goes even
when it is larger than the limits (KIP-74), so a batch over the limits still moves.

Here a record batch is one produce request's records for one partition, as in Kafka.

Arrays: per partition fetch `f` (sorted by request, then the request's order), `request[f]` and
`partition_max_bytes[f]`; per batch `b` (sorted by fetch, then offset), `batch_fetch[b]` and
`batch_bytes[b]`. Returns, per batch, whether the response carries it (a prefix of each fetch's)."""

from __future__ import annotations

import numpy as np

__all__ = ["batches_taken"]


def batches_taken(request: np.ndarray, partition_max_bytes: np.ndarray, batch_fetch: np.ndarray,
                  batch_bytes: np.ndarray, response_max_bytes: int) -> np.ndarray:
    if len(batch_fetch) == 0:
        return np.zeros(0, dtype=bool)
    within = _within_partition_limit(partition_max_bytes, batch_fetch, batch_bytes)
    # the first batch of a request's first partition with batches goes in any case (KIP-74)
    first_of_fetch = np.r_[True, batch_fetch[1:] != batch_fetch[:-1]]
    batch_request = request[batch_fetch]
    first_of_request = first_of_fetch & np.r_[True, batch_request[1:] != batch_request[:-1]]
    taken = within | first_of_request
    totals = np.bincount(batch_request, weights=np.where(taken, batch_bytes, 0))
    over = np.flatnonzero(totals > response_max_bytes)
    for r in over:  # rare: the response limit cuts this request, partition by partition as Kafka reads
        taken[batch_request == r] = _read_request(partition_max_bytes, batch_fetch[batch_request == r],
                                                  batch_bytes[batch_request == r], response_max_bytes)
    return taken


def _within_partition_limit(partition_max_bytes: np.ndarray, batch_fetch: np.ndarray,
                            batch_bytes: np.ndarray) -> np.ndarray:
    """Batches within their partition's max bytes, counted from the fetch offset."""
    cumulative = np.cumsum(batch_bytes)
    start = np.r_[True, batch_fetch[1:] != batch_fetch[:-1]]
    before_fetch = np.maximum.accumulate(np.where(start, cumulative - batch_bytes, 0))
    return cumulative - before_fetch <= partition_max_bytes[batch_fetch]


def _read_request(partition_max_bytes: np.ndarray, batch_fetch: np.ndarray, batch_bytes: np.ndarray,
                  response_max_bytes: int) -> np.ndarray:
    """One request's partitions read in order into the bytes it has left (Kafka's loop)."""
    taken = np.zeros(len(batch_fetch), dtype=bool)
    left, min_one = response_max_bytes, True
    for f in np.unique(batch_fetch):
        at = np.flatnonzero(batch_fetch == f)
        fits = np.cumsum(batch_bytes[at]) <= min(partition_max_bytes[f], left)
        if not fits.any() and min_one:
            fits[0] = True
        taken[at] = fits
        read = int(batch_bytes[at][fits].sum())
        min_one = min_one and read == 0
        left = max(0, left - read)
    return taken
