"""Round v2's vectorised rules (pipeline/control/), alone, with Kafka's numbers: IsrExpirationTest's
scenarios (lag 100 ms, leader LEO 20), maybeIncrementLeaderHW, the leader's produce checks, base
offsets, acks, readFromLocalLog's limits, and KIP-227's incremental requests and responses. No
Spark: numpy in, numpy out."""

import numpy as np

from pipeline.control.acks import request_status
from pipeline.control.fetch_response import batches_taken
from pipeline.control.fetch_session import (NO_SESSION, UNKNOWN, CachedPartitions, cache_after_response,
                                            must_respond, request_carries)
from pipeline.control.leader_append import assign_base_offsets, produce_error
from pipeline.control.log_start import follower_log_start_offset, maybe_increment_log_start_offset
from pipeline.control.partition import maybe_expand_isr, maybe_increment_leader_hw, out_of_sync_replicas
from pipeline.control.replica import FetchState, is_caught_up, update_fetch_state

LAG_MS = 100
LEADER_LEO = 20
A = np.array


def fetch(state, fetch_offset, now, leader_leo=LEADER_LEO):
    return update_fetch_state(state, A([fetch_offset]), A([leader_leo]), now, A([True]))


def never_fetched():
    return FetchState(A([0]), A([0]), A([0]))


def is_out_of_sync(state, fetch_offset, now, leader_leo=LEADER_LEO):
    """A follower (column 1) in the ISR of a partition led by column 0."""
    return bool(out_of_sync_replicas(A([[True, True]]), A([[True, False]]), A([[leader_leo, fetch_offset]]),
                                     A([leader_leo]), A([[0, state.last_caught_up_time_ms[0]]]), now,
                                     A([LAG_MS]))[0, 1])


def test_stuck_follower_leaves_the_isr_after_the_lag_not_before():
    state = fetch(never_fetched(), LEADER_LEO - 1, now=0)
    assert not is_out_of_sync(state, LEADER_LEO - 1, now=LAG_MS)
    assert is_out_of_sync(state, LEADER_LEO - 1, now=LAG_MS + 1)


def test_slow_follower_fetching_but_never_catching_up_leaves_the_isr():
    state = fetch(never_fetched(), 10, now=0)
    state = fetch(state, 12, now=40, leader_leo=25)
    state = fetch(state, 14, now=80, leader_leo=30)
    assert state.last_caught_up_time_ms[0] == 0
    assert is_out_of_sync(state, 14, now=LAG_MS + 1, leader_leo=30)


def test_follower_one_fetch_behind_a_busy_leader_stays_in_sync():
    state = fetch(never_fetched(), 10, now=0, leader_leo=15)
    state = fetch(state, 15, now=50, leader_leo=22)  # at the leader's LEO of the last fetch
    assert state.last_caught_up_time_ms[0] == 0       # caught up as of that fetch, t=0
    state = fetch(state, 22, now=90, leader_leo=28)
    assert state.last_caught_up_time_ms[0] == 50
    assert not is_out_of_sync(state, 22, now=140, leader_leo=28)


def test_caught_up_follower_never_leaves_however_long_it_idles():
    state = fetch(never_fetched(), LEADER_LEO, now=0)
    assert not is_out_of_sync(state, LEADER_LEO, now=10_000_000)


def test_a_replica_that_did_not_fetch_keeps_its_state():
    state = FetchState(A([5, 5]), A([7, 7]), A([3, 3]))
    after = update_fetch_state(state, A([20, 20]), A([20, 20]), 100, A([True, False]))
    assert after.last_fetch_time_ms.tolist() == [100, 5]
    assert after.last_fetch_leader_leo.tolist() == [20, 7]
    assert after.last_caught_up_time_ms.tolist() == [100, 3]


def test_is_caught_up_at_the_leaders_leo_or_within_the_lag():
    assert is_caught_up(A([20, 19, 19]), A([20, 20, 20]), A([0, 0, 50]), 120, A([LAG_MS] * 3)).tolist() == \
        [True, False, True]


def test_expansion_needs_the_hw_and_the_current_epochs_start_offset():
    # KAFKA-7128: a follower at the HW but below the leader epoch's start offset stays out
    in_isr = A([[True, False], [True, False], [True, False]])
    joiners = maybe_expand_isr(in_isr, A([[False, True]] * 3), A([[0, 10], [0, 9], [0, 10]]), A([10, 10, 10]),
                               A([0, 0, 11]))
    assert joiners[:, 1].tolist() == [True, False, False]


def test_hw_is_the_smallest_leo_of_the_leader_and_isr_and_caught_up_replicas():
    exists = A([[True, True, True]])
    leader = A([[True, False, False]])
    # follower 2 is out of the ISR and not caught up: the HW does not wait for it
    hw = maybe_increment_leader_hw(A([10]), A([[20, 15, 12]]), exists, leader, A([[True, True, False]]),
                                   A([[False, False, False]]), A([1]))
    assert hw.tolist() == [15]
    # caught up (eligible to join): the HW waits for it
    hw = maybe_increment_leader_hw(A([10]), A([[20, 15, 12]]), exists, leader, A([[True, True, False]]),
                                   A([[False, False, True]]), A([1]))
    assert hw.tolist() == [12]


def test_hw_never_moves_back_and_freezes_under_min_isr():
    exists, leader = A([[True, True, True]]), A([[True, False, False]])
    assert maybe_increment_leader_hw(A([18]), A([[20, 15, 20]]), exists, leader, A([[True, True, True]]),
                                     A([[False] * 3]), A([1])).tolist() == [18]
    # ISR [leader] with min ISR 2 of RF 3: frozen at 10 though the leader is at 20
    assert maybe_increment_leader_hw(A([10]), A([[20, 15, 15]]), exists, leader, A([[True, False, False]]),
                                     A([[False] * 3]), A([2])).tolist() == [10]
    # min ISR 2 on RF 1: min(min ISR, RF) = 1, not frozen
    assert maybe_increment_leader_hw(A([10]), A([[20]]), A([[True]]), A([[True]]), A([[True]]),
                                     A([[False]]), A([2])).tolist() == [20]


def test_produce_checks_in_kafkas_order():
    error = produce_error(is_known=A([False, True, True, True, True, True]), leader=A([0, -1, 0, 0, 0, 0]),
                          acks=A([1, 1, -1, 1, -1, -1]), isr_size=A([1, 1, 1, 1, 2, 2]), min_isr=A([2] * 6),
                          record_error=A([None, None, None, None, "MESSAGE_TOO_LARGE", None], dtype=object))
    assert error.tolist() == ["UNKNOWN_TOPIC_OR_PARTITION", "NOT_LEADER_OR_FOLLOWER", "NOT_ENOUGH_REPLICAS",
                              None, "MESSAGE_TOO_LARGE", None]


def test_base_offsets_follow_each_partitions_leo_in_append_order_and_skip_refused_requests():
    base, leo = assign_base_offsets(partition_index=A([0, 0, 0, 1, 1]), record_count=A([3, 2, 4, 1, 5]),
                                    accepted=A([True, False, True, True, True]), leader_leo=A([10, 0]))
    assert base.tolist() == [10, -1, 13, 0, 1]
    assert leo.tolist() == [17, 6]


def test_acks_all_waits_for_the_hw_and_fails_under_min_isr():
    status, code = request_status(error=A([None, None, None, None, "NOT_ENOUGH_REPLICAS"], dtype=object),
                                  acks=A([1, -1, -1, -1, -1]), last_offset=A([30, 14, 15, 14, -1]),
                                  high_watermark=A([10, 15, 15, 15, 15]), isr_size=A([1, 3, 3, 1, 1]),
                                  min_isr=A([2, 2, 2, 2, 2]))
    assert status.tolist() == ["acked", "acked", "pending", "error", "error"]
    assert code.tolist() == [None, None, None, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "NOT_ENOUGH_REPLICAS"]


def test_a_response_takes_whole_batches_within_the_partition_limit():
    # one request, two partitions: batches of 40, 40, 40 bytes and 30, 80; partition limit 100
    taken = batches_taken(request=A([0, 0]), partition_max_bytes=A([100, 100]), batch_fetch=A([0, 0, 0, 1, 1]),
                          batch_bytes=A([40, 40, 40, 30, 80]), response_max_bytes=1000)
    assert taken.tolist() == [True, True, False, True, False]


def test_the_first_batch_goes_even_over_the_limits_kip_74():
    taken = batches_taken(request=A([0, 0]), partition_max_bytes=A([100, 100]), batch_fetch=A([0, 1]),
                          batch_bytes=A([500, 500]), response_max_bytes=300)
    assert taken.tolist() == [True, False]


def test_the_response_limit_reads_later_partitions_into_the_bytes_left():
    # response limit 100: the first partition takes 60, the second's 50 does not fit the 40 left,
    # the third's 30 does (Kafka reads each partition into what the response has left)
    taken = batches_taken(request=A([0, 0, 0, 1]), partition_max_bytes=A([100] * 4), batch_fetch=A([0, 1, 2, 3]),
                          batch_bytes=A([60, 50, 30, 90]), response_max_bytes=100)
    assert taken.tolist() == [True, False, True, True]


def test_no_batches_take_nothing():
    assert batches_taken(A([0]), A([100]), A([], dtype=int), A([], dtype=int), 100).tolist() == []


def test_an_incremental_request_carries_added_and_altered_partitions_only():
    # cached at offset 5 with 1000 bytes: unchanged, moved offset, new max bytes, not cached
    carries = request_carries(cached=A([True, True, True, False]), fetch_offset=A([5, 6, 5, 5]),
                              cached_fetch_offset=A([5, 5, 5, 0]), max_bytes=A([1000, 1000, 500, 1000]),
                              cached_max_bytes=A([1000, 1000, 1000, 0]))
    assert carries.tolist() == [False, True, True, True]


def test_an_incremental_response_carries_records_a_new_hw_or_log_start_and_every_new_partition():
    respond = must_respond(records=A([0, 3, 0, 0, 0]), high_watermark=A([7, 7, 8, 7, 7]),
                           cached_high_watermark=A([7, 7, 7, 7, UNKNOWN]), leader_log_start_offset=A([0, 0, 0, 2, 0]),
                           cached_leader_log_start_offset=A([0, 0, 0, 0, UNKNOWN]))
    assert respond.tolist() == [False, True, True, True, True]


def test_the_cache_keeps_what_it_sent_and_a_request_without_a_session_leaves_none():
    cache = CachedPartitions(session_id=A([5, 5, 5, 5]), max_bytes=A([100] * 4), high_watermark=A([3] * 4),
                             leader_log_start_offset=A([0] * 4))
    # replica 0 did not fetch; 1 fetched in session 5 and was answered with HW 4; 2 in session 5
    # and left out of the response; 3 fetched without a session
    after = cache_after_response(cache, fetched=A([False, True, True, True]), session_id=A([5, 5, 5, NO_SESSION]),
                                 max_bytes=200, responded=A([True, True, False, True]), high_watermark=A([4] * 4),
                                 leader_log_start_offset=A([1] * 4))
    assert after.session_id.tolist() == [5, 5, 5, NO_SESSION]
    assert after.max_bytes.tolist() == [100, 200, 200, 0]
    assert after.high_watermark.tolist() == [3, 4, 3, UNKNOWN]
    assert after.leader_log_start_offset.tolist() == [0, 1, 0, UNKNOWN]


def test_the_log_start_offset_moves_forward_only_and_never_past_the_hw():
    # asked 5 (moves), 20 above the HW 12 (to the HW), 2 below the current 4 (stays), none (stays)
    current, hw = np.array([0, 0, 4, 4]), np.array([12, 12, 12, 12])
    assert maybe_increment_log_start_offset(current, hw, np.array([5, 20, 2, -1])).tolist() == [5, 12, 4, 4]
    # a follower takes its leader's from the response, never moving back
    assert follower_log_start_offset(np.array([0, 7]), np.array([5, 5])).tolist() == [5, 7]
