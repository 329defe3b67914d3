"""How much of each partition a fetch response carries (Kafka's ReplicaManager.readFromLocalLog):
partitions in the request's order, each read up to min(its max bytes, the bytes the response has
left), whole record batches only; until a partition has returned data the first batch goes even
when it is larger than the limits (KIP-74), so a batch over the limits still moves.

Here a record batch is one produce request's records for one partition, as in Kafka.

Arrays: per partition fetch `f` (sorted by request, then the request's order), `request[f]` and
`partition_max_bytes[f]`; per batch `b` (sorted by fetch, then offset), `batch_fetch[b]` and
`batch_bytes[b]`. Returns, per batch, whether the response carries it (a prefix of each fetch's).

`respond` applies it to a bucket's fetches (bucket.py): each follower's response from its fetch
offset, first what a lagging follower read of its leader's log before the job (`Reads`), then this
round's batches, within the fetch limits (`partition_limits`) and the replication quotas."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.control.bucket import Appends, Partitions
from pipeline.control.replication_quota import ReplicationBudgets
from pipeline.control.round_context import RoundContext

__all__ = ["batches_taken", "Reads", "partition_limits", "respond"]


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


class Reads:
    """What each lagging follower read of its leader's log before the control job (state columns
    `read_bytes` and `read_ends`, data/catch_up.with_reads): per replica its count and where its
    records start in the flat `bytes` and `ends` (each record's size and offset + 1)."""

    def __init__(self, state: pa.Table, shape: tuple[int, int]) -> None:
        self.count = np.zeros(shape, dtype=np.int64)
        self.start = np.zeros(shape, dtype=np.int64)
        self.bytes = self.ends = np.zeros(0, dtype=np.int64)
        if "read_bytes" not in state.column_names or not state.num_rows:
            return
        outer = state.column("read_bytes").combine_chunks()
        inner = outer.flatten()
        per_row = outer.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        rows = np.repeat(np.arange(len(per_row)), per_row)
        cols = np.arange(len(inner)) - np.repeat(np.cumsum(per_row) - per_row, per_row)
        lengths = inner.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        self.count[rows, cols] = lengths
        self.start[rows, cols] = np.cumsum(lengths) - lengths
        self.bytes = inner.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
        self.ends = state.column("read_ends").combine_chunks().flatten().flatten() \
            .to_numpy(zero_copy_only=False).astype(np.int64)

    def end_after(self, taken: np.ndarray, otherwise: np.ndarray) -> np.ndarray:
        """The offset after each replica's `taken` first records read (`otherwise` where none)."""
        return _take(self.ends, self.start + taken - 1, taken > 0, otherwise)



def _take(values: np.ndarray, at: np.ndarray, where: np.ndarray, otherwise: np.ndarray | int) -> np.ndarray:
    """values[at] where `where`, else `otherwise` (`at` need not be valid elsewhere)."""
    out = np.array(np.broadcast_to(otherwise, at.shape), dtype=np.int64)
    out[where] = values[at[where]]
    return out



def partition_limits(brokers: np.ndarray, ctx: RoundContext) -> np.ndarray:
    """The partition limit of each fetch by `brokers` (replica.fetch.max.bytes, a throttled
    fetcher's own where it is lower)."""
    limits = np.full(brokers.shape, ctx.partition_max_bytes, dtype=np.int64)
    for broker, max_bytes in ctx.fetcher_max_bytes:
        limits[brokers == broker] = min(max_bytes, ctx.partition_max_bytes)
    return limits



def respond(parts: Partitions, appends: Appends, fetched: np.ndarray, reads: Reads, readable: np.ndarray,
             skip: tuple[np.ndarray, np.ndarray], reach: np.ndarray, ctx: RoundContext, quotas: ReplicationBudgets | None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One fetch's responses to the `fetched` followers (each pair of follower and leader one
    request), within the fetch limits: each partition's log from the follower's fetch offset, which
    is the `readable` records it read of the leader's log before the job after the first `skip[0]`,
    then, where those `reach` the leader's LEO before the round, this round's batches after the
    first `skip[1]`; with `quotas`, within the replication budgets left. Returns the records read,
    the batches and the records of batches each (partition, follower) received."""
    shape = fetched.shape
    read_taken, batches, records = (np.zeros(shape, dtype=np.int64) for _ in range(3))
    rows, cols = np.nonzero(fetched)
    if len(rows) == 0:
        return read_taken, batches, records
    fetcher_request = parts.fetcher_requests[rows, cols]
    # Kafka's fetcher moves partitions that returned data to the back: the request's order is the
    # last round each partition returned data, then the partition (rows are sorted by it)
    order = np.lexsort((rows, parts.arrays["last_data_round"][rows, cols], fetcher_request))
    rows, cols = rows[order], cols[order]
    request = np.unique(fetcher_request[order], return_inverse=True)[1]
    read_skip, batch_skip = skip[0][rows, cols], skip[1][rows, cols]
    n_read = np.maximum(readable[rows, cols] - read_skip, 0)
    n_batch = np.where(reach[rows, cols], np.maximum(appends.batches_of[rows] - batch_skip, 0), 0)
    total = n_read + n_batch
    unit_fetch = np.repeat(np.arange(len(rows)), total)  # each unit (a record read, a batch) in offset order
    within = np.arange(len(unit_fetch)) - np.repeat(np.cumsum(total) - total, total)
    is_read = within < n_read[unit_fetch]
    read_at = reads.start[rows, cols][unit_fetch] + read_skip[unit_fetch] + within
    batch_at = appends.first_batch[rows][unit_fetch] + batch_skip[unit_fetch] + within - n_read[unit_fetch]
    unit_bytes = np.where(is_read, _take(reads.bytes, read_at, is_read, 0),
                          _take(appends.batch_bytes, batch_at, ~is_read, 0))
    taken = batches_taken(request, partition_limits(parts.brokers[rows, cols], ctx), unit_fetch, unit_bytes,
                          ctx.response_max_bytes)
    if quotas is not None:  # (a replica in the ISR is never throttled)
        leader_col = np.argmax(parts.is_leader, axis=1)[rows]
        taken = quotas.carried(taken, unit_fetch, unit_bytes, parts.leader[rows].astype(np.int64),
                               parts.brokers[rows, cols].astype(np.int64), ~parts.in_isr[rows, cols],
                               (parts.throttle_listed["leader"][rows, leader_col],
                                parts.throttle_listed["follower"][rows, cols]))
    at = (rows[unit_fetch[taken]], cols[unit_fetch[taken]])
    np.add.at(read_taken, at, is_read[taken])
    np.add.at(batches, at, ~is_read[taken])
    np.add.at(records, at, _take(appends.batch_count, batch_at, ~is_read, 0)[taken])
    return read_taken, batches, records

