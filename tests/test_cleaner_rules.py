"""The log cleaner's rules (pipeline/control/cleaner.py) with exact frames: what is cleanable, what a clean
removes from a replica, and the tombstone horizon."""

from chispa import assert_df_equality

from pipeline.control.cleaner import cleanable_offsets, compacted_away, next_cleaner_state
from pipeline.config import LONG_MAX
from pipeline.control.replication import RECORD_OVERHEAD_BYTES

S = 2 + RECORD_OVERHEAD_BYTES  # one record: a 1-byte key and a 1-byte value
LEADER_COLS = ("topic string, partition int, offset long, timestamp long, key binary, value binary, "
               "log_start_offset long, high_watermark long, log_end_offset long, checkpoint long, "
               "min_compaction_lag_ms long, max_compaction_lag_ms long, min_cleanable_dirty_ratio double")
OFFSETS_OUT = ("topic string, partition int, first_dirty_offset long, first_uncleanable_offset long, "
               "clean_bytes long, dirty_bytes long, cleanable_ratio double, max_compaction_delay_ms long, "
               "cleanable boolean")


def leader(partition, offsets, lso, hw, leo, checkpoint=None, min_lag=0, max_lag=LONG_MAX, ratio=0.5, ts=None):
    return [("c", partition, o, (ts or (lambda x: x))(o), b"k", b"v", lso, hw, leo, checkpoint, min_lag, max_lag, ratio)
            for o in offsets]


def test_cleanable_offsets_bounds_ratio_and_compaction_lags(spark):
    rows = (
        # never cleaned: everything below the HW is dirty
        leader(0, range(8), 0, 6, 8)
        # cleaned up to 4, one dirty record (ratio 0.2 < 0.5), but older than max.compaction.lag.ms
        + leader(1, range(6), 0, 6, 6, checkpoint=4, max_lag=1000)
        # min.compaction.lag.ms: records from offset 4 are too young (ts 6000 > 10000 - 5000)
        + leader(2, range(8), 0, 8, 8, min_lag=5000, ts=lambda o: 1000 if o < 4 else 6000)
        # the checkpoint below the log start offset (records deleted since): starts there; the HW
        # is at the log start, so nothing is cleanable
        + leader(3, range(3, 5), 3, 3, 5, checkpoint=1)
    )
    result = cleanable_offsets(spark.createDataFrame(rows, LEADER_COLS), now_ms=10_000)
    expected = [
        ("c", 0, 0, 6, 0, 6 * S, 1.0, 0, True),  # the last record (7) and the HW (6) bound it
        ("c", 1, 4, 5, 4 * S, S, 0.2, 10_000 - 1000 - 4, True),
        ("c", 2, 0, 4, 0, 4 * S, 1.0, 0, True),
        ("c", 3, 3, 3, 0, 0, 0.0, 0, False),
    ]
    assert_df_equality(result, spark.createDataFrame(expected, OFFSETS_OUT), ignore_row_order=True,
                       ignore_nullable=True)


def test_cleanable_offsets_waits_for_the_dirty_ratio(spark):
    # 2 dirty of 6: 0.33 is not above 0.5, and nothing is past max.compaction.lag.ms
    rows = leader(0, range(7), 0, 7, 7, checkpoint=4)
    result = cleanable_offsets(spark.createDataFrame(rows, LEADER_COLS), now_ms=10_000).first()
    assert (result["dirty_bytes"], result["clean_bytes"], result["cleanable"]) == (2 * S, 4 * S, False)
    lower = leader(0, range(7), 0, 7, 7, checkpoint=4, ratio=0.3)
    assert cleanable_offsets(spark.createDataFrame(lower, LEADER_COLS), now_ms=10_000).first()["cleanable"]


RECORD_COLS = "topic string, partition int, broker int, offset long, leader_epoch int, key binary, value binary"
PLAN_COLS = "topic string, partition int, first_uncleanable_offset long, tombstone_horizon_offset long"


def test_compacted_away_keeps_the_last_of_each_key_epoch_starts_and_young_tombstones(spark):
    log = [
        (0, 0, b"a", b"1"),  # the first record of epoch 0: stays though superseded by 7
        (1, 0, b"b", b"1"),  # superseded by 3: goes
        (2, 0, None, b"x"),  # no key: goes
        (3, 0, b"b", b"2"),  # superseded by the tombstone 5: goes
        (4, 1, b"c", b"1"),  # the first record of epoch 1: stays
        (5, 1, b"b", None),  # a tombstone below the horizon (7): goes
        (6, 1, b"c", None),  # a tombstone below the horizon, but 4 (kept) holds c before it: stays
        (7, 1, b"a", b"2"),  # the last a: stays
        (8, 1, b"d", b"1"),  # at the first uncleanable offset: untouched though superseded by 9
        (9, 1, b"d", b"2"),
    ]
    rows = [("c", 0, broker, o, e, k, v) for broker in (0, 1) for o, e, k, v in log]
    rows += [("c", 1, 0, o, 0, b"k", b"v") for o in range(3)]  # not in the plan: untouched
    plan = spark.createDataFrame([("c", 0, 8, 7)], PLAN_COLS)
    result = compacted_away(spark.createDataFrame(rows, RECORD_COLS), plan)
    expected = [("c", 0, broker, o) for broker in (0, 1) for o in (1, 2, 3, 5)]
    assert_df_equality(result, spark.createDataFrame(expected, "topic string, partition int, broker int, offset long"),
                       ignore_row_order=True, ignore_nullable=True)


def test_compacted_away_keeps_tombstones_at_or_above_the_horizon(spark):
    rows = [("c", 0, 0, 0, 0, b"x", b"1"), ("c", 0, 0, 1, 0, b"b", b"1"), ("c", 0, 0, 2, 0, b"b", None),
            ("c", 0, 0, 3, 0, b"z", b"1")]
    removed = compacted_away(spark.createDataFrame(rows, RECORD_COLS), spark.createDataFrame([("c", 0, 3, 2)], PLAN_COLS))
    # the value under the tombstone goes; the tombstone itself (offset 2, horizon 2) stays
    assert [r["offset"] for r in removed.collect()] == [1]


STATE_COLS = ("topic string, partition int, first_uncleanable_offset long, delete_retention_ms long, "
              "generation_end_offset long, generation_ms long, tombstone_horizon_offset long")
STATE_OUT = ("topic string, partition int, first_dirty_offset long, generation_end_offset long, generation_ms long, "
             "tombstone_horizon_offset long, last_clean_ms long")


def test_next_cleaner_state_moves_the_tombstone_horizon_a_retention_after_a_generation(spark):
    plan = spark.createDataFrame([
        ("c", 0, 10, 100, None, None, None),  # never cleaned: a generation starts, no tombstone may go yet
        ("c", 1, 12, 100, 5, 900, 2),         # the generation is 100 ms old: tombstones below 5 may go
        ("c", 2, 12, 100, 5, 950, 2),         # 50 ms old: the horizon and the generation stay
    ], STATE_COLS)
    result = next_cleaner_state(plan, now_ms=1000)
    expected = [("c", 0, 10, 10, 1000, 0, 1000), ("c", 1, 12, 12, 1000, 5, 1000), ("c", 2, 12, 5, 950, 2, 1000)]
    assert_df_equality(result, spark.createDataFrame(expected, STATE_OUT), ignore_row_order=True,
                       ignore_nullable=True)
