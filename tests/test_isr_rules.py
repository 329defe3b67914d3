"""ISR and follower-fetch-state rules, as Kafka's IsrExpirationTest scenarios (lag 100 ms, leader LEO 20)."""

from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipeline.isr import maybe_expand_isr, out_of_sync_followers
from pipeline.replication import reset_follower_state_on_restart, update_follower_fetch_state

LAG_MS = 100
LEADER_LEO = 20
FOLLOWER_COLS = ("broker int, topic string, partition int, is_leader boolean, isr array<int>, fetch_offset long, "
                 "leader_leo long, last_fetch_time_ms long, last_fetch_leader_leo long, last_caught_up_time_ms long, "
                 "lag_time_max_ms long")
KEY_SCHEMA = "broker int, topic string, partition int"


def follower(spark, fetch_offset, last_fetch_time=0, last_fetch_leader_leo=0, last_caught_up=0):
    return spark.createDataFrame(
        [(1, "t", 0, False, [0, 1], fetch_offset, LEADER_LEO, last_fetch_time, last_fetch_leader_leo,
          last_caught_up, LAG_MS)], FOLLOWER_COLS)


def out_of_sync(spark, df, now):
    return out_of_sync_followers(df, now)


def test_stuck_follower_leaves_isr_after_the_lag_not_before(spark):
    # fetched once at t=0 one record short of the leader, then stopped fetching
    state = update_follower_fetch_state(follower(spark, LEADER_LEO - 1), now_ms=0)
    assert out_of_sync(spark, state, now=LAG_MS).count() == 0
    assert_df_equality(out_of_sync(spark, state, now=LAG_MS + 1),
                       spark.createDataFrame([(1, "t", 0)], KEY_SCHEMA))


def test_follower_that_never_fetched_leaves_isr_after_the_lag(spark):
    # no fetch at all: last caught up when the leader was elected (t=0)
    state = follower(spark, 0)
    assert out_of_sync(spark, state, now=LAG_MS).count() == 0
    assert out_of_sync(spark, state, now=LAG_MS + 1).count() == 1


def test_slow_follower_fetching_but_never_catching_up_leaves_isr(spark):
    # fetches every 40 ms but always behind both the leader's LEO and its LEO at the previous fetch
    state = update_follower_fetch_state(follower(spark, 10), now_ms=0)
    state = update_follower_fetch_state(state.withColumn("fetch_offset", F.lit(12).cast("long"))
                                        .withColumn("leader_leo", F.lit(25).cast("long")), now_ms=40)
    state = update_follower_fetch_state(state.withColumn("fetch_offset", F.lit(14).cast("long"))
                                        .withColumn("leader_leo", F.lit(30).cast("long")), now_ms=80)
    assert state.first()["last_caught_up_time_ms"] == 0
    assert out_of_sync(spark, state, now=LAG_MS + 1).count() == 1


def test_caught_up_follower_never_leaves_isr_however_long_it_idles(spark):
    state = update_follower_fetch_state(follower(spark, LEADER_LEO), now_ms=0)
    assert out_of_sync(spark, state, now=10 * LAG_MS).count() == 0
    assert out_of_sync(spark, state, now=10_000_000).count() == 0


def test_follower_one_fetch_behind_a_busy_leader_stays_in_sync(spark):
    # every fetch asks for the leader's LEO as of the previous fetch: caught up to that fetch's time
    state = update_follower_fetch_state(follower(spark, 10, last_caught_up=0), now_ms=0)  # leader LEO 20
    for t, fetch, leader_leo in [(60, 20, 30), (120, 30, 40), (180, 40, 50)]:
        state = update_follower_fetch_state(
            state.withColumn("fetch_offset", F.lit(fetch).cast("long"))
            .withColumn("leader_leo", F.lit(leader_leo).cast("long")), now_ms=t)
    row = state.first()
    assert (row["last_caught_up_time_ms"], row["last_fetch_time_ms"], row["last_fetch_leader_leo"]) == (120, 180, 50)
    assert out_of_sync(spark, state, now=200).count() == 0


def test_update_follower_fetch_state_exact_rule(spark):
    # rows: caught up to now; caught up to the last fetch; behind both
    rows = [
        (1, "t", 0, False, [0, 1], 20, 20, 50, 15, 10, LAG_MS),
        (1, "t", 1, False, [0, 1], 15, 20, 50, 15, 10, LAG_MS),
        (1, "t", 2, False, [0, 1], 14, 20, 50, 15, 10, LAG_MS),
    ]
    expected = [
        (1, "t", 0, False, [0, 1], 20, 20, 70, 20, 70, LAG_MS),
        (1, "t", 1, False, [0, 1], 15, 20, 70, 20, 50, LAG_MS),
        (1, "t", 2, False, [0, 1], 14, 20, 70, 20, 10, LAG_MS),
    ]
    result = update_follower_fetch_state(spark.createDataFrame(rows, FOLLOWER_COLS), now_ms=70)
    assert_df_equality(result.select(*spark.createDataFrame(rows, FOLLOWER_COLS).columns),
                       spark.createDataFrame(expected, FOLLOWER_COLS), ignore_row_order=True, ignore_nullable=True)


def test_reset_on_restart_exact_rule(spark):
    # Replica.resetReplicaState(isNewLeader = false): in the ISR -> fetched and caught up now;
    # outside it -> both 0; both remember the leader's LEO; LEO and fetch offset are kept
    cols = FOLLOWER_COLS + ", leader_leo_before long"
    rows = [(1, "t", 0, False, [0, 1], 12, 20, 50, 15, 40, LAG_MS, 18),
            (2, "t", 0, False, [0, 1], 9, 20, 50, 15, 30, LAG_MS, 18)]
    expected = [(1, "t", 0, False, [0, 1], 12, 20, 900, 18, 900, LAG_MS, 18),
                (2, "t", 0, False, [0, 1], 9, 20, 0, 18, 0, LAG_MS, 18)]
    result = reset_follower_state_on_restart(spark.createDataFrame(rows, cols), now_ms=900)
    assert_df_equality(result.select(*spark.createDataFrame(rows, cols).columns), spark.createDataFrame(expected, cols),
                       ignore_row_order=True, ignore_nullable=True)


def test_time_without_rounds_does_not_count_after_a_restart(spark):
    # last fetched at t=0 (caught up to LEO 0); no round for 50 lag times; then the leader appends
    # 20 records and the follower's next fetch asks for offset 0 in the restarted process's round
    idle = follower(spark, 0, last_fetch_time=0, last_fetch_leader_leo=0, last_caught_up=0)
    now = 50 * LAG_MS
    stale = update_follower_fetch_state(idle, now_ms=now)
    assert out_of_sync(spark, stale, now=now).count() == 1  # without the reset: out of sync at once
    reset = reset_follower_state_on_restart(idle.withColumn("leader_leo_before", F.lit(0).cast("long")), now)
    fresh = update_follower_fetch_state(reset, now_ms=now)
    assert fresh.first()["last_caught_up_time_ms"] == now
    assert out_of_sync(spark, fresh, now=now + LAG_MS).count() == 0
    assert out_of_sync(spark, fresh, now=now + LAG_MS + 1).count() == 1  # still stuck: out after the lag


def test_expand_isr_needs_leader_hw_and_current_epoch_start_offset(spark):
    schema = ("broker int, topic string, partition int, is_leader boolean, isr array<int>, fetch_offset long, "
              "leader_hw long, leader_epoch_start_offset long")
    rows = [
        (2, "t", 0, False, [0, 1], 10, 10, 5),   # at HW and past the epoch start: joins
        (2, "t", 1, False, [0, 1], 9, 10, 5),    # below the HW
        (2, "t", 2, False, [0, 1], 10, 10, 12),  # KAFKA-7128: below the leader epoch's start offset
        (1, "t", 3, False, [0, 1], 10, 10, 5),   # already in the ISR
    ]
    assert_df_equality(maybe_expand_isr(spark.createDataFrame(rows, schema)),
                       spark.createDataFrame([(2, "t", 0)], KEY_SCHEMA))


def test_empty_input_gives_empty_output(spark):
    empty = spark.createDataFrame([], FOLLOWER_COLS)
    assert out_of_sync_followers(empty, 0).count() == 0
