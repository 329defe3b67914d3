"""Replication quotas (KIP-73) over a round's fetch responses (pipeline/control/replication_quota.py),
pure numpy: a leader's budget shared by every response it sends, a follower's by every response it
receives, replicas in the ISR never held back, no first-record exception for a throttled partition."""

import numpy as np
import pyarrow as pa

from pipeline.control.fetch_round import RoundContext, fetch_round_and_sessions
from pipeline.control.replication_quota import UNLIMITED, bytes_drawn, within_replication_quotas
from tests.test_fetch_round import REQUESTS, STATE, partition

SIZE = 10  # bytes a record


def _units(records_per_fetch):
    """unit_fetch, unit_bytes of fetches taking these many records of SIZE bytes each."""
    fetch = np.repeat(np.arange(len(records_per_fetch)), records_per_fetch)
    return fetch, np.full(len(fetch), SIZE, dtype=np.int64)


def test_throttled_partitions_share_their_brokers_budgets_and_in_sync_ones_are_never_held_back():
    # fetches (follower, leader 0): p0 by 1, in sync; p1 by 1, throttled on both sides; p2 by 2,
    # throttled on the leader's side; p3 by 2, on the follower's only. Four records each.
    unit_fetch, unit_bytes = _units([4, 4, 4, 4])
    leader, broker = np.zeros(4, dtype=np.int64), np.array([1, 1, 2, 2])
    throttled = (np.array([False, True, True, False]), np.array([False, True, False, True]))
    leader_budget = np.full(4, 3 * SIZE)
    follower_budget = np.array([5 * SIZE, 5 * SIZE, 2 * SIZE, 2 * SIZE])
    carried = within_replication_quotas(np.ones(16, dtype=bool), unit_fetch, unit_bytes, leader, broker, throttled,
                                        (leader_budget, follower_budget))
    # p0 all four; p1 three (leader 0's budget); p2 none (p1, before it in leader 0's order, drew
    # the budget); p3 two (follower 2's budget)
    assert np.bincount(unit_fetch, weights=carried).tolist() == [4, 3, 0, 2]
    assert bytes_drawn(carried, unit_fetch, unit_bytes, leader, throttled[0]) == {0: 3 * SIZE}
    assert bytes_drawn(carried, unit_fetch, unit_bytes, broker, throttled[1]) == {1: 3 * SIZE, 2: 2 * SIZE}


def test_a_throttled_record_larger_than_the_budget_waits_and_units_the_limits_left_out_stay_out():
    unit_fetch, unit_bytes = _units([2])
    no = np.array([False])
    carried = within_replication_quotas(np.array([True, True]), unit_fetch, unit_bytes, np.array([0]), np.array([1]),
                                        (no, np.array([True])), (np.array([UNLIMITED]), np.array([SIZE - 1])))
    assert carried.tolist() == [False, False]
    taken = np.array([True, False])  # (the response limits took the first record only)
    carried = within_replication_quotas(taken, unit_fetch, unit_bytes, np.array([0]), np.array([1]),
                                        (no, np.array([True])), (np.array([UNLIMITED]), np.array([5 * SIZE])))
    assert carried.tolist() == [True, False]


def test_a_round_holds_an_out_of_sync_throttled_follower_to_its_budget_over_both_fetches():
    # partitions 0 and 1 led by 0 at LEO 20; follower 2 out of the ISR at 0, listed as throttled on
    # its side, read the 20 records of 10 bytes of each before the job; follower 2's fetcher has 50
    # bytes this round: its fetch takes 5 records of partition 0 and none of 1, its follow-up none
    def lagging(p):
        row = partition(p, isr=(0, 1), leo=20)
        row.update(log_end_offset=[20, 20, 0], fetch_offset=[20, 20, 0], replica_high_watermark=[20, 20, 0],
                   read_bytes=[[], [], [SIZE] * 20], read_ends=[[], [], list(range(1, 21))],
                   leader_throttle_listed=[False] * 3, follower_throttle_listed=[True] * 3)
        return row
    lists = pa.list_(pa.list_(pa.int64()))
    schema = STATE.append(pa.field("read_bytes", lists)).append(pa.field("read_ends", lists)) \
        .append(pa.field("leader_throttle_listed", pa.list_(pa.bool_()))) \
        .append(pa.field("follower_throttle_listed", pa.list_(pa.bool_())))
    out, figures = fetch_round_and_sessions(
        pa.Table.from_pylist([lagging(0), lagging(1)], schema=schema), REQUESTS.empty_table(),
        RoundContext(round_id=3, now_ms=100, fetching_brokers=(0, 1, 2), follower_budgets=((2, 5 * SIZE),)))
    rows = {r["partition"]: r for r in out.to_pylist()}
    assert [rows[p]["log_end_offset"] for p in range(2)] == [[20, 20, 5], [20, 20, 0]]
    assert figures.throttled_bytes == {("follower", 2): 5 * SIZE}
    # unlisted, the same follower takes both partitions whole
    out, figures = fetch_round_and_sessions(
        pa.Table.from_pylist([dict(lagging(p), follower_throttle_listed=[False] * 3) for p in range(2)],
                             schema=schema), REQUESTS.empty_table(),
        RoundContext(round_id=3, now_ms=100, fetching_brokers=(0, 1, 2), follower_budgets=((2, 5 * SIZE),)))
    assert [r["log_end_offset"] for r in out.to_pylist()] == [[20, 20, 20], [20, 20, 20]]
    assert figures.throttled_bytes == {}
