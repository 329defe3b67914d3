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
from pipeline.control.replica import (FetchState, effective_fetch_state, is_caught_up, reset_replica_state,
                                      update_fetch_state)

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


# -- ported from the DataFrame rules of the round before v2, with their numbers ---------------------

def test_a_follower_that_never_fetched_leaves_the_isr_after_the_lag():
    # no fetch at all: last caught up when the leader was elected (t=0)
    assert not is_out_of_sync(never_fetched(), 0, now=LAG_MS)
    assert is_out_of_sync(never_fetched(), 0, now=LAG_MS + 1)


def test_a_follower_fetching_at_the_leaders_leo_of_its_last_fetch_is_caught_up_as_of_that_fetch():
    # every fetch asks for the leader's LEO as of the previous fetch: caught up to that fetch's time
    state = fetch(never_fetched(), 10, now=0)  # leader LEO 20
    for t, offset, leader_leo in [(60, 20, 30), (120, 30, 40), (180, 40, 50)]:
        state = fetch(state, offset, now=t, leader_leo=leader_leo)
    assert (state.last_caught_up_time_ms[0], state.last_fetch_time_ms[0], state.last_fetch_leader_leo[0]) == \
        (120, 180, 50)
    assert not is_out_of_sync(state, 40, now=200, leader_leo=50)


def test_update_fetch_state_caught_up_now_as_of_the_last_fetch_or_not():
    # last fetch at t=50 with the leader at 15, caught up at t=10; the leader is at 20 now (t=70):
    # at 20 (caught up now), at 15 (as of the last fetch), at 14 (behind both)
    state = FetchState(A([50, 50, 50]), A([15, 15, 15]), A([10, 10, 10]))
    after = update_fetch_state(state, A([20, 15, 14]), A([20, 20, 20]), 70, A([True] * 3))
    assert after.last_fetch_time_ms.tolist() == [70, 70, 70]
    assert after.last_fetch_leader_leo.tolist() == [20, 20, 20]
    assert after.last_caught_up_time_ms.tolist() == [70, 50, 10]


def test_reset_replica_state_catches_up_isr_members_now_and_others_never():
    # Replica.resetReplicaState(isNewLeader = false): in the ISR -> fetched and caught up now;
    # outside it -> both 0; both remember the leader's LEO (18)
    state = FetchState(A([50, 50]), A([15, 15]), A([40, 30]))
    after = reset_replica_state(state, A([True, False]), A([18, 18]), 900, A([True, True]))
    assert after.last_fetch_time_ms.tolist() == [900, 0]
    assert after.last_fetch_leader_leo.tolist() == [18, 18]
    assert after.last_caught_up_time_ms.tolist() == [900, 0]


def test_effective_fetch_state_credits_a_quiet_follower_with_its_brokers_last_fetch_not_a_reset_one():
    # three followers at the leader's LEO (20); their brokers last fetched at 700 (the last round,
    # or when a fetcher paused). The first last fetched this leader at 500: caught up at 700. The
    # second is one a new leader reset outside the ISR (0, 0): its broker's fetch at 700 went to the
    # old leader, so it stays never caught up and does not hold back the HW (lockstep seed 2). The
    # third is not quiescent.
    state = FetchState(A([500, 0, 500]), A([20, 20, 20]), A([500, 0, 400]))
    after = effective_fetch_state(state, A([True, True, False]), A([700, 700, 700]), A([20, 20, 20]))
    assert after.last_fetch_time_ms.tolist() == [700, 0, 500]
    assert after.last_caught_up_time_ms.tolist() == [700, 0, 400]


def test_time_without_rounds_does_not_count_after_a_restart():
    # last fetched at t=0 (caught up to LEO 0); no round for 50 lag times; then the leader appends
    # 20 records and the follower's next fetch asks for offset 0 in the restarted process's round
    idle = FetchState(A([0]), A([0]), A([0]))
    now = 50 * LAG_MS
    assert is_out_of_sync(fetch(idle, 0, now=now), 0, now=now)  # without the reset: out of sync at once
    fresh = fetch(reset_replica_state(idle, A([True]), A([0]), now, A([True])), 0, now=now)
    assert fresh.last_caught_up_time_ms[0] == now
    assert not is_out_of_sync(fresh, 0, now=now + LAG_MS)
    assert is_out_of_sync(fresh, 0, now=now + LAG_MS + 1)  # still stuck: out after the lag


def test_expansion_at_the_hw_past_the_epoch_start_and_not_for_isr_members():
    # HW 10, epoch start 5: at 10 joins; at 9 (below the HW) not; epoch start 12 (KAFKA-7128) not;
    # already in the ISR: not a joiner
    in_isr = A([[True, False], [True, False], [True, False], [True, True]])
    joiners = maybe_expand_isr(in_isr, A([[False, True]] * 4), A([[0, 10], [0, 9], [0, 10], [0, 10]]),
                               A([10, 10, 10, 10]), A([5, 5, 12, 5]))
    assert joiners[:, 1].tolist() == [True, False, False, False]


def test_no_partitions_give_no_out_of_sync_replicas():
    empty = np.zeros((0, 3), dtype=bool)
    out = out_of_sync_replicas(empty, empty, np.zeros((0, 3), dtype=np.int64), A([], dtype=np.int64),
                               np.zeros((0, 3), dtype=np.int64), 0, A([], dtype=np.int64))
    assert out.shape == (0, 3)


def hw_after(old_hw, leader_leo, follower_leos, isr, min_isr=1, caught_up_ms=0, now=1000, down=()):
    """maybeIncrementLeaderHW for a partition of replicas [0, 1, 2] led by 0, the lag 100 ms:
    followers outside the ISR count when caught up and on a broker that may join."""
    leo = A([[leader_leo, *follower_leos]])
    in_isr = A([[b in isr for b in (0, 1, 2)]])
    caught = is_caught_up(leo, A([[leader_leo] * 3]), A([[0, caught_up_ms, caught_up_ms]]), now, A([[LAG_MS] * 3]))
    may_join = caught & A([[b not in down for b in (0, 1, 2)]]) & A([[False, True, True]])
    return int(maybe_increment_leader_hw(A([old_hw]), leo, A([[True] * 3]), A([[True, False, False]]), in_isr,
                                         may_join, A([min_isr]))[0])


def test_hw_is_the_smallest_leo_of_the_leader_and_isr_never_backwards_and_frozen_under_min_isr():
    assert hw_after(0, 10, (7, 9), isr=(0, 1, 2)) == 7            # min over the ISR
    assert hw_after(0, 10, (10, 3), isr=(0, 1)) == 10             # 2 out of the ISR and not caught up
    assert hw_after(6, 10, (4, 8), isr=(0, 1, 2)) == 6            # never backwards
    assert hw_after(2, 10, (10, 10), isr=(0,), min_isr=2) == 2    # ISR < min ISR: frozen
    assert hw_after(0, 10, (10, 10), isr=(0, 1, 2), min_isr=3) == 10  # min ISR 3 of 3, all in: advances


def test_hw_waits_for_a_caught_up_replica_eligible_to_join_unless_its_broker_is_down():
    # broker 2 is not in the ISR but caught up within the lag (t=950 of 1000): the HW waits for it
    assert hw_after(0, 10, (10, 6), isr=(0, 1), caught_up_ms=950) == 6
    # as above, but broker 2 is stopped or fenced: it may not join the ISR, so the HW does not wait
    assert hw_after(0, 10, (10, 6), isr=(0, 1), caught_up_ms=950, down=(2,)) == 10


def test_base_offsets_from_the_leaders_leo_in_produce_order():
    # r1 (two records to partition 0, one to 1) before r2 (one to partition 0); partition 0's
    # leader at LEO 7, partition 1's at 0 (requests by partition, then in produce order)
    base, leo = assign_base_offsets(partition_index=A([0, 0, 1]), record_count=A([2, 1, 1]),
                                    accepted=A([True, True, True]), leader_leo=A([7, 0]))
    assert base.tolist() == [7, 9, 0]
    assert leo.tolist() == [10, 1]


def test_the_leaders_log_start_offset_moves_to_the_request_within_the_hw():
    # current 2, HW 5: asked 7 (to the HW), 1 (stays), none (stays), 4 (moves)
    assert maybe_increment_log_start_offset(A([2] * 4), A([5] * 4), A([7, 1, -1, 4])).tolist() == [5, 2, 2, 4]


def test_lookup_finds_each_wanted_key_in_unsorted_keys_and_gives_missing_elsewhere():
    from pipeline.control.state import lookup
    assert lookup(A([5, 1, 3]), A([50, 10, 30]), A([[1, 2], [3, 5]]), -1).tolist() == [[10, -1], [30, 50]]
    assert lookup(A([], dtype=np.int64), A([], dtype=np.int64), A([1, 2]), 7).tolist() == [7, 7]
