"""KIP-227 session rules with exact values: epochs, the cache's eviction order (the cases of Kafka's
FetchSessionTest: testSessionCache, testPrivilegedSessionHandling, testFetchSessionExpiration),
the leader's contexts, and the partitions incremental requests and responses carry."""

import random

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipeline.errors import ErrorCode
from pipeline.fetch_session import (EVICTION_MS, FINAL_EPOCH, INITIAL_EPOCH, MAX_EPOCH, Handle, Session,
                                    cached_high_watermark, follow_up, incremental_request, must_respond, new_context,
                                    new_session_id, next_epoch, replica_fetcher, round_contexts, sessions_from_json,
                                    sessions_to_json, try_evict)
from pipeline.replication import RECORD_OVERHEAD_BYTES, fetch_response_records


def session(sid, privileged=True, size=10, created=0, used=0, leader=0, epoch=1):
    return Session(leader, f"f{sid}", privileged, sid, epoch, created, used, size)


def test_epochs_start_at_one_and_wrap_to_one():
    assert [next_epoch(e) for e in (INITIAL_EPOCH, 1, 41, 2_147_483_647, FINAL_EPOCH)] == [1, 2, 42, 1, FINAL_EPOCH]


def test_session_ids_are_random_nonzero_and_unique():
    rng = random.Random(1)
    taken = set()
    for _ in range(2000):
        sid = new_session_id(rng, taken)
        assert sid != 0 and sid not in taken and -2**31 <= sid < 2**31
        taken.add(sid)


def test_free_slot_admits_without_eviction():
    assert try_evict([session(1)], privileged=False, size=1, now_ms=10, slots=2) == (True, None)
    assert try_evict([], privileged=True, size=1, now_ms=10, slots=0) == (False, None)


def test_full_cache_of_fresh_privileged_sessions_admits_no_one():
    cache = [session(1, size=1, used=100), session(2, size=1, used=100)]
    assert try_evict(cache, privileged=True, size=100, now_ms=200, slots=2) == (False, None)
    assert try_evict(cache, privileged=False, size=100, now_ms=200, slots=2) == (False, None)


def test_privileged_newcomer_evicts_the_smallest_unprivileged_session():
    small, big = session(5, privileged=False, size=3, used=50), session(6, privileged=False, size=9, used=50)
    cache = [session(1, size=1, used=100), big, small]
    assert try_evict(cache, privileged=True, size=1, now_ms=200, slots=3) == (True, small)
    # an unprivileged newcomer may not: those sessions had not existed EVICTION_MS when last used
    assert try_evict(cache, privileged=False, size=100, now_ms=200, slots=3) == (False, None)


def test_stale_session_goes_first_even_for_an_unprivileged_newcomer():
    stale = session(7, size=50, created=0, used=1_000)
    cache = [stale, session(8, size=1, created=0, used=EVICTION_MS)]
    # stale only once unused for more than EVICTION_MS
    assert try_evict(cache, privileged=False, size=1, now_ms=1_000 + EVICTION_MS, slots=2) == (False, None)
    assert try_evict(cache, privileged=False, size=1, now_ms=1_001 + EVICTION_MS, slots=2) == (True, stale)


def test_old_sessions_yield_to_larger_newcomers_only():
    old_small = session(3, size=5, created=0, used=EVICTION_MS + 1)
    old_big = session(4, size=20, created=0, used=EVICTION_MS + 1)
    cache = [old_small, old_big]
    now = EVICTION_MS + 2
    # the newcomer's key (privileged, size, 0) must not be below the smallest (True, 5, 3)
    assert try_evict(cache, privileged=True, size=5, now_ms=now, slots=2) == (False, None)
    assert try_evict(cache, privileged=True, size=6, now_ms=now, slots=2) == (True, old_small)
    # privilege compares first: an unprivileged newcomer never displaces a privileged session
    assert try_evict(cache, privileged=False, size=99, now_ms=now, slots=2) == (False, None)
    old_consumer = session(5, privileged=False, size=5, created=0, used=EVICTION_MS + 1)
    assert try_evict([old_consumer], privileged=False, size=6, now_ms=now, slots=1) == (True, old_consumer)
    assert try_evict([old_consumer], privileged=False, size=4, now_ms=now, slots=1) == (False, None)


def test_equal_size_ties_break_on_the_session_id():
    # the newcomer's key is (privileged, size, 0): it wins a tie only against a negative id
    negative, positive = session(-9, size=5, used=EVICTION_MS + 1), session(9, size=5, used=EVICTION_MS + 1)
    assert try_evict([negative], True, 5, EVICTION_MS + 2, slots=1) == (True, negative)
    assert try_evict([positive], True, 5, EVICTION_MS + 2, slots=1) == (False, None)


def test_context_sequence_full_incremental_and_both_session_errors():
    rng = random.Random(3)
    handle = Handle("replica-1", leader=0)
    ctx, cache, handle, ev = new_context([], handle, True, 4, 100, 1000, rng, [])
    assert (ctx.kind, ev, handle.epoch, len(cache)) == ("full", 0, 1, 1)
    sid = ctx.session_id
    assert handle.session_id == sid != 0 and cache[0] == Session(0, "replica-1", True, sid, 1, 100, 100, 4)
    ctx, cache, handle, _ = new_context(cache, handle, True, 4, 600, 1000, rng, [sid])
    assert (ctx.kind, ctx.session_id, handle.epoch, cache[0].epoch, cache[0].last_used_ms) == \
        ("incremental", sid, 2, 2, 600)
    # a replayed request (the epoch the leader has already seen): close the session, fetch in full
    replayed = Handle("replica-1", 0, sid, 1)
    ctx, cache2, after, _ = new_context(cache, replayed, True, 4, 700, 1000, rng, [sid])
    assert (ctx.kind, ctx.error_code, after, cache2) == (
        "error", ErrorCode.INVALID_FETCH_SESSION_EPOCH, Handle("replica-1", 0, sid, INITIAL_EPOCH), cache)
    ctx, cache3, after, _ = new_context(cache, after, True, 4, 800, 1000, rng, [sid])
    assert ctx.kind == "full" and ctx.session_id != sid and [s.session_id for s in cache3] == [ctx.session_id]
    # an id the leader does not know: start over without one
    ctx, _, after, _ = new_context([], Handle("replica-1", 0, 12345, 7), True, 4, 900, 1000, rng, [])
    assert (ctx.error_code, after) == (ErrorCode.FETCH_SESSION_ID_NOT_FOUND, Handle("replica-1", 0, 0, 0))


def test_full_request_without_room_is_answered_without_a_session():
    rng = random.Random(4)
    cache = [session(1, size=1, used=100)]
    ctx, after, handle, ev = new_context(cache, Handle("replica-2", 0), True, 1, 200, 1, rng, [1])
    assert (ctx.kind, ctx.session_id, after, handle, ev) == ("full", 0, cache, Handle("replica-2", 0, 0, 0), 0)


def test_follow_up_fetch_moves_its_sessions_epoch_on_both_sides_and_a_later_round_agrees():
    rng = random.Random(5)
    ctx, cache, handle, _ = new_context([], Handle("replica-1", leader=0), True, 4, 100, 1000, rng, [])
    other = session(77, leader=1, epoch=9)
    cache, (handle, other_handle) = follow_up(cache + [other], [handle, Handle("replica-2", 1, 77, 9)],
                                              {ctx.session_id})
    assert (cache[0].epoch, handle.epoch, cache[1], other_handle.epoch) == (2, 2, other, 9)
    # the next round's incremental request carries epoch 2, which the leader expects: no error
    ctx2, cache, handle, _ = new_context(cache[:1], handle, True, 4, 600, 1000, rng, [ctx.session_id])
    assert (ctx2.kind, ctx2.session_id, handle.epoch, cache[0].epoch) == ("incremental", ctx.session_id, 3, 3)
    # the epoch wraps as any request's does; a handle asking for a new session (epoch 0) is left be
    wrapped, handles = follow_up([session(5, epoch=MAX_EPOCH)], [Handle("f5", 0, 5, MAX_EPOCH),
                                                                  Handle("f6", 0, 5, INITIAL_EPOCH)], {5})
    assert (wrapped[0].epoch, handles[0].epoch, handles[1].epoch) == (1, 1, INITIAL_EPOCH)
    assert follow_up(cache, [handle], set()) == (cache, [handle])


def test_sessionless_requests_close_the_named_session():
    cache = [session(1, leader=0)]
    ctx, after, handle, _ = new_context(cache, Handle("f1", 0, 1, 5), True, 1, 10, 10, random.Random(), [1],
                                        sessionless=True)
    assert (ctx.kind, after, handle) == ("sessionless", [], Handle("f1", 0, 0, FINAL_EPOCH))


def test_round_contexts_give_the_first_fetcher_by_name_the_only_slot_and_survive_json():
    pairs = {(1, 0): 4, (2, 0): 4, (0, 1): 2}
    contexts, cache, handles, ev = round_contexts([], [], pairs, idle_fetchers=set(), now_ms=0, slots=1,
                                                  rng=random.Random(5), sessionless=False)
    kinds = {(c.fetcher, c.leader): (c.kind, c.session_id != 0) for c in contexts}
    assert kinds == {("replica-1", 0): ("full", True), ("replica-2", 0): ("full", False),
                     ("replica-0", 1): ("full", True)}
    assert sorted((s.leader, s.fetcher, s.size) for s in cache) == [(0, "replica-1", 4), (1, "replica-0", 2)]
    assert sessions_from_json(sessions_to_json(cache, handles, contexts)) == (
        sorted(cache, key=lambda s: (s.leader, s.fetcher)), sorted(handles, key=lambda h: (h.leader, h.fetcher)))
    # a paused follower sends nothing: its session is not touched
    contexts, cache2, _, _ = round_contexts(cache, handles, pairs, {1}, 500, 1, random.Random(5), False)
    assert [(c.fetcher, c.kind) for c in contexts] == [("replica-2", "full"), ("replica-0", "incremental")]
    assert [s.last_used_ms for s in cache2 if s.fetcher == replica_fetcher(1)] == [0]


REQ = "session_id int, topic string, partition int, fetch_offset long, log_start_offset long, max_bytes long"
CACHED = ("session_id int, topic string, partition int, fetch_offset long, fetcher_log_start_offset long, "
          "max_bytes long")


def test_incremental_request_carries_added_altered_and_removed_partitions_only(spark):
    wanted = spark.createDataFrame([(7, "t", 0, 5, 0, 100), (7, "t", 1, 9, 0, 100), (7, "t", 2, 3, 1, 100),
                                    (7, "t", 3, 4, 0, 50), (7, "t", 4, 0, 0, 100)], REQ)
    cached = spark.createDataFrame([(7, "t", 0, 5, 0, 100), (7, "t", 1, 8, 0, 100), (7, "t", 2, 3, 0, 100),
                                    (7, "t", 3, 4, 0, 100), (7, "t", 5, 2, 0, 100), (8, "t", 0, 1, 0, 100)], CACHED)
    result = incremental_request(wanted, cached.filter(F.col("session_id") == 7))
    expected = [(7, "t", 1, "altered"), (7, "t", 2, "altered"), (7, "t", 3, "altered"), (7, "t", 4, "added"),
                (7, "t", 5, "removed")]
    assert_df_equality(result, spark.createDataFrame(expected, "session_id int, topic string, partition int, change string"),
                       ignore_row_order=True, ignore_nullable=True)


def test_incremental_request_of_an_unchanged_session_is_empty(spark):
    rows = [(7, "t", 0, 5, 0, 100)]
    assert incremental_request(spark.createDataFrame(rows, REQ), spark.createDataFrame(rows, CACHED)).count() == 0


def test_response_carries_records_hw_or_log_start_changes_and_errors_and_resends_after_an_error(spark):
    cols = "case string, records long, hw long, cached_hw long, lso long, cached_lso long, error string"
    rows = [("nothing new", 0, 10, 10, 0, 0, None), ("records", 3, 10, 10, 0, 0, None),
            ("hw moved", 0, 11, 10, 0, 0, None), ("log start moved", 0, 10, 10, 4, 0, None),
            ("error", 0, 10, 10, 0, 0, "OFFSET_OUT_OF_RANGE"),
            ("error cleared", 0, 10, -1, 0, 0, None)]  # the error cached HW -1: sent again
    df = spark.createDataFrame(rows, cols).select(
        "case", must_respond(F.col("records"), F.col("hw"), F.col("cached_hw"), F.col("lso"), F.col("cached_lso"),
                             F.col("error")).alias("must_respond"),
        cached_high_watermark(F.col("hw"), F.col("error")).alias("cached_after"))
    expected = [("nothing new", False, 10), ("records", True, 10), ("hw moved", True, 11),
                ("log start moved", True, 10), ("error", True, -1), ("error cleared", True, 10)]
    assert_df_equality(df, spark.createDataFrame(expected, "case string, must_respond boolean, cached_after long"),
                       ignore_row_order=True, ignore_nullable=True)


LOG = "topic string, partition int, offset long, key binary, value binary, broker int"
FETCH = ("broker int, leader int, topic string, partition int, fetch_offset long, partition_max_bytes long, "
         "response_max_bytes long, fetch_order long")
SIZE = RECORD_OVERHEAD_BYTES + 10


@pytest.mark.usefixtures("either_join")
def test_response_limit_serves_partitions_in_fetch_order_and_cuts_the_one_that_does_not_fit(spark):
    records = spark.createDataFrame([("t", p, o, None, b"0123456789", 0) for p in range(4) for o in range(3)], LOG)
    # order: p2 (never returned data), p0, p3 (returned data in round 4), p1 (round 5)
    fetch = spark.createDataFrame([(1, 0, "t", 0, 0, 10 * SIZE, 5 * SIZE, 0), (1, 0, "t", 1, 0, 10 * SIZE, 5 * SIZE, 5),
                                   (1, 0, "t", 2, 1, 10 * SIZE, 5 * SIZE, 0), (1, 0, "t", 3, 0, 10 * SIZE, 5 * SIZE, 4)],
                                  FETCH)
    result = fetch_response_records(fetch, records).select("partition", "offset")
    # p2 from offset 1: 2 records; p0: 3 records fill the 5; p3 and p1 wait for the next round
    expected = [(2, 1), (2, 2), (0, 0), (0, 1), (0, 2)]
    assert_df_equality(result, spark.createDataFrame(expected, "partition int, offset long"),
                       ignore_row_order=True, ignore_nullable=True)


@pytest.mark.usefixtures("either_join")
def test_first_record_of_a_response_goes_even_over_both_limits(spark):
    records = spark.createDataFrame([("t", p, o, None, b"0123456789", 0) for p in range(2) for o in range(2)], LOG)
    fetch = spark.createDataFrame([(1, 0, "t", 0, 0, 1, 1, 0), (1, 0, "t", 1, 0, 1, 1, 0),
                                   (2, 0, "t", 0, 1, 10 * SIZE, SIZE + 1, 0), (2, 0, "t", 1, 0, 10 * SIZE, SIZE + 1, 0)],
                                  FETCH)
    result = fetch_response_records(fetch, records).select("broker", "partition", "offset")
    # broker 1: one record in all; broker 2: p0's last record fills it, p1 waits
    expected = [(1, 0, 0), (2, 0, 1)]
    assert_df_equality(result, spark.createDataFrame(expected, "broker int, partition int, offset long"),
                       ignore_row_order=True, ignore_nullable=True)


THROTTLED = FETCH + ", leader_throttled boolean, follower_throttled boolean, leader_budget long, follower_budget long"


@pytest.mark.usefixtures("either_join")
def test_throttled_partitions_share_their_brokers_budgets_and_in_sync_ones_are_never_held_back(spark):
    records = spark.createDataFrame([("t", p, o, None, b"0123456789", 0) for p in range(4) for o in range(4)], LOG)
    big = 100 * SIZE
    fetch = spark.createDataFrame([
        # follower 1: p0 in sync (not throttled), p1 throttled on both sides
        (1, 0, "t", 0, 0, big, big, 0, False, False, 3 * SIZE, 5 * SIZE),
        (1, 0, "t", 1, 0, big, big, 1, True, True, 3 * SIZE, 5 * SIZE),
        # follower 2: p2 leader-throttled: leader 0's budget has 3 records left after p1's... none
        (2, 0, "t", 2, 0, big, big, 0, True, False, 3 * SIZE, None),
        # follower 2: p3 follower-throttled only, an unlimited leader side: 2 records fit its 2
        (2, 0, "t", 3, 0, big, big, 1, False, True, 3 * SIZE, 2 * SIZE),
    ], THROTTLED)
    result = fetch_response_records(fetch, records).select("broker", "partition", "offset", "leader_throttled")
    # p0 (in sync) gets all 4; p1: 3 of leader 0's budget; p2: the 3 are spent; p3: 2 of follower 2's
    expected = ([(1, 0, o, False) for o in range(4)] + [(1, 1, o, True) for o in range(3)]
                + [(2, 3, o, False) for o in range(2)])
    assert_df_equality(result, spark.createDataFrame(expected, "broker int, partition int, offset long, "
                                                               "leader_throttled boolean"),
                       ignore_row_order=True, ignore_nullable=True)


@pytest.mark.usefixtures("either_join")
def test_a_throttled_record_larger_than_the_budget_waits(spark):
    records = spark.createDataFrame([("t", 0, 0, None, b"0123456789", 0)], LOG)
    fetch = spark.createDataFrame([(1, 0, "t", 0, 0, 100, 100, 0, False, True, None, SIZE - 1)], THROTTLED)
    assert fetch_response_records(fetch, records).count() == 0


def _reference_response(fetches, records):
    """The rule read plainly, request by request (no quotas): partitions in (fetch_order, topic,
    partition) order, each from its fetch offset while it stays within partition_max_bytes and the
    response within response_max_bytes; the response's first record always goes; a partition cut by
    the response's limit ends the response."""
    sent = set()
    requests = {}
    for f in fetches:
        requests.setdefault((f[0], f[1]), []).append(f)
    for request in requests.values():
        used, first = 0, True
        for broker, _, topic, partition, offset, p_max, r_max, _ in sorted(request, key=lambda f: (f[7], f[2], f[3])):
            log = sorted((r for r in records if (r[0], r[1]) == (topic, partition) and r[2] >= offset),
                         key=lambda r: r[2])
            if not log:
                continue
            fits = 0  # the partition's bytes within partition_max_bytes: what it takes of the response
            for _, _, o, _, value, _ in log:
                size = RECORD_OVERHEAD_BYTES + len(value)
                if fits + size > p_max:
                    break
                fits += size
                if used + fits <= r_max:
                    sent.add((broker, partition, o))
            if first:
                sent.add((broker, partition, log[0][2]))
                fits = max(fits, RECORD_OVERHEAD_BYTES + len(log[0][4]))
            used += fits
            first = False
    return sent


@pytest.mark.usefixtures("either_join")
def test_a_response_cut_from_long_logs_with_gaps_and_large_records_matches_the_rule_read_plainly(spark):
    """The response is decided on offsets and sizes, and the records (keys and values) joined to the
    offsets chosen: compared with the rule computed record by record, on logs of many records,
    compacted gaps (fetch offsets in them too), partitions of records larger than the limits, and
    limits that cut mid-partition and mid-request."""
    rng = random.Random(227)
    cases = []
    for _ in range(4):
        records = []
        for partition in range(10):
            size = rng.choice((5, 20, 400, None))  # None: sizes vary
            offset = 0
            for _ in range(rng.randrange(0, 60)):
                offset += rng.choice((1, 1, 1, 3)) if partition % 3 == 1 else 1  # compacted: gaps
                records.append(("t", partition, offset, None, b"v" * (size or rng.randrange(1, 30)), 0))
        response_max = {follower: rng.choice((SIZE * 8, SIZE * 40, 3000)) for follower in (1, 2)}
        fetches = [(follower, 0, "t", partition, rng.randrange(0, 8), rng.choice((SIZE * 3, SIZE * 12, 1000)),
                    response_max[follower], rng.randrange(0, 3))
                   for follower in (1, 2) for partition in range(10)]
        cases.append((records, fetches))
    # the first partition's records are all over partition_max_bytes: the first still goes
    cases.append(([("t", 0, o, None, b"v" * 400, 0) for o in range(5)], [(1, 0, "t", 0, 0, SIZE * 3, 5000, 0)]))
    # a fetch offset in a gap (5-9), the records after it without gaps: all that fit go
    cases.append(([("t", 0, o, None, b"v" * 10, 0) for o in (*range(5), *range(10, 60))],
                  [(1, 0, "t", 0, 6, SIZE * 45, 5000, 0)]))
    for n, (records, fetches) in enumerate(cases):
        result = fetch_response_records(spark.createDataFrame(fetches, FETCH), spark.createDataFrame(records, LOG))
        got = {(r["broker"], r["partition"], r["offset"]) for r in result.collect()}
        assert got == _reference_response(fetches, records), f"case {n}"
