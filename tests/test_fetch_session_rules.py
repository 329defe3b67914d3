"""KIP-227 session rules with exact values: epochs, the cache's eviction order (the cases of Kafka's
FetchSessionTest: testSessionCache, testPrivilegedSessionHandling, testFetchSessionExpiration),
the leader's contexts, and the partitions a consumer's incremental responses carry (the round's
followers': tests/test_control_rules.py)."""

import random

from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipeline.errors import ErrorCode
from pipeline.control.session_cache import (EVICTION_MS, FINAL_EPOCH, INITIAL_EPOCH, MAX_EPOCH, Handle, Session, follow_up,
                                    must_respond, new_context, new_session_id, next_epoch, replica_fetcher,
                                    round_contexts, sessions_from_json, sessions_to_json, try_evict)


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


def test_response_carries_records_hw_or_log_start_changes_and_errors_and_an_unknown_cached_hw(spark):
    cols = "case string, records long, hw long, cached_hw long, lso long, cached_lso long, error string"
    rows = [("nothing new", 0, 10, 10, 0, 0, None), ("records", 3, 10, 10, 0, 0, None),
            ("hw moved", 0, 11, 10, 0, 0, None), ("log start moved", 0, 10, 10, 4, 0, None),
            ("error", 0, 10, 10, 0, 0, "OFFSET_OUT_OF_RANGE"),
            ("unknown", 0, 10, -1, 0, 0, None)]  # a cached HW -1 (never sent): sent
    df = spark.createDataFrame(rows, cols).select(
        "case", must_respond(F.col("records"), F.col("hw"), F.col("cached_hw"), F.col("lso"), F.col("cached_lso"),
                             F.col("error")).alias("must_respond"))
    expected = [("nothing new", False), ("records", True), ("hw moved", True), ("log start moved", True),
                ("error", True), ("unknown", True)]
    assert_df_equality(df, spark.createDataFrame(expected, "case string, must_respond boolean"),
                       ignore_row_order=True, ignore_nullable=True)


