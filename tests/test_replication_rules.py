"""Leader append, high watermark, fetch response and follower append rules with exact frames."""

import pytest
from chispa import assert_df_equality

from pipeline.replication import (RECORD_OVERHEAD_BYTES, assign_offsets, fetch_response_records, follower_log_end,
                                  maybe_increment_leader_hw, validate_produce_requests)

HW_COLS = ("topic string, partition int, broker int, is_leader boolean, leader_leo long, fetch_offset long, "
           "isr array<int>, replicas array<int>, min_isr int, lag_time_max_ms long, last_caught_up_time_ms long, "
           "high_watermark long")
HW_OUT = "topic string, partition int, high_watermark long, hw_changed boolean"


def hw_rows(partition, leader_leo, follower_offsets, isr, old_hw=0, min_isr=1, caught_up_ms=0):
    rows = [("t", partition, 0, True, leader_leo, leader_leo, isr, [0, 1, 2], min_isr, 100, 0, old_hw)]
    for broker, offset in follower_offsets.items():
        rows.append(("t", partition, broker, False, leader_leo, offset, isr, [0, 1, 2], min_isr, 100, caught_up_ms,
                     old_hw))
    return rows


def test_hw_is_min_leo_over_leader_and_isr(spark):
    rows = (hw_rows(0, 10, {1: 7, 2: 9}, [0, 1, 2])           # min over the ISR: 7
            + hw_rows(1, 10, {1: 10, 2: 3}, [0, 1])           # 2 out of ISR and not caught up: 10
            + hw_rows(2, 10, {1: 4, 2: 8}, [0, 1, 2], old_hw=6)  # never backwards: stays 6
            + hw_rows(3, 10, {1: 10, 2: 10}, [0], min_isr=2, old_hw=2))  # ISR < min ISR: frozen
    result = maybe_increment_leader_hw(spark.createDataFrame(rows, HW_COLS), now_ms=1000)
    expected = [("t", 0, 7, True), ("t", 1, 10, True), ("t", 2, 6, False), ("t", 3, 2, False)]
    assert_df_equality(result, spark.createDataFrame(expected, HW_OUT), ignore_row_order=True, ignore_nullable=True)


def test_hw_waits_for_caught_up_replica_eligible_to_join(spark):
    # broker 2 is not in the ISR but caught up within the lag: the HW waits for it (Kafka >= 2.x)
    rows = hw_rows(0, 10, {1: 10, 2: 6}, [0, 1], caught_up_ms=950)
    result = maybe_increment_leader_hw(spark.createDataFrame(rows, HW_COLS), now_ms=1000)
    assert result.first()["high_watermark"] == 6


def test_hw_does_not_wait_for_a_caught_up_replica_on_a_broker_that_is_down(spark):
    # as above, but broker 2 is stopped or fenced: it may not join the ISR, so the HW does not wait
    rows = hw_rows(0, 10, {1: 10, 2: 6}, [0, 1], caught_up_ms=950)
    result = maybe_increment_leader_hw(spark.createDataFrame(rows, HW_COLS), now_ms=1000, ineligible_brokers=[2])
    assert result.first()["high_watermark"] == 10


def test_hw_frozen_only_below_min_of_min_isr_and_replication_factor(spark):
    # min ISR 3 with 3 replicas all in ISR: advances
    rows = hw_rows(0, 10, {1: 10, 2: 10}, [0, 1, 2], min_isr=3)
    assert maybe_increment_leader_hw(spark.createDataFrame(rows, HW_COLS), now_ms=0).first()["high_watermark"] == 10


INBOX_COLS = ("request_id string, record_index long, topic string, partition int, key binary, value binary, "
              "acks int, timestamp long, producer_id long, producer_epoch int, sequence int, _commit_version long")
META_COLS = ("topic string, partition int, leader int, leader_epoch int, isr array<int>, min_isr int, "
             "message_max_bytes long, compact boolean")


def inbox(spark, rows, key=None):
    return spark.createDataFrame(
        [(r, i, t, p, key, v, a, 0, None, None, None, ver) for r, i, t, p, v, a, ver in rows], INBOX_COLS)


def test_validate_produce_requests_errors_per_request_partition(spark, either_join):
    meta = spark.createDataFrame([("t", 0, 0, 3, [0, 1], 2, 100, False), ("t", 1, 1, 3, [1], 2, 100, False),
                                  ("t", 2, -1, 3, [], 1, 100, False)], META_COLS)
    big = b"x" * 200
    rows = [("a", 0, "t", 0, b"v", -1, 1), ("b", 0, "t", 1, b"v", -1, 1), ("c", 0, "t", 1, b"v", 1, 1),
            ("d", 0, "nope", 0, b"v", 1, 1), ("e", 0, "t", 9, b"v", 1, 1), ("f", 0, "t", 2, b"v", 1, 1),
            ("g", 0, "t", 0, b"v", 1, 1), ("g", 1, "t", 0, big, 1, 1)]
    result = validate_produce_requests(inbox(spark, rows), meta).select("request_id", "record_index", "error_code")
    expected = [("a", 0, None), ("b", 0, "NOT_ENOUGH_REPLICAS"), ("c", 0, None),
                ("d", 0, "UNKNOWN_TOPIC_OR_PARTITION"), ("e", 0, "UNKNOWN_TOPIC_OR_PARTITION"),
                ("f", 0, "NOT_LEADER_OR_FOLLOWER"), ("g", 0, "MESSAGE_TOO_LARGE"), ("g", 1, "MESSAGE_TOO_LARGE")]
    assert_df_equality(result, spark.createDataFrame(expected, "request_id string, record_index long, error_code string"),
                       ignore_row_order=True, ignore_nullable=True)
    # a bulk round joins the records to the partitions' rows without shuffling them; a small one sort-merges
    plan = result._jdf.queryExecution().executedPlan().toString()
    assert ("BroadcastHashJoin" in plan, "SortMergeJoin" in plan) == (
        (True, False) if either_join == "broadcast" else (False, True))


@pytest.mark.usefixtures("either_join")
def test_a_compacted_topic_refuses_a_record_without_a_key_with_invalid_record(spark):
    # Kafka's LogValidator: "Compacted topic cannot accept message without key"
    meta = spark.createDataFrame([("c", 0, 0, 1, [0], 1, 100, True), ("d", 0, 0, 1, [0], 1, 100, False)], META_COLS)
    keyless = inbox(spark, [("a", 0, "c", 0, b"v", 1, 1), ("b", 0, "d", 0, b"v", 1, 1)])
    keyed = inbox(spark, [("k", 0, "c", 0, b"v", 1, 1)], key=b"k")
    result = validate_produce_requests(keyless.unionByName(keyed), meta).select("request_id", "error_code")
    assert_df_equality(result, spark.createDataFrame([("a", "INVALID_RECORD"), ("b", None), ("k", None)],
                                                     "request_id string, error_code string"),
                       ignore_row_order=True, ignore_nullable=True)


@pytest.mark.usefixtures("either_join")
def test_a_part_of_a_request_failing_two_checks_gets_the_first_and_a_record_without_a_partition_is_unknown(spark):
    # Kafka checks a batch's size before its records (UnifiedLog.analyzeAndValidateRecords, then
    # LogValidator): an oversized record fails its batch with MESSAGE_TOO_LARGE, wherever it sits
    meta = spark.createDataFrame([("c", 0, 0, 1, [0], 1, 100, True)], META_COLS)
    big = b"x" * 200
    keyless = inbox(spark, [("a", 0, "c", 0, b"v", 1, 1), ("b", 1, "c", 0, big, 1, 1), ("n", 0, "gone", None, b"v", 1, 1)])
    keyed = inbox(spark, [("a", 1, "c", 0, big, 1, 1), ("b", 0, "c", 0, b"v", 1, 1), ("k", 0, "c", 0, b"v", 1, 1)],
                  key=b"k")
    result = validate_produce_requests(keyless.unionByName(keyed), meta).select("request_id", "record_index", "error_code")
    expected = [("a", 0, "MESSAGE_TOO_LARGE"), ("a", 1, "MESSAGE_TOO_LARGE"), ("b", 0, "MESSAGE_TOO_LARGE"),
                ("b", 1, "MESSAGE_TOO_LARGE"), ("n", 0, "UNKNOWN_TOPIC_OR_PARTITION"), ("k", 0, None)]
    assert_df_equality(result, spark.createDataFrame(expected, "request_id string, record_index long, error_code string"),
                       ignore_row_order=True, ignore_nullable=True)


@pytest.mark.usefixtures("either_join")
def test_producer_id_epoch_and_sequence_come_together_or_not_at_all(spark):
    # Kafka's LogValidator: a client batch with a producer id and a negative sequence is an
    # INVALID_RECORD; an epoch or sequence without a producer id is one here too
    meta = spark.createDataFrame([("t", 0, 0, 1, [0], 1, 100, False)], META_COLS)
    fields = {"ok": (7, 0, 0), "none": (None, None, None), "no-seq": (7, 0, None), "negative-seq": (7, 0, -1),
              "no-epoch": (7, None, 0), "no-pid": (None, 0, 0), "seq-only": (None, None, 3), "negative-pid": (-1, 0, 0)}
    rows = [(r, 0, "t", 0, None, b"v", 1, 0, *f, 1) for r, f in fields.items()]
    result = validate_produce_requests(spark.createDataFrame(rows, INBOX_COLS), meta).select("request_id", "error_code")
    expected = [(r, None if r in ("ok", "none") else "INVALID_RECORD") for r in fields]
    assert_df_equality(result, spark.createDataFrame(expected, "request_id string, error_code string"),
                       ignore_row_order=True, ignore_nullable=True)


@pytest.mark.usefixtures("either_join")
def test_assign_offsets_from_leader_leo_in_produce_order(spark):
    rows = [("r2", 0, "t", 0, b"c", 1, 2), ("r1", 0, "t", 0, b"a", 1, 1), ("r1", 1, "t", 0, b"b", 1, 1),
            ("r1", 2, "t", 1, b"x", 1, 1)]
    leaders = spark.createDataFrame([("t", 0, 2, 4, 7), ("t", 1, 0, 4, 0)],
                                    "topic string, partition int, leader int, leader_epoch int, leader_leo long")
    result = assign_offsets(inbox(spark, rows), leaders).select("topic", "partition", "offset", "leader_epoch", "value",
                                                                "broker")
    expected = [("t", 0, 7, 4, b"a", 2), ("t", 0, 8, 4, b"b", 2), ("t", 0, 9, 4, b"c", 2), ("t", 1, 0, 4, b"x", 0)]
    assert_df_equality(result, spark.createDataFrame(
        expected, "topic string, partition int, offset long, leader_epoch int, value binary, broker int"),
        ignore_row_order=True, ignore_nullable=True)


LOG_COLS = "topic string, partition int, offset long, key binary, value binary, broker int"
FETCH_COLS = ("broker int, leader int, topic string, partition int, fetch_offset long, partition_max_bytes long, "
              "response_max_bytes long, fetch_order long")


@pytest.mark.usefixtures("either_join")
def test_fetch_response_from_fetch_offset_within_partition_max_bytes(spark):
    size = RECORD_OVERHEAD_BYTES + 10
    records = spark.createDataFrame([("t", 0, o, None, b"0123456789", 0) for o in range(6)], LOG_COLS)
    fetch = spark.createDataFrame([(1, 0, "t", 0, 2, 2 * size, 100 * size, 0), (2, 0, "t", 0, 5, 1, 100 * size, 0)],
                                  FETCH_COLS)
    result = fetch_response_records(fetch, records).select("broker", "offset")
    # broker 1: two records fit; broker 2: the limit fits none, but one record always goes
    assert_df_equality(result, spark.createDataFrame([(1, 2), (1, 3), (2, 5)], "broker int, offset long"),
                       ignore_row_order=True, ignore_nullable=True)


def test_follower_log_end_and_hw_is_min_of_leader_hw_and_own_leo(spark):
    fetch = spark.createDataFrame([(1, "t", 0, 5, 0), (2, "t", 0, 3, 0), (1, "t", 1, 4, 4), (1, "t", 2, 2, 0)],
                                  "broker int, topic string, partition int, fetch_offset long, high_watermark long")
    # partition 2 is compacted: offsets 2, 3 and 5 are gone, the response has 4 and 6
    response = spark.createDataFrame([("t", 0, o, None, b"v", 1) for o in (5, 6)]
                                     + [("t", 2, o, None, b"v", 1) for o in (4, 6)], LOG_COLS)
    hw = spark.createDataFrame([("t", 0, 5), ("t", 1, 4), ("t", 2, 9)], "topic string, partition int, high_watermark long")
    result = follower_log_end(fetch, response, hw).select("broker", "topic", "partition", "log_end_offset",
                                                          "high_watermark", "records_received")
    expected = [(1, "t", 0, 7, 5, 2), (2, "t", 0, 3, 3, 0), (1, "t", 1, 4, 4, 0), (1, "t", 2, 7, 7, 2)]
    assert_df_equality(result, spark.createDataFrame(
        expected, "broker int, topic string, partition int, log_end_offset long, high_watermark long, "
                  "records_received long"), ignore_row_order=True, ignore_nullable=True)
