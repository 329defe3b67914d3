"""A bucket's partitions and requests as the rules' matrices: `Partitions` (one row per partition,
a `[partitions, replicas]` column per replica field, in replica order) and `Appends` (the bucket's
produce requests in append order per partition, with the leader's checks applied and base
offsets assigned)."""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.control import partition_health
from pipeline.control.fetch_session import NO_SESSION, CachedPartitions
from pipeline.control.leader_append import assign_base_offsets, produce_error
from pipeline.control.log_start import maybe_increment_log_start_offset
from pipeline.control.partition import maybe_expand_isr, maybe_increment_leader_hw
from pipeline.control.replica import (FetchState, effective_fetch_state, is_caught_up, reset_replica_state,
                                      update_fetch_state)
from pipeline.control.round_context import RoundContext
from pipeline.control.state import REPLICA_ARRAYS, lookup, padded
from pipeline.schemas import NO_LEADER

__all__ = ["Partitions", "Appends", "column", "partition_keys", "FULL", "SESSIONLESS", "INCREMENTAL", "ERROR", "NONE"]

_NOBODY = -1  # the broker of a padding column

# what a leader made of a follower's fetch request (fetch_session.Context.kind); NONE: none was sent
FULL, SESSIONLESS, INCREMENTAL, ERROR, NONE = range(5)
_KINDS = {"full": FULL, "sessionless": SESSIONLESS, "incremental": INCREMENTAL, "error": ERROR}


def column(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False)


def _pair(broker: np.ndarray, leader: np.ndarray) -> np.ndarray:
    """One int64 key per (fetching broker, leader): a fetcher's request to one leader."""
    return np.asarray(broker).astype(np.int64) * 2**32 + np.asarray(leader).astype(np.int64)


def partition_keys(table: pa.Table) -> pa.Array:
    partition = pc.fill_null(pc.cast(table.column("partition"), pa.string()), "?")
    return pc.binary_join_element_wise(table.column("topic"), partition, "\x00")



class Partitions:
    """The bucket's partition rows as the rules' matrices."""

    def __init__(self, state: pa.Table) -> None:
        self.table = state
        self.rf = state.column("replicas").combine_chunks().value_lengths().to_numpy(zero_copy_only=False) \
            if state.num_rows else np.zeros(0, dtype=np.int32)
        width = max(int(self.rf.max()) if len(self.rf) else 1, 1)
        self.brokers = padded(state.column("replicas"), width, _NOBODY, np.int32)
        self.exists = np.arange(width)[None, :] < self.rf[:, None]
        isr = state.column("isr")
        isr_width = max(int(pc.max(pc.list_value_length(isr)).as_py() or 1), 1) if state.num_rows else 1
        members = padded(isr, isr_width, -2, np.int32)
        self.in_isr = (self.brokers[:, :, None] == members[:, None, :]).any(axis=2) & self.exists
        self.leader = column(state, "leader").astype(np.int32)
        self.is_leader = (self.brokers == self.leader[:, None]) & self.exists
        self.arrays = {name: padded(state.column(name), width, 0, np.int64) for name in REPLICA_ARRAYS}
        self.high_watermark = column(state, "high_watermark").astype(np.int64)
        # every rule below takes the effective min ISR (control/partition_health.py; Kafka >= 3.7)
        self.min_isr = partition_health.effective_min_isr(column(state, "min_isr").astype(np.int64), self.rf)
        self.lag = column(state, "lag_time_max_ms").astype(np.int64)
        self.epoch_start = column(state, "leader_epoch_start_offset").astype(np.int64)
        leo = self.arrays["log_end_offset"]
        self.leader_leo = np.where(self.is_leader, leo, 0).sum(axis=1)
        self.serving = np.zeros(len(self.leader), dtype=bool)  # a leader that answers (set by the round)
        # the fetcher (a bucket) of each partition: a follower's request to a leader is per fetcher
        self.bucket = column(state, "bucket").astype(np.int64) if state.num_rows else np.zeros(0, dtype=np.int64)
        self.throttle_listed = {side: padded(state.column(f"{side}_throttle_listed"), width, False, bool)
                                if f"{side}_throttle_listed" in state.column_names
                                else np.zeros(self.brokers.shape, dtype=bool) for side in ("leader", "follower")}

    @functools.cached_property
    def fetcher_requests(self) -> np.ndarray:
        """Per replica, its fetcher's request to its leader (a dense id per fetcher and leader;
        brokers, leaders and buckets do not change within a round)."""
        pair = _pair(self.brokers, self.leader[:, None])
        if not pair.size:
            return np.zeros(pair.shape, dtype=np.int64)
        if (self.bucket == self.bucket[0]).all():  # (one fetcher: a request per leader)
            return np.unique(pair, return_inverse=True)[1].reshape(pair.shape)
        keys = np.stack([np.broadcast_to(self.bucket[:, None], pair.shape).ravel(), pair.ravel()])
        return np.unique(keys, axis=1, return_inverse=True)[1].reshape(pair.shape)

    def move_log_start(self, state: pa.Table) -> None:
        """The serving leaders' log start offsets after the round's delete_records and retention
        (`requested_log_start_offset`, a state column only when there are some). A leader that is
        down takes none: Kafka's admin client cannot reach it (LEADER_NOT_AVAILABLE), and its log
        directory may be gone (a failed one halted it)."""
        if "requested_log_start_offset" not in state.column_names or not state.num_rows:
            return
        requested = pc.fill_null(state.column("requested_log_start_offset"), -1).to_numpy(zero_copy_only=False)
        lso = self.arrays["log_start_offset"]
        moved = maybe_increment_log_start_offset(np.where(self.is_leader, lso, 0).sum(axis=1), self.high_watermark,
                                                 requested.astype(np.int64))
        self.arrays["log_start_offset"] = np.where(self.is_leader & self.serving[:, None], moved[:, None], lso)

    def requests(self, ctx: RoundContext) -> tuple[np.ndarray, np.ndarray]:
        """Each replica's fetch request this round as its leader took it (`ctx.fetch_contexts`):
        the kind (FULL, SESSIONLESS, INCREMENTAL, ERROR; NONE: no request) and the session."""
        shape = self.brokers.shape
        if not ctx.fetch_contexts:
            return np.full(shape, SESSIONLESS), np.full(shape, NO_SESSION, dtype=np.int64)
        keys = _pair(np.array([f for f, _, _, _ in ctx.fetch_contexts]),
                     np.array([leader for _, leader, _, _ in ctx.fetch_contexts]))
        kinds = np.array([_KINDS[kind] for _, _, kind, _ in ctx.fetch_contexts])
        ids = np.array([sid for _, _, _, sid in ctx.fetch_contexts], dtype=np.int64)
        pair = _pair(self.brokers, self.leader[:, None])
        return lookup(keys, kinds, pair, NONE), lookup(keys, ids, pair, NO_SESSION)

    def cache(self) -> CachedPartitions:
        a = self.arrays
        return CachedPartitions(a["session_id"], a["session_max_bytes"], a["session_high_watermark"],
                                a["session_leader_log_start_offset"])

    def set_cache(self, cache: CachedPartitions) -> None:
        self.arrays.update(session_id=cache.session_id, session_max_bytes=cache.max_bytes,
                           session_high_watermark=cache.high_watermark,
                           session_leader_log_start_offset=cache.leader_log_start_offset)

    def set_fetch_state(self, state: FetchState) -> None:
        self.arrays.update(last_fetch_time_ms=state.last_fetch_time_ms,
                           last_fetch_leader_leo=state.last_fetch_leader_leo,
                           last_caught_up_time_ms=state.last_caught_up_time_ms)

    def fetch_state(self) -> FetchState:
        return FetchState(self.arrays["last_fetch_time_ms"], self.arrays["last_fetch_leader_leo"],
                          self.arrays["last_caught_up_time_ms"])

    def high_watermark_after(self, hw: np.ndarray, leader_leo: np.ndarray, ctx: RoundContext) -> np.ndarray:
        """maybeIncrementLeaderHW with the replicas' current fetch state."""
        fetch_offset = self.arrays["fetch_offset"]
        eligible = ~np.isin(self.brokers, ctx.ineligible_brokers) & ~self.is_leader
        may_join = eligible & is_caught_up(fetch_offset, leader_leo[:, None], self.arrays["last_caught_up_time_ms"],
                                           ctx.now_ms, self.lag[:, None])
        replica_leo = np.where(self.is_leader, leader_leo[:, None], fetch_offset)
        moved = maybe_increment_leader_hw(hw, replica_leo, self.exists, self.is_leader, self.in_isr, may_join,
                                          self.min_isr)
        return np.where(self.serving, moved, hw)  # only a leader moves its HW

    def quiescent_fetches(self, ctx: RoundContext) -> None:
        """replica.effective_fetch_state of every follower at its leader's LEO whose broker's last
        fetch is known: rounds that had nothing to do wrote no fetch state."""
        if not ctx.broker_last_fetch_ms:
            return
        brokers, times = (np.array(v, dtype=np.int64) for v in zip(*ctx.broker_last_fetch_ms))
        last_fetch = lookup(brokers, times, self.brokers, -1)
        quiescent = (self.exists & ~self.is_leader & (last_fetch >= 0)
                     & (self.arrays["fetch_offset"] >= self.leader_leo[:, None]))
        after = effective_fetch_state(self.fetch_state(), quiescent, np.maximum(last_fetch, 0),
                                      self.leader_leo[:, None])
        self.set_fetch_state(after)

    def reset(self, ctx: RoundContext) -> None:
        """Replica.resetReplicaState of every follower not paused, as a restarted leader does."""
        reset = (self.exists & ~self.is_leader & self.is_leader.any(axis=1)[:, None]
                 & ~np.isin(self.brokers, ctx.paused_brokers))
        after = reset_replica_state(self.fetch_state(), self.in_isr, self.leader_leo[:, None], ctx.now_ms, reset)
        self.set_fetch_state(after)

    def fetch(self, fetched: np.ndarray, fetch_offset: np.ndarray, leader_leo: np.ndarray, hw: np.ndarray,
              ctx: RoundContext) -> np.ndarray:
        """A fetch by the `fetched` followers at `fetch_offset`: their fetch state, and the joiners
        the leader adds to the ISR at it (returned)."""
        after = update_fetch_state(self.fetch_state(), fetch_offset, leader_leo[:, None], ctx.now_ms, fetched)
        self.set_fetch_state(after)
        self.arrays["fetch_offset"] = np.where(fetched, fetch_offset, self.arrays["fetch_offset"])
        eligible = ~np.isin(self.brokers, ctx.ineligible_brokers)  # Kafka's isReplicaIsrEligible
        joiners = maybe_expand_isr(self.in_isr, fetched & eligible, self.arrays["fetch_offset"], hw, self.epoch_start)
        self.in_isr = self.in_isr | joiners
        return joiners



class Appends:
    """The bucket's requests, in append order per partition, with the leader's checks applied."""

    def __init__(self, requests: pa.Table, parts: "Partitions") -> None:
        index = pc.index_in(partition_keys(requests), value_set=partition_keys(parts.table)).fill_null(-1) \
            .to_numpy(zero_copy_only=False).astype(np.int64) if requests.num_rows else np.zeros(0, dtype=np.int64)
        keyed = requests.append_column("_index", pa.array(index, type=pa.int64()))
        order = pc.sort_indices(keyed, sort_keys=[("_index", "ascending"), ("append_order", "ascending"),
                                                  ("request_id", "ascending"), ("batch", "ascending")]).to_numpy()
        self.table = requests.take(pa.array(order, type=pa.int64()))
        self.index = index[order]
        self.known = self.index >= 0
        at = np.where(self.known, self.index, 0)
        self.at = at
        self.count = column(self.table, "record_count").astype(np.int64)
        self.bytes = column(self.table, "bytes").astype(np.int64)
        self.acks = column(self.table, "acks").astype(np.int64)
        pending = column(self.table, "is_pending").astype(bool)
        # a (request, partition)'s batches are consecutive rows: it is accepted or refused whole
        request_id = column(self.table, "request_id").astype(object)
        starts = np.r_[True, (self.index[1:] != self.index[:-1]) | (request_id[1:] != request_id[:-1])] \
            if len(order) else np.zeros(0, dtype=bool)
        self.part = np.cumsum(starts) - 1  # the (request, partition) of each batch
        self.part_first = np.flatnonzero(starts)
        self.part_last = np.r_[self.part_first[1:] - 1, len(order) - 1].astype(np.int64) if len(order) else starts
        record_error = column(self.table, "record_error").astype(object)
        failed = np.flatnonzero(record_error != None)  # noqa: E711 (element-wise)
        part_error = np.full(len(self.part_first), None, dtype=object)
        part_error[self.part[failed]] = record_error[failed]
        isr_size = parts.in_isr.sum(axis=1)
        leader = np.where(parts.serving, parts.leader, NO_LEADER)[at] if len(parts.leader) \
            else np.zeros(len(at), dtype=np.int32)
        error = produce_error(self.known, leader, self.acks, isr_size[at] if len(isr_size) else at,
                              parts.min_isr[at] if len(parts.min_isr) else at, part_error[self.part])
        self.error = np.where(pending, None, error).astype(object)
        duplicate = column(self.table, "is_duplicate").astype(bool)
        self.accepted = ~pending & ~duplicate & (self.error == None)  # noqa: E711 (element-wise)
        # the requests answered with offsets: appended now, pending, or a retry not refused
        self.answered = self.accepted | pending | (duplicate & (self.error == None))  # noqa: E711
        base, self.leader_leo = assign_base_offsets(at, self.count, self.accepted, parts.leader_leo)
        given = pending | duplicate  # (offsets appended in an earlier round)
        self.base = np.where(given, np.nan_to_num(column(self.table, "base_offset").astype(float), nan=-1), base) \
            .astype(np.int64)
        self.last = np.where(given, np.nan_to_num(column(self.table, "last_offset").astype(float), nan=-1),
                             base + self.count - 1).astype(np.int64)
        self._repeat_offsets(duplicate, request_id)
        # this round's batches per partition: the accepted requests, contiguous from the old LEO
        batch = np.flatnonzero(self.accepted)
        self.batch_partition, self.batch_count, self.batch_bytes = at[batch], self.count[batch], self.bytes[batch]
        n = len(parts.leader)
        self.batches_of = np.bincount(self.batch_partition, minlength=n) if n else np.zeros(0, dtype=np.int64)
        self.first_batch = np.cumsum(self.batches_of) - self.batches_of


    def _repeat_offsets(self, duplicate: np.ndarray, request_id: np.ndarray) -> None:
        """A retry of a request appended this round takes that request's offsets (its first
        batch's base, its last batch's last offset); the retry and it are of one partition."""
        repeats = np.flatnonzero(duplicate & (column(self.table, "duplicate_of") != None))  # noqa: E711
        if not len(repeats):
            return
        first, last = self.part_first, self.part_last
        appended = {(request_id[f], self.index[f]): (self.base[f], self.last[l])
                    for f, l in zip(first, last) if self.accepted[f]}
        of = column(self.table, "duplicate_of").astype(object)
        for row in repeats:
            self.base[row], self.last[row] = appended.get((of[row], self.index[row]), (-1, -1))

