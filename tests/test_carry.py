"""Carried rows (pipeline/round/carry.py): a pinned base and the rows changed since, read by key."""

from chispa import assert_df_equality

from pipeline.round import carry
from pipeline.round.carry import Keyed

SCHEMA = "topic string, partition int, broker int, leo long"
KEYS = ["topic", "partition", "broker"]


def rows(spark, data):
    return spark.createDataFrame(data, SCHEMA)


def test_a_round_reads_its_working_set_from_base_and_changes(spark):
    state = Keyed.of(rows(spark, [("t", 0, 0, 5), ("t", 0, 1, 5), ("t", 1, 0, 7), ("u", 0, 0, 1)]), KEYS)
    assert state.base_rows == 4 and state.changes is None
    changed = state.updated(rows(spark, [("t", 0, 1, 6), ("t", 2, 0, 1)]), 2)
    assert changed.base is state.base and changed.changed_rows == 2  # no fold: the base is kept
    work = spark.createDataFrame([("t", 0), ("t", 2)], "topic string, partition int")
    assert_df_equality(changed.within(work), rows(spark, [("t", 0, 0, 5), ("t", 0, 1, 6), ("t", 2, 0, 1)]),
                       ignore_row_order=True)
    assert_df_equality(changed.all(), rows(spark, [("t", 0, 0, 5), ("t", 0, 1, 6), ("t", 1, 0, 7), ("u", 0, 0, 1),
                                                   ("t", 2, 0, 1)]), ignore_row_order=True)
    # a later change of the same key replaces the earlier one
    again = changed.updated(rows(spark, [("t", 0, 1, 9)]), 1)
    assert_df_equality(again.within(work), rows(spark, [("t", 0, 0, 5), ("t", 0, 1, 9), ("t", 2, 0, 1)]),
                       ignore_row_order=True)


def test_every_row_without_a_working_set_and_no_change_is_the_same_carry(spark):
    state = Keyed.of(rows(spark, [("t", 0, 0, 5)]), KEYS)
    assert state.updated(rows(spark, []), 0) is state
    assert_df_equality(state.within(None), rows(spark, [("t", 0, 0, 5)]))
    empty = spark.createDataFrame([], "topic string, partition int")
    assert state.within(empty).count() == 0


def test_changes_fold_into_a_new_base_at_a_tenth_of_it(spark, monkeypatch):
    monkeypatch.setattr(carry, "FOLD_MIN_ROWS", 1)
    base = rows(spark, [("t", p, 0, 0) for p in range(20)])
    state = Keyed.of(base, KEYS)
    one = state.updated(rows(spark, [("t", 0, 0, 1)]), 1)
    assert one.changes is not None and one.base is state.base  # 1 < 20 / 10
    two = one.updated(rows(spark, [("t", 1, 0, 1)]), 1)
    assert two.changes is None and two.base_rows == 20 and two.changed_rows == 0  # 2 >= 20 / 10: folded
    assert_df_equality(two.all(), rows(spark, [("t", p, 0, 1 if p < 2 else 0) for p in range(20)]),
                       ignore_row_order=True)
