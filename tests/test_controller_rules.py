"""Controller and leader-epoch rules, each against an exact expected DataFrame: fencing by heartbeat,
elections (clean, unclean, offline, ISR without fenced brokers), the new leader's reset of its
followers, and Kafka's leader-epoch lookup table (PartitionTest.testLastFetchedOffsetValidation)."""

from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipeline.control.controller import (diverging_epoch, elect_leaders, elect_preferred_leaders, end_offset_for_epoch, epoch_cache,
                                 expired_broker_sessions, new_leader_high_watermark,
                                 reset_followers_for_new_leader, truncation_offset)

PARTITION_COLS = ("topic string, partition int, leader int, leader_epoch int, partition_epoch int, "
                  "replicas array<int>, isr array<int>, unclean boolean")
ELECTED_COLS = PARTITION_COLS + ", previous_leader int, election string"


def test_a_stopped_broker_is_fenced_once_its_session_has_expired_not_before(spark):
    brokers = spark.createDataFrame(
        [(0, "running", None), (1, "stopped", 1000), (2, "stopped", 2000), (3, "fenced", 0)],
        "broker int, state string, last_heartbeat_ms long")
    # 1000 + 9000 < 11000: expired; 2000 + 9000 = 11000: still a valid session
    assert_df_equality(expired_broker_sessions(brokers, now_ms=11000, session_timeout_ms=9000),
                       spark.createDataFrame([(1,)], "broker int"))
    assert expired_broker_sessions(brokers, now_ms=10000, session_timeout_ms=9000).count() == 0


def test_elections_after_broker_1_is_fenced(spark):
    partitions = spark.createDataFrame([
        ("t", 0, 1, 4, 7, [1, 2, 3], [1, 2, 3], False),  # leader fenced: next ISR member leads
        ("t", 1, 2, 0, 0, [2, 1, 3], [2, 1], False),     # a follower fenced: only the ISR shrinks
        ("t", 2, 1, 0, 0, [1, 2], [1], False),           # the last ISR member fenced: offline, ISR kept
        ("t", 3, 1, 0, 0, [1, 2], [1], True),            # ... unless unclean election is allowed
        ("t", 4, -1, 5, 9, [3, 2], [3], False),          # offline, its ISR member is live again
        ("t", 5, 2, 0, 0, [2, 3], [2, 3], False),        # untouched
        ("t", 6, 1, 2, 2, [1, 3, 2], [1, 2], False),     # the first live ISR member, not the first replica
    ], PARTITION_COLS)
    expected = spark.createDataFrame([
        ("t", 0, 2, 5, 8, [1, 2, 3], [2, 3], False, 1, "clean"),
        ("t", 1, 2, 0, 1, [2, 1, 3], [2], False, 2, None),
        ("t", 2, -1, 1, 1, [1, 2], [1], False, 1, "offline"),
        ("t", 3, 2, 1, 1, [1, 2], [2], True, 1, "unclean"),
        ("t", 4, 3, 6, 10, [3, 2], [3], False, -1, "clean"),
        ("t", 6, 2, 3, 3, [1, 3, 2], [2], False, 1, "clean"),
    ], ELECTED_COLS)
    assert_df_equality(elect_leaders(partitions, live_brokers=[0, 2, 3]), expected, ignore_row_order=True,
                       ignore_nullable=True)


def test_an_offline_partition_stays_offline_and_unchanged_while_no_candidate_is_live(spark):
    partitions = spark.createDataFrame([("t", 0, -1, 1, 1, [1, 2], [1], False)], PARTITION_COLS)
    assert elect_leaders(partitions, live_brokers=[0, 2]).count() == 0


def test_a_broker_that_lost_its_log_leaves_the_isr_even_as_its_last_member(spark):
    partitions = spark.createDataFrame([
        ("t", 0, 3, 0, 0, [3, 2], [3], False),
        ("t", 1, 2, 0, 0, [2, 3], [2, 3], False),
    ], PARTITION_COLS)
    expected = spark.createDataFrame([
        ("t", 0, -1, 1, 1, [3, 2], [], False, 3, "offline"),
        ("t", 1, 2, 0, 1, [2, 3], [2], False, 2, None),
    ], ELECTED_COLS)
    assert_df_equality(elect_leaders(partitions, live_brokers=[2, 3], removed_brokers=[3]), expected,
                       ignore_row_order=True, ignore_nullable=True)


def test_preferred_leader_election_moves_leadership_back_to_the_first_replica_when_it_can(spark):
    partitions = spark.createDataFrame([
        ("t", 0, 2, 3, 5, [1, 2, 3], [1, 2, 3], False),  # broker 1 is back in the ISR: it leads again
        ("t", 1, 2, 1, 1, [1, 2], [2], False),           # not in the ISR: stays
        ("t", 2, 1, 0, 0, [1, 2], [1, 2], False),        # leads already
        ("t", 3, 3, 0, 0, [0, 3], [0, 3], False),        # broker 0 is not live
    ], PARTITION_COLS)
    assert_df_equality(elect_preferred_leaders(partitions, live_brokers=[1, 2, 3]),
                       spark.createDataFrame([("t", 0, 1, 4, 6, [1, 2, 3], [1, 2, 3], False, 2, "preferred")],
                                             ELECTED_COLS), ignore_nullable=True)


def test_a_new_leader_resets_its_followers_and_starts_from_the_partition_hw(spark):
    followers = spark.createDataFrame([
        (2, [1, 2], 30, 25, 999, 999, 999),  # in the new ISR: caught up now, relied on up to the HW
        (3, [1, 2], 30, 12, 999, 999, 999),  # out of it: never caught up
    ], "broker int, isr array<int>, leader_leo long, fetch_offset long, partition_hw long, "
       "last_caught_up_time_ms long, last_fetch_time_ms long")
    followers = followers.withColumn("partition_hw", F.lit(20).cast("long")).withColumn(
        "last_fetch_leader_leo", F.lit(0).cast("long"))
    out = reset_followers_for_new_leader(followers, now_ms=5000).select(
        "broker", "fetch_offset", "last_caught_up_time_ms", "last_fetch_time_ms", "last_fetch_leader_leo")
    assert_df_equality(out, spark.createDataFrame(
        [(2, 20, 5000, 5000, 30), (3, 12, 0, 0, 30)],
        "broker int, fetch_offset long, last_caught_up_time_ms long, last_fetch_time_ms long, "
        "last_fetch_leader_leo long"), ignore_nullable=True)
    hw = spark.createDataFrame([(20, 30), (20, 14)], "hw long, leo long").select(
        new_leader_high_watermark(F.col("hw"), F.col("leo")).alias("hw"))
    assert [r["hw"] for r in hw.collect()] == [20, 14]  # clean keeps it; unclean goes back to its LEO


# Kafka's PartitionTest.testLastFetchedOffsetValidation: the leader's log has epochs 0@0, 3@2, 4@8,
# 7@13 and 9@14, LEO 17, and it leads epoch 10 (elected at 17).
EPOCHS = [(0, 0, 2), (3, 2, 6), (4, 8, 5), (7, 13, 1), (9, 14, 3)]  # (epoch, first offset, records)


def _leader_log(spark):
    rows = [("t", 0, 0, first + i, epoch) for epoch, first, count in EPOCHS for i in range(count)]
    return spark.createDataFrame(rows, "topic string, partition int, broker int, offset long, leader_epoch int")


def _lookup(spark, requests, log_start):
    current = spark.createDataFrame([("t", 0, 0, 10, 17)],
                                    "topic string, partition int, broker int, epoch int, start_offset long")
    cache = epoch_cache(_leader_log(spark), current)
    df = spark.createDataFrame([("t", 0, 0, e, o, 17, log_start) for e, o in requests],
                               "topic string, partition int, broker int, requested_epoch int, fetch_offset long, "
                               "log_end_offset long, log_start_offset long")
    looked = end_offset_for_epoch(df, cache)
    out = looked.withColumn("outcome", diverging_epoch(F.col("requested_epoch"), F.col("fetch_offset"),
                                                       F.col("end_epoch"), F.col("end_offset")))
    return out.select("requested_epoch", "fetch_offset", "outcome", "end_epoch", "end_offset")


OUTCOME_COLS = "requested_epoch int, fetch_offset long, outcome string, end_epoch int, end_offset long"


def test_epoch_cache_is_each_epochs_first_offset_plus_the_leaders_current_epoch(spark):
    current = spark.createDataFrame([("t", 0, 0, 10, 17)],
                                    "topic string, partition int, broker int, epoch int, start_offset long")
    assert_df_equality(
        epoch_cache(_leader_log(spark), current).select("epoch", "start_offset"),
        spark.createDataFrame([(0, 0), (3, 2), (4, 8), (7, 13), (9, 14), (10, 17)], "epoch int, start_offset long"),
        ignore_row_order=True, ignore_nullable=True)


def test_an_epoch_entry_past_a_later_epochs_start_was_truncated_away(spark):
    # epoch 5 once started at 20 on this replica, which was truncated and then took epoch 6 at 18
    current = spark.createDataFrame([("t", 0, 0, 5, 20), ("t", 0, 0, 6, 18)],
                                    "topic string, partition int, broker int, epoch int, start_offset long")
    log = spark.createDataFrame([("t", 0, 0, 0, 1)], "topic string, partition int, broker int, offset long, leader_epoch int")
    assert_df_equality(epoch_cache(log, current).select("epoch", "start_offset"),
                       spark.createDataFrame([(1, 0), (6, 18)], "epoch int, start_offset long"),
                       ignore_row_order=True, ignore_nullable=True)


def test_diverging_epochs_of_kafkas_last_fetched_offset_validation(spark):
    requests = [(2, 5), (0, 4), (6, 6), (5, 9), (10, 18), (0, 2), (7, 14), (9, 17), (10, 17), (11, 5)]
    expected = spark.createDataFrame([
        (2, 5, "diverging", 0, 2),
        (0, 4, "diverging", 0, 2),
        (6, 6, "diverging", 4, 13),
        (5, 9, "diverging", 4, 13),
        (10, 18, "diverging", 10, 17),
        (0, 2, None, 0, 2),
        (7, 14, None, 7, 14),
        (9, 17, None, 9, 17),
        (10, 17, None, 10, 17),
        (11, 5, "out_of_range", -1, -1),  # an epoch larger than the leader knows
    ], OUTCOME_COLS)
    assert_df_equality(_lookup(spark, requests, log_start=0), expected, ignore_row_order=True, ignore_nullable=True)


def test_diverging_epochs_after_the_log_start_moved_into_epoch_3(spark):
    expected = spark.createDataFrame([
        (2, 8, "diverging", 2, 5),
        (0, 5, None, 0, 5),
        (3, 5, None, 3, 8),
    ], OUTCOME_COLS)
    assert_df_equality(_lookup(spark, [(2, 8), (0, 5), (3, 5)], log_start=5), expected, ignore_row_order=True,
                       ignore_nullable=True)


def test_truncation_offset_of_a_follower_told_its_epoch_diverges(spark):
    df = spark.createDataFrame([
        # leader (E, O), follower endOffsetFor(E) = (e, o), follower LEO
        (4, 13, 4, 15, 16),   # knows E: min(O, o, LEO), done
        (4, 13, 3, 11, 16),   # knows only an older epoch: min(o, LEO), ask again
        (4, 13, -1, -1, 16),  # knows none: min(O, LEO), done
        (4, 13, 4, 15, 12),   # never beyond its own LEO
    ], "leader_epoch int, leader_end long, follower_epoch int, follower_end long, leo long")
    offset, done = truncation_offset(F.col("leader_epoch"), F.col("leader_end"), F.col("follower_epoch"),
                                     F.col("follower_end"), F.col("leo"))
    assert [(r[0], r[1]) for r in df.select(offset, done).collect()] == [(13, True), (11, False), (13, True), (12, True)]
