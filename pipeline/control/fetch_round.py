"""One fetch round's rules over a bucket of partitions (DESIGN.md, "Round v2", 3), pure: the
partition state and the inbox summary of the bucket in, each partition's state after the round
with its produce results, its fetches and its figures out (Arrow tables, as the control job's
`applyInArrow` passes them).

In order, per partition, as Kafka's leader and fetcher threads do it (one method of `_BucketRound`
each):
1. leader append: the checks that refuse a request, then base offsets from the leader's LEO
   (bucket.Appends);
2. each follower's fetch at its LEO: the leader's fetch state (Replica.updateFetchState), ISR
   expansion at the fetch, the HW; the response within the fetch limits, followers append;
3. the follow-up fetch of every follower whose response carried records (its fetcher fetches again
   at once), which proves what it wrote: fetch state, expansion, HW again, and a response with
   what the first had no room for;
4. ISR shrink, judged on each replica's state after the round's fetches, and the HW after it;
5. acks against that HW (round_output.py).
A follower behind the leader's LEO before the round (lagging) read a range of the leader's log
before the job (data/catch_up.py): its responses take from it within their limits, as they take
this round's batches (listed with `from_batch` false), and this round's batches after it once it
reached the leader's LEO before the round."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.control.bucket import FULL, INCREMENTAL, SESSIONLESS, Appends, Partitions
from pipeline.control.fetch_response import Reads, partition_limits, respond
from pipeline.control.fetch_session import (NO_SESSION, UNKNOWN, cache_after_response, must_respond,
                                            request_carries)
from pipeline.control.log_start import follower_log_start_offset
from pipeline.control.partition import out_of_sync_replicas
from pipeline.control.replication_quota import ReplicationBudgets
from pipeline.control.round_context import RoundContext, SessionFigures
from pipeline.control.round_output import output_rows
from pipeline.control.state import padded

__all__ = ["RoundContext", "SessionFigures", "fetch_round", "fetch_round_and_sessions"]


def fetch_round(state: pa.Table, requests: pa.Table, ctx: RoundContext) -> pa.Table:
    """The bucket's partitions after the round (CONTROL_OUTPUT_SCHEMA)."""
    return fetch_round_and_sessions(state, requests, ctx)[0]


def fetch_round_and_sessions(state: pa.Table, requests: pa.Table, ctx: RoundContext
                             ) -> tuple[pa.Table, SessionFigures]:
    """The bucket's partitions after the round (CONTROL_OUTPUT_SCHEMA), and what the round did to
    the leaders' fetch sessions (their follow-ups and the partitions incremental requests added)."""
    bucket = _BucketRound(state.sort_by([("topic", "ascending"), ("partition", "ascending")]), requests, ctx)
    bucket.first_fetch()
    bucket.follow_up()
    bucket.shrink()
    return bucket.output(), bucket.figures()


class _BucketRound:
    """The round of one bucket, step by step (the module's docstring); each step's results are
    the next one's inputs."""

    def __init__(self, state: pa.Table, requests: pa.Table, ctx: RoundContext) -> None:
        self.state, self.ctx = state, ctx
        parts = self.parts = Partitions(state)
        if ctx.restarted:
            parts.reset(ctx)
        parts.quiescent_fetches(ctx)
        # a leader that is down (stopped, not yet fenced) answers nothing: its partitions have no leader
        # for the round (NOT_LEADER_OR_FOLLOWER to producers) until the controller fences it
        parts.serving = parts.is_leader.any(axis=1) & ~np.isin(parts.leader, ctx.ineligible_brokers)
        parts.move_log_start(state)
        self.appends = Appends(requests, parts)                                               # 1. append
        self.leo_new = self.appends.leader_leo
        self.quotas = ReplicationBudgets(ctx.leader_budgets, ctx.follower_budgets) if ctx.throttled else None
        self._requests()

    def _requests(self) -> None:
        """Which followers fetch, in which KIP-227 session, and what their requests carry."""
        parts, ctx = self.parts, self.ctx
        kind, self.session = parts.requests(ctx)
        self.incremental = kind == INCREMENTAL
        self.sessioned = np.isin(kind, (FULL, INCREMENTAL)) & (self.session != NO_SESSION)
        followers = (parts.exists & ~parts.is_leader & np.isin(parts.brokers, ctx.fetching_brokers)
                     & parts.serving[:, None] & np.isin(kind, (FULL, SESSIONLESS, INCREMENTAL)))
        own_leo = self.own_leo = parts.arrays["log_end_offset"]
        # a follower past the leader's LEO diverges and truncates first (not in this step's scope)
        self.fetched = followers & (own_leo <= parts.leader_leo[:, None])
        self.lagging = self.fetched & (own_leo < parts.leader_leo[:, None])
        self.leader_lso = np.where(parts.is_leader, parts.arrays["log_start_offset"], 0).sum(axis=1)[:, None]
        # (a fetching follower takes its leader's log start offset from the response)
        parts.arrays["log_start_offset"] = np.where(
            self.fetched, follower_log_start_offset(parts.arrays["log_start_offset"], self.leader_lso),
            parts.arrays["log_start_offset"])
        self.max_bytes = partition_limits(parts.brokers, ctx)
        self.cache = parts.cache()
        self.cached = self.cache.session_id == self.session
        # KIP-227: an incremental request carries the partitions added to its session or altered; a
        # full one all (the follower's log start offset, which the request also carries, does not move
        # in a round v2 runs)
        self.requested = self.fetched & np.where(self.incremental, request_carries(
            self.cached, own_leo, parts.arrays["fetch_offset"], self.max_bytes, self.cache.max_bytes), True)
        self.added = self.fetched & self.incremental & ~self.cached

    def first_fetch(self) -> None:
        """2. Every follower's fetch at its LEO and the leader's response."""
        parts, ctx, fetched = self.parts, self.ctx, self.fetched
        hw = parts.high_watermark
        self.joined_first = parts.fetch(fetched, self.own_leo, self.leo_new, hw, ctx)
        hw = self.hw = parts.high_watermark_after(hw, self.leo_new, ctx)
        self.zero = zero = np.zeros(fetched.shape, dtype=np.int64)
        # a lagging follower's log to fetch is what it read of the leader's log before the job, and this
        # round's batches after it when that reached the leader's LEO before the round
        reads = self.reads = Reads(self.state, fetched.shape)
        self.readable = np.where(self.lagging, reads.count, 0)
        self.reach = ~self.lagging | (reads.end_after(self.readable, zero) >= parts.leader_leo[:, None])
        self.read_first, self.batches_first, self.batch_records = respond(
            parts, self.appends, fetched, reads, self.readable, (zero, zero), self.reach, ctx, self.quotas)
        first = self.read_first + self.batch_records
        self.leo_after = np.where(self.batch_records > 0, parts.leader_leo[:, None] + self.batch_records,
                                  reads.end_after(self.read_first, self.own_leo))
        self.got = first > 0
        cache, cached = self.cache, self.cached
        self.responded = fetched & np.where(self.incremental, must_respond(
            first, hw[:, None], np.where(cached, cache.high_watermark, UNKNOWN), self.leader_lso,
            np.where(cached, cache.leader_log_start_offset, UNKNOWN)), True)
        self.cache = cache_after_response(cache, fetched, np.where(self.sessioned, self.session, NO_SESSION),
                                          self.max_bytes, self.responded, hw[:, None], self.leader_lso)
        self.replica_hw = np.where(self.responded, np.minimum(hw[:, None], self.leo_after),
                                   parts.arrays["replica_high_watermark"])
        self.last_data_round = np.where(self.got, ctx.round_id, parts.arrays["last_data_round"])
        parts.arrays["last_data_round"] = self.last_data_round

    def follow_up(self) -> None:
        """3. Every follower whose response carried records fetches again at once: in its session an
        incremental request (the partitions whose fetch offset moved) and response."""
        parts, ctx, cache, session = self.parts, self.ctx, self.cache, self.session
        request = parts.fetcher_requests
        follow = self.follow = self.fetched & np.isin(request, request[self.got])
        self.requested_again = follow & np.where(self.sessioned, request_carries(
            cache.session_id == session, self.leo_after, parts.arrays["fetch_offset"], self.max_bytes,
            cache.max_bytes), True)
        self.joined_again = parts.fetch(follow, self.leo_after, self.leo_new, self.hw, ctx)
        hw = self.hw = parts.high_watermark_after(self.hw, self.leo_new, ctx)
        # (its response goes on where the first stopped: in what the follower read, or in the batches)
        # (a throttled fetcher's limit is per round: its follow-up proves its LEO and carries nothing)
        slow = np.isin(parts.brokers, [broker for broker, _ in ctx.fetcher_max_bytes])
        read_more, _, batch_more = respond(parts, self.appends, follow & ~slow, self.reads, self.readable,
                                           (self.read_first, self.batches_first), self.reach, ctx, self.quotas)
        more = read_more + batch_more
        self.read, self.from_batch = self.read_first + read_more, self.batch_records + batch_more
        self.leo_after = np.where(self.from_batch > 0, parts.leader_leo[:, None] + self.from_batch,
                                  self.reads.end_after(self.read, self.own_leo))
        self.responded_again = follow & np.where(self.sessioned, must_respond(
            more, hw[:, None], cache.high_watermark, self.leader_lso, cache.leader_log_start_offset), True)
        cache = cache_after_response(cache, follow, np.where(self.sessioned, session, NO_SESSION), self.max_bytes,
                                     self.responded_again, hw[:, None], self.leader_lso)
        parts.set_cache(cache)
        self.replica_hw = np.where(self.responded_again, np.minimum(hw[:, None], self.leo_after), self.replica_hw)
        parts.arrays["last_data_round"] = np.where(more > 0, ctx.round_id, self.last_data_round)

    def shrink(self) -> None:
        """4. ISR shrink on the state after every fetch of the round, and the HW the smaller ISR
        allows; then each replica's offsets after the round."""
        parts, ctx, leo_new = self.parts, self.ctx, self.leo_new
        self.shrunk = out_of_sync_replicas(parts.in_isr, parts.is_leader, parts.arrays["fetch_offset"], leo_new,
                                           parts.arrays["last_caught_up_time_ms"], ctx.now_ms, parts.lag
                                           ) & parts.serving[:, None]
        parts.in_isr = parts.in_isr & ~self.shrunk
        self.hw = parts.high_watermark_after(self.hw, leo_new, ctx)
        # (a follower whose log ended below its leader's log start starts its log there)
        parts.arrays["log_end_offset"] = np.where(parts.is_leader, leo_new[:, None],
                                                  np.maximum(self.leo_after, np.where(self.fetched, self.leader_lso, 0)))
        parts.arrays["fetch_offset"] = np.where(parts.is_leader, leo_new[:, None], parts.arrays["fetch_offset"])
        parts.arrays["replica_high_watermark"] = np.where(parts.is_leader, self.hw[:, None], self.replica_hw)

    def output(self) -> pa.Table:
        """5. The partitions' rows after the round, with their acks (round_output.py)."""
        changes = self.joined_first.any(axis=1).astype(int) + self.joined_again.any(axis=1) + self.shrunk.any(axis=1)
        entries = ((self.requested.sum(axis=1) + self.requested_again.sum(axis=1)),
                   (self.responded.sum(axis=1) + self.responded_again.sum(axis=1)))
        return output_rows(self.state, self.parts, self.appends, self.hw, changes,
                           (self.joined_first | self.joined_again, self.shrunk),
                           (self.own_leo, self.reads.end_after(self.read, self.own_leo), self.read, self.from_batch,
                            self.fetched), entries, self.ctx)

    def figures(self) -> SessionFigures:
        """The sessions that followed up, the partitions incremental requests added, the brokers
        whose log start offsets moved, and the throttled bytes drawn."""
        parts = self.parts
        ids, counts = np.unique(self.session[self.added], return_counts=True)
        moved = (parts.arrays["log_start_offset"] > padded(self.state.column("log_start_offset"), parts.brokers.shape[1],
                                                           0, np.int64)) & parts.exists
        return SessionFigures(frozenset(self.session[self.follow & self.sessioned].tolist()),
                              dict(zip(ids.tolist(), counts.tolist())), frozenset(parts.brokers[moved].tolist()),
                              self.quotas.drawn if self.quotas is not None else {})
