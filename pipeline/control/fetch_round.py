"""One fetch round's rules over a bucket of partitions (DESIGN.md, "Round v2", 3), pure: the
partition state and the inbox summary of the bucket in, each partition's state after the round
with its produce results, its fetches and its figures out (Arrow tables, as the control job's
`applyInArrow` passes them).

In order, per partition, as Kafka's leader and fetcher threads do it:
1. leader append: the checks that refuse a request, then base offsets from the leader's LEO;
2. each follower's fetch at its LEO: the leader's fetch state (Replica.updateFetchState), ISR
   expansion at the fetch, the HW; the response within the fetch limits, followers append;
3. the follow-up fetch of every follower whose response carried records (its fetcher fetches again
   at once), which proves what it wrote: fetch state, expansion, HW again, and a response with
   what the first had no room for;
4. ISR shrink, judged on each replica's state after the round's fetches, and the HW after it;
5. acks against that HW.
A follower behind the leader's LEO before the round (lagging) read a range of the leader's log
before the job (data/catch_up.py): its responses take from it within their limits, as they take
this round's batches (listed with `from_batch` false), and this round's batches after it once it
reached the leader's LEO before the round."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline.control import partition_health
from pipeline.control import acks as acks_rule
from pipeline.control.fetch_response import batches_taken
from pipeline.control.fetch_session import (NO_SESSION, UNKNOWN, CachedPartitions, cache_after_response,
                                            must_respond, request_carries)
from pipeline.control.leader_append import assign_base_offsets, produce_error
from pipeline.control.log_start import follower_log_start_offset, maybe_increment_log_start_offset
from pipeline.control.partition import maybe_expand_isr, maybe_increment_leader_hw, out_of_sync_replicas
from pipeline.control.replication_quota import ReplicationBudgets
from pipeline.control.replica import (FetchState, effective_fetch_state, is_caught_up, reset_replica_state,
                                      update_fetch_state)
from pipeline.control.state import CONTROL_OUTPUT_SCHEMA, REPLICA_ARRAYS, SESSION_ARRAYS, as_lists, lookup, padded
from pipeline.schemas import NO_LEADER

__all__ = ["RoundContext", "SessionFigures", "fetch_round", "fetch_round_and_sessions"]

_NOBODY = -1  # the broker of a padding column
# what a leader made of a follower's fetch request (fetch_session.Context.kind); _NONE: none was sent
_FULL, _SESSIONLESS, _INCREMENTAL, _ERROR, _NONE = range(5)
_KINDS = {"full": _FULL, "sessionless": _SESSIONLESS, "incremental": _INCREMENTAL, "error": _ERROR}


@dataclass(frozen=True)
class RoundContext:
    """The driver's O(brokers) inputs to the rules: the round, its time, the brokers whose fetchers
    run (live, not paused) and those that may not be in an ISR (stopped or fenced), the fetch limits;
    `restarted`: the first round of a process over an existing cluster, whose leaders reset their
    followers' fetch state first (except those of `paused_brokers`: a paused fetcher stays paused
    across the restart)."""

    round_id: int
    now_ms: int
    fetching_brokers: tuple[int, ...]
    ineligible_brokers: tuple[int, ...] = ()
    partition_max_bytes: int = 1_048_576  # replica.fetch.max.bytes
    # (broker, its fetcher's partition limit) where it is lower: a slow follower
    # (Cluster.throttle_fetcher: at most that many bytes of a partition a fetch, one record at least)
    fetcher_max_bytes: tuple[tuple[int, int], ...] = ()
    response_max_bytes: int = 10_485_760  # replica.fetch.response.max.bytes
    restarted: bool = False
    paused_brokers: tuple[int, ...] = ()
    # (broker, its fetcher's last fetch before this round: the last round, or when it was paused);
    # a follower at its leader's LEO was caught up then (replica.effective_fetch_state)
    broker_last_fetch_ms: tuple[tuple[int, int], ...] = ()
    # what each leader made of each follower's fetch request this round (KIP-227, decided by the
    # driver: fetch_session.round_contexts): (follower, leader, kind, session id), kind 'full',
    # 'sessionless', 'incremental' or 'error' (the request is answered with an error and carries
    # nothing). Empty: every follower fetches in full without a session.
    fetch_contexts: tuple[tuple[int, int, str, int], ...] = ()
    # replication quotas (KIP-73): (broker, the bytes it may move this round) of each leader and
    # follower broker with a throttled rate (round/driver.py's _throttle_budgets; absent: unlimited). The
    # state then lists each replica's throttle (bool arrays `leader_throttle_listed` and
    # `follower_throttle_listed`: its topic's throttled-replicas lists name it), and a broker's
    # budget is shared by all its partitions: the control job runs them in one task
    leader_budgets: tuple[tuple[int, int], ...] = ()
    follower_budgets: tuple[tuple[int, int], ...] = ()

    @property
    def throttled(self) -> bool:
        return bool(self.leader_budgets or self.follower_budgets)


@dataclass(frozen=True)
class SessionFigures:
    """What a bucket's round did beyond its partition rows: to the leaders' fetch sessions (the
    sessions whose fetcher sent a follow-up fetch, each moving to its next epoch, and the
    partitions each incremental request added to its session), and the brokers whose replicas'
    log start offsets moved (their logs drop the records below)."""

    followed_up: frozenset = frozenset()
    added: dict = field(default_factory=dict)  # session id -> partitions added
    log_start_brokers: frozenset = frozenset()
    throttled_bytes: dict = field(default_factory=dict)  # ("leader" | "follower", broker) -> bytes drawn


def _np(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False)


def _pair(broker: np.ndarray, leader: np.ndarray) -> np.ndarray:
    """One int64 key per (fetching broker, leader): a fetcher's request to one leader."""
    return np.asarray(broker).astype(np.int64) * 2**32 + np.asarray(leader).astype(np.int64)


def _keys(table: pa.Table) -> pa.Array:
    partition = pc.fill_null(pc.cast(table.column("partition"), pa.string()), "?")
    return pc.binary_join_element_wise(table.column("topic"), partition, "\x00")


class _Partitions:
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
        self.leader = _np(state, "leader").astype(np.int32)
        self.is_leader = (self.brokers == self.leader[:, None]) & self.exists
        self.arrays = {name: padded(state.column(name), width, 0, np.int64) for name in REPLICA_ARRAYS}
        self.high_watermark = _np(state, "high_watermark").astype(np.int64)
        # every rule below takes the effective min ISR (control/partition_health.py; Kafka >= 3.7)
        self.min_isr = partition_health.effective_min_isr(_np(state, "min_isr").astype(np.int64), self.rf)
        self.lag = _np(state, "lag_time_max_ms").astype(np.int64)
        self.epoch_start = _np(state, "leader_epoch_start_offset").astype(np.int64)
        leo = self.arrays["log_end_offset"]
        self.leader_leo = np.where(self.is_leader, leo, 0).sum(axis=1)
        self.serving = np.zeros(len(self.leader), dtype=bool)  # a leader that answers (set by the round)
        # the fetcher (a bucket) of each partition: a follower's request to a leader is per fetcher
        self.bucket = _np(state, "bucket").astype(np.int64) if state.num_rows else np.zeros(0, dtype=np.int64)
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
        """The leaders' log start offsets after the round's delete_records and retention
        (`requested_log_start_offset`, a state column only when there are some)."""
        if "requested_log_start_offset" not in state.column_names or not state.num_rows:
            return
        requested = pc.fill_null(state.column("requested_log_start_offset"), -1).to_numpy(zero_copy_only=False)
        lso = self.arrays["log_start_offset"]
        moved = maybe_increment_log_start_offset(np.where(self.is_leader, lso, 0).sum(axis=1), self.high_watermark,
                                                 requested.astype(np.int64))
        self.arrays["log_start_offset"] = np.where(self.is_leader, moved[:, None], lso)

    def requests(self, ctx: RoundContext) -> tuple[np.ndarray, np.ndarray]:
        """Each replica's fetch request this round as its leader took it (`ctx.fetch_contexts`):
        the kind (_FULL, _SESSIONLESS, _INCREMENTAL, _ERROR; _NONE: no request) and the session."""
        shape = self.brokers.shape
        if not ctx.fetch_contexts:
            return np.full(shape, _SESSIONLESS), np.full(shape, NO_SESSION, dtype=np.int64)
        keys = _pair(np.array([f for f, _, _, _ in ctx.fetch_contexts]),
                     np.array([leader for _, leader, _, _ in ctx.fetch_contexts]))
        kinds = np.array([_KINDS[kind] for _, _, kind, _ in ctx.fetch_contexts])
        ids = np.array([sid for _, _, _, sid in ctx.fetch_contexts], dtype=np.int64)
        pair = _pair(self.brokers, self.leader[:, None])
        return lookup(keys, kinds, pair, _NONE), lookup(keys, ids, pair, NO_SESSION)

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


class _Appends:
    """The bucket's requests, in append order per partition, with the leader's checks applied."""

    def __init__(self, requests: pa.Table, parts: _Partitions) -> None:
        index = pc.index_in(_keys(requests), value_set=_keys(parts.table)).fill_null(-1) \
            .to_numpy(zero_copy_only=False).astype(np.int64) if requests.num_rows else np.zeros(0, dtype=np.int64)
        keyed = requests.append_column("_index", pa.array(index, type=pa.int64()))
        order = pc.sort_indices(keyed, sort_keys=[("_index", "ascending"), ("append_order", "ascending"),
                                                  ("request_id", "ascending"), ("batch", "ascending")]).to_numpy()
        self.table = requests.take(pa.array(order, type=pa.int64()))
        self.index = index[order]
        self.known = self.index >= 0
        at = np.where(self.known, self.index, 0)
        self.at = at
        self.count = _np(self.table, "record_count").astype(np.int64)
        self.bytes = _np(self.table, "bytes").astype(np.int64)
        self.acks = _np(self.table, "acks").astype(np.int64)
        pending = _np(self.table, "is_pending").astype(bool)
        # a (request, partition)'s batches are consecutive rows: it is accepted or refused whole
        request_id = _np(self.table, "request_id").astype(object)
        starts = np.r_[True, (self.index[1:] != self.index[:-1]) | (request_id[1:] != request_id[:-1])] \
            if len(order) else np.zeros(0, dtype=bool)
        self.part = np.cumsum(starts) - 1  # the (request, partition) of each batch
        self.part_first = np.flatnonzero(starts)
        self.part_last = np.r_[self.part_first[1:] - 1, len(order) - 1].astype(np.int64) if len(order) else starts
        record_error = _np(self.table, "record_error").astype(object)
        failed = np.flatnonzero(record_error != None)  # noqa: E711 (element-wise)
        part_error = np.full(len(self.part_first), None, dtype=object)
        part_error[self.part[failed]] = record_error[failed]
        isr_size = parts.in_isr.sum(axis=1)
        leader = np.where(parts.serving, parts.leader, NO_LEADER)[at] if len(parts.leader) \
            else np.zeros(len(at), dtype=np.int32)
        error = produce_error(self.known, leader, self.acks, isr_size[at] if len(isr_size) else at,
                              parts.min_isr[at] if len(parts.min_isr) else at, part_error[self.part])
        self.error = np.where(pending, None, error).astype(object)
        duplicate = _np(self.table, "is_duplicate").astype(bool)
        self.accepted = ~pending & ~duplicate & (self.error == None)  # noqa: E711 (element-wise)
        # the requests answered with offsets: appended now, pending, or a retry not refused
        self.answered = self.accepted | pending | (duplicate & (self.error == None))  # noqa: E711
        base, self.leader_leo = assign_base_offsets(at, self.count, self.accepted, parts.leader_leo)
        given = pending | duplicate  # (offsets appended in an earlier round)
        self.base = np.where(given, np.nan_to_num(_np(self.table, "base_offset").astype(float), nan=-1), base) \
            .astype(np.int64)
        self.last = np.where(given, np.nan_to_num(_np(self.table, "last_offset").astype(float), nan=-1),
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
        repeats = np.flatnonzero(duplicate & (_np(self.table, "duplicate_of") != None))  # noqa: E711
        if not len(repeats):
            return
        first, last = self.part_first, self.part_last
        appended = {(request_id[f], self.index[f]): (self.base[f], self.last[l])
                    for f, l in zip(first, last) if self.accepted[f]}
        of = _np(self.table, "duplicate_of").astype(object)
        for row in repeats:
            self.base[row], self.last[row] = appended.get((of[row], self.index[row]), (-1, -1))


class _Reads:
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


def _respond(parts: _Partitions, appends: _Appends, fetched: np.ndarray, reads: _Reads, readable: np.ndarray,
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
    taken = batches_taken(request, _partition_limits(parts.brokers[rows, cols], ctx), unit_fetch, unit_bytes,
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


def fetch_round(state: pa.Table, requests: pa.Table, ctx: RoundContext) -> pa.Table:
    """The bucket's partitions after the round (CONTROL_OUTPUT_SCHEMA)."""
    return fetch_round_and_sessions(state, requests, ctx)[0]


def _partition_limits(brokers: np.ndarray, ctx: RoundContext) -> np.ndarray:
    """The partition limit of each fetch by `brokers` (replica.fetch.max.bytes, a throttled
    fetcher's own where it is lower)."""
    limits = np.full(brokers.shape, ctx.partition_max_bytes, dtype=np.int64)
    for broker, max_bytes in ctx.fetcher_max_bytes:
        limits[brokers == broker] = min(max_bytes, ctx.partition_max_bytes)
    return limits


def fetch_round_and_sessions(state: pa.Table, requests: pa.Table, ctx: RoundContext
                             ) -> tuple[pa.Table, SessionFigures]:
    """The bucket's partitions after the round (CONTROL_OUTPUT_SCHEMA), and what the round did to
    the leaders' fetch sessions (their follow-ups and the partitions incremental requests added)."""
    state = state.sort_by([("topic", "ascending"), ("partition", "ascending")])
    parts = _Partitions(state)
    if ctx.restarted:
        parts.reset(ctx)
    parts.quiescent_fetches(ctx)
    parts.move_log_start(state)
    # a leader that is down (stopped, not yet fenced) answers nothing: its partitions have no leader
    # for the round (NOT_LEADER_OR_FOLLOWER to producers) until the controller fences it
    parts.serving = parts.is_leader.any(axis=1) & ~np.isin(parts.leader, ctx.ineligible_brokers)
    appends = _Appends(requests, parts)
    leo_new = appends.leader_leo
    kind, session = parts.requests(ctx)
    incremental = kind == _INCREMENTAL
    sessioned = np.isin(kind, (_FULL, _INCREMENTAL)) & (session != NO_SESSION)
    followers = (parts.exists & ~parts.is_leader & np.isin(parts.brokers, ctx.fetching_brokers)
                 & parts.serving[:, None] & np.isin(kind, (_FULL, _SESSIONLESS, _INCREMENTAL)))
    own_leo = parts.arrays["log_end_offset"]
    # a follower past the leader's LEO diverges and truncates first (not in this step's scope)
    fetched = followers & (own_leo <= parts.leader_leo[:, None])
    lagging = fetched & (own_leo < parts.leader_leo[:, None])
    leader_lso = np.where(parts.is_leader, parts.arrays["log_start_offset"], 0).sum(axis=1)[:, None]
    # (a fetching follower takes its leader's log start offset from the response)
    parts.arrays["log_start_offset"] = np.where(fetched, follower_log_start_offset(parts.arrays["log_start_offset"],
                                                                                  leader_lso),
                                                parts.arrays["log_start_offset"])
    max_bytes = _partition_limits(parts.brokers, ctx)
    cache = parts.cache()
    cached = cache.session_id == session
    # KIP-227: an incremental request carries the partitions added to its session or altered; a
    # full one all (the follower's log start offset, which the request also carries, does not move
    # in a round v2 runs)
    requested = fetched & np.where(incremental, request_carries(cached, own_leo, parts.arrays["fetch_offset"],
                                                                max_bytes, cache.max_bytes), True)
    added = fetched & incremental & ~cached

    hw = parts.high_watermark
    joined_first = parts.fetch(fetched, own_leo, leo_new, hw, ctx)                      # 2. fetch
    hw = parts.high_watermark_after(hw, leo_new, ctx)
    zero = np.zeros(fetched.shape, dtype=np.int64)
    # a lagging follower's log to fetch is what it read of the leader's log before the job, and this
    # round's batches after it when that reached the leader's LEO before the round
    reads = _Reads(state, fetched.shape)
    readable = np.where(lagging, reads.count, 0)
    reach = ~lagging | (reads.end_after(readable, zero) >= parts.leader_leo[:, None])
    quotas = ReplicationBudgets(ctx.leader_budgets, ctx.follower_budgets) if ctx.throttled else None
    read_first, batches_first, batch_records = _respond(parts, appends, fetched, reads, readable, (zero, zero),
                                                        reach, ctx, quotas)
    first = read_first + batch_records
    leo_after = np.where(batch_records > 0, parts.leader_leo[:, None] + batch_records,
                         reads.end_after(read_first, own_leo))
    got = first > 0
    responded = fetched & np.where(incremental, must_respond(
        first, hw[:, None], np.where(cached, cache.high_watermark, UNKNOWN), leader_lso,
        np.where(cached, cache.leader_log_start_offset, UNKNOWN)), True)
    cache = cache_after_response(cache, fetched, np.where(sessioned, session, NO_SESSION), max_bytes, responded,
                                 hw[:, None], leader_lso)
    replica_hw = np.where(responded, np.minimum(hw[:, None], leo_after), parts.arrays["replica_high_watermark"])
    last_data_round = np.where(got, ctx.round_id, parts.arrays["last_data_round"])
    parts.arrays["last_data_round"] = last_data_round
    # 3. the follow-up: every follower whose response carried records fetches again at once, in its
    # session an incremental request (the partitions whose fetch offset moved) and response
    request = parts.fetcher_requests
    follow = fetched & np.isin(request, request[got])
    offered = parts.arrays["fetch_offset"]
    requested_again = follow & np.where(sessioned, request_carries(cache.session_id == session, leo_after, offered,
                                                                   max_bytes, cache.max_bytes), True)
    joined_again = parts.fetch(follow, leo_after, leo_new, hw, ctx)
    hw = parts.high_watermark_after(hw, leo_new, ctx)
    # (its response goes on where the first stopped: in what the follower read, or in the batches)
    # (a throttled fetcher's limit is per round: its follow-up proves its LEO and carries nothing)
    slow = np.isin(parts.brokers, [broker for broker, _ in ctx.fetcher_max_bytes])
    read_more, _, batch_more = _respond(parts, appends, follow & ~slow, reads, readable, (read_first, batches_first),
                                        reach, ctx, quotas)
    more = read_more + batch_more
    read, from_batch = read_first + read_more, batch_records + batch_more
    leo_after = np.where(from_batch > 0, parts.leader_leo[:, None] + from_batch, reads.end_after(read, own_leo))
    responded_again = follow & np.where(sessioned, must_respond(more, hw[:, None], cache.high_watermark, leader_lso,
                                                                cache.leader_log_start_offset), True)
    cache = cache_after_response(cache, follow, np.where(sessioned, session, NO_SESSION), max_bytes,
                                 responded_again, hw[:, None], leader_lso)
    parts.set_cache(cache)
    replica_hw = np.where(responded_again, np.minimum(hw[:, None], leo_after), replica_hw)
    parts.arrays["last_data_round"] = np.where(more > 0, ctx.round_id, last_data_round)
    # 4. shrink, on the state after every fetch of the round; the HW the smaller ISR allows
    shrunk = out_of_sync_replicas(parts.in_isr, parts.is_leader, parts.arrays["fetch_offset"], leo_new,
                                  parts.arrays["last_caught_up_time_ms"], ctx.now_ms, parts.lag) & parts.serving[:, None]
    parts.in_isr = parts.in_isr & ~shrunk
    hw = parts.high_watermark_after(hw, leo_new, ctx)
    # (a follower whose log ended below its leader's log start starts its log there)
    parts.arrays["log_end_offset"] = np.where(parts.is_leader, leo_new[:, None],
                                              np.maximum(leo_after, np.where(fetched, leader_lso, 0)))
    parts.arrays["fetch_offset"] = np.where(parts.is_leader, leo_new[:, None], parts.arrays["fetch_offset"])
    parts.arrays["replica_high_watermark"] = np.where(parts.is_leader, hw[:, None], replica_hw)
    changes = joined_first.any(axis=1).astype(int) + joined_again.any(axis=1) + shrunk.any(axis=1)
    entries = ((requested.sum(axis=1) + requested_again.sum(axis=1)),
               (responded.sum(axis=1) + responded_again.sum(axis=1)))
    out = _output(state, parts, appends, hw, changes, (joined_first | joined_again, shrunk),
                  (own_leo, reads.end_after(read, own_leo), read, from_batch, fetched), entries, ctx)
    ids, counts = np.unique(session[added], return_counts=True)
    moved = (parts.arrays["log_start_offset"] > padded(state.column("log_start_offset"), parts.brokers.shape[1], 0,
                                                       np.int64)) & parts.exists
    return out, SessionFigures(frozenset(session[follow & sessioned].tolist()),
                               dict(zip(ids.tolist(), counts.tolist())), frozenset(parts.brokers[moved].tolist()),
                               quotas.drawn if quotas is not None else {})


def _output(state: pa.Table, parts: _Partitions, appends: _Appends, hw: np.ndarray, changes: np.ndarray,
            isr_moves: tuple, fetch: tuple, entries: tuple, ctx: RoundContext) -> pa.Table:
    joined, shrunk = isr_moves
    own_leo, read_end, read, from_batch, fetched = fetch
    n = state.num_rows
    isr_size = parts.in_isr.sum(axis=1)
    status, code = acks_rule.request_status(appends.error, appends.acks, appends.last, hw[appends.at],
                                            isr_size[appends.at] if n else appends.at,
                                            parts.min_isr[appends.at] if n else appends.at)
    # one result per (request, partition): its first batch's base offset, its last batch's last
    # offset and status (the acks wait for the whole request), its records
    first, last = appends.part_first, appends.part_last
    offsets = appends.answered[first]
    results = pa.StructArray.from_arrays(
        [appends.table.column("request_id").combine_chunks().take(pa.array(first, type=pa.int64())),
         pa.array(np.where(offsets, appends.base[first], None), type=pa.int64()),
         pa.array(np.where(offsets, appends.last[last], None), type=pa.int64()),
         pa.array(np.bincount(appends.part, weights=appends.count, minlength=len(first)).astype(np.int64)
                  if len(first) else first, type=pa.int64()),
         pa.array(appends.acks[first], type=pa.int32()),
         pa.array(status[last], type=pa.string()), pa.array(code[last], type=pa.string())],
        fields=list(CONTROL_OUTPUT_SCHEMA_ARROW.field("results").type.value_type))
    known = appends.known[first]
    per_partition = np.bincount(appends.index[first][known], minlength=n) if n else np.zeros(0, dtype=np.int64)
    result_offsets = np.r_[0, np.cumsum(per_partition)].astype(np.int32)
    leader_leo_before = parts.leader_leo
    # what each follower took: the range of the leader's log a lagging one read (the data plane
    # holds its rows), then its slice of this round's batch, from the leader's LEO before the round
    read_rows, read_cols = np.nonzero(read > 0)
    batch_rows, batch_cols = np.nonzero(from_batch > 0)
    batch_from = np.broadcast_to(leader_leo_before[:, None], from_batch.shape)
    rows = np.r_[read_rows, batch_rows]
    order = np.argsort(rows, kind="stable")
    brokers = np.r_[parts.brokers[read_rows, read_cols], parts.brokers[batch_rows, batch_cols]]
    starts = np.r_[own_leo[read_rows, read_cols], batch_from[batch_rows, batch_cols]]
    ends = np.r_[read_end[read_rows, read_cols], (batch_from + from_batch)[batch_rows, batch_cols]]
    kinds = np.r_[np.zeros(len(read_rows), dtype=bool), np.ones(len(batch_rows), dtype=bool)]
    fetches = pa.StructArray.from_arrays(
        [pa.array(brokers[order], type=pa.int32()), pa.array(starts[order], type=pa.int64()),
         pa.array(ends[order], type=pa.int64()), pa.array(kinds[order], type=pa.bool_())],
        fields=list(CONTROL_OUTPUT_SCHEMA_ARROW.field("fetches").type.value_type))
    listed = (read > 0) | (from_batch > 0)
    fetch_offsets = np.r_[0, np.cumsum((read > 0).sum(axis=1) + (from_batch > 0).sum(axis=1))].astype(np.int32)
    leo_new = appends.leader_leo
    lso = parts.arrays["log_start_offset"]
    leader_lso = np.where(parts.is_leader, lso, 0).sum(axis=1)
    # (a fetching follower that answered before the HW moved learns it at its next fetch, as Kafka's
    # leader answers a waiting fetch when its HW moves: until then the partition is not settled)
    hw_known = ((parts.arrays["replica_high_watermark"] == hw[:, None]) | parts.is_leader
                | ~np.isin(parts.brokers, ctx.fetching_brokers))
    followers_settled = np.where(parts.exists, parts.in_isr & (parts.arrays["log_end_offset"] == leo_new[:, None])
                                 & ((lso == leader_lso[:, None]) | ~parts.serving[:, None]) & hw_known,
                                 True).all(axis=1)
    width = parts.brokers.shape[1]
    state_moved = np.zeros(n, dtype=bool)
    for name in (*SESSION_ARRAYS, "log_start_offset"):  # (a leader's session cache entry is replica state)
        state_moved |= ((padded(state.column(name), width, 0, np.int64) != parts.arrays[name]) & parts.exists).any(axis=1)
    columns = {name: state.column(name) for name in ("topic", "partition", "bucket", "leader", "leader_epoch",
                                                      "leader_epoch_start_offset", "replicas", "adding_replicas", "min_isr",
                                                      "lag_time_max_ms")}
    columns.update(
        partition_epoch=pa.array(_np(state, "partition_epoch") + changes, type=pa.int32()),
        isr=as_lists(parts.brokers, parts.in_isr, pa.int32()),
        high_watermark=pa.array(hw, type=pa.int64()),
        **{name: as_lists(parts.arrays[name], parts.exists, pa.int64()) for name in parts.arrays},
        is_known=pa.array(np.ones(n, dtype=bool)),
        results=pa.ListArray.from_arrays(pa.array(result_offsets), results.take(pa.array(np.flatnonzero(known)))),
        fetches=pa.ListArray.from_arrays(pa.array(fetch_offsets), fetches),
        records_appended=pa.array(leo_new - leader_leo_before, type=pa.int64()),
        records_replicated=pa.array(np.where(fetched, read + from_batch, 0).sum(axis=1), type=pa.int64()),
        isr_shrinks=pa.array(shrunk.sum(axis=1), type=pa.int32()),
        isr_expands=pa.array(joined.sum(axis=1), type=pa.int32()),
        fetch_request_partitions=pa.array(entries[0], type=pa.int32()),
        fetch_response_partitions=pa.array(entries[1], type=pa.int32()),
        is_settled=pa.array(followers_settled & (hw == leo_new), type=pa.bool_()),
        is_changed=pa.array((leo_new > leader_leo_before) | listed.any(axis=1) | (changes > 0) | (per_partition > 0)
                            | state_moved
                            | (hw != parts.high_watermark) | ~(followers_settled & (hw == leo_new)), type=pa.bool_()),
    )
    out = pa.table([columns[f.name] for f in CONTROL_OUTPUT_SCHEMA_ARROW], schema=CONTROL_OUTPUT_SCHEMA_ARROW)
    # (Spark takes the output only in its own Arrow types: list fields named "element", non-null fields)
    return pa.concat_tables([out, _unknown_rows(appends, results)]).cast(_SPARK_ARROW_SCHEMA)


def _unknown_rows(appends: _Appends, results: pa.StructArray) -> pa.Table:
    """A row per unknown (topic, partition) of the requests, carrying their results only."""
    unknown = np.flatnonzero(~appends.known[appends.part_first])  # (request, partition)s, as `results`
    if len(unknown) == 0:
        return CONTROL_OUTPUT_SCHEMA_ARROW.empty_table()
    table = appends.table.take(pa.array(appends.part_first[unknown], type=pa.int64()))
    keys, first, inverse = np.unique(_keys(table).to_numpy(zero_copy_only=False), return_index=True,
                                     return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    m = len(keys)
    empty_longs = pa.array([[]] * m, type=pa.list_(pa.int64()))
    columns = {f.name: pa.nulls(m, f.type) for f in CONTROL_OUTPUT_SCHEMA_ARROW}
    zeros = {f.name: pa.array(np.zeros(m, dtype=f.type.to_pandas_dtype()), type=f.type)
             for f in CONTROL_OUTPUT_SCHEMA_ARROW if pa.types.is_integer(f.type)}
    columns.update(zeros)
    columns.update({name: empty_longs for name in REPLICA_ARRAYS})
    columns.update(
        topic=table.column("topic").take(pa.array(first)).combine_chunks(),
        partition=table.column("partition").take(pa.array(first)).combine_chunks(),
        bucket=table.column("bucket").take(pa.array(first)).combine_chunks(),
        replicas=pa.array([[]] * m, type=pa.list_(pa.int32())), isr=pa.array([[]] * m, type=pa.list_(pa.int32())),
        is_known=pa.array(np.zeros(m, dtype=bool)), is_settled=pa.array(np.ones(m, dtype=bool)),
        is_changed=pa.array(np.ones(m, dtype=bool)),
        results=pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(np.bincount(inverse))].astype(np.int32)),
                                         results.take(pa.array(unknown[order]))),
        fetches=pa.array([[]] * m, type=CONTROL_OUTPUT_SCHEMA_ARROW.field("fetches").type))
    return pa.table([columns[f.name] for f in CONTROL_OUTPUT_SCHEMA_ARROW], schema=CONTROL_OUTPUT_SCHEMA_ARROW)


def _lenient(t: pa.DataType) -> pa.DataType:
    """`t` with every nested field nullable and lists' fields named as Arrow names them."""
    if pa.types.is_list(t):
        return pa.list_(_lenient(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _lenient(f.type)) for f in t])
    return t


def _arrow_schema() -> pa.Schema:
    return pa.schema([pa.field(f.name, _lenient(f.type)) for f in to_arrow_schema(CONTROL_OUTPUT_SCHEMA)])


CONTROL_OUTPUT_SCHEMA_ARROW = _arrow_schema()
_SPARK_ARROW_SCHEMA = to_arrow_schema(CONTROL_OUTPUT_SCHEMA)
