"""The leader's produce checks with exact frames (the rules after them: tests/test_control_rules.py)."""

from chispa import assert_df_equality

from pipeline.control.replication import validate_produce_requests


INBOX_COLS = ("request_id string, record_index long, topic string, partition int, key binary, value binary, "
              "acks int, timestamp long, producer_id long, producer_epoch int, sequence int, _commit_version long")
META_COLS = ("topic string, partition int, leader int, leader_epoch int, isr array<int>, min_isr int, "
             "message_max_bytes long, compact boolean")


def inbox(spark, rows, key=None):
    return spark.createDataFrame(
        [(r, i, t, p, key, v, a, 0, None, None, None, ver) for r, i, t, p, v, a, ver in rows], INBOX_COLS)


def test_validate_produce_requests_errors_per_request_partition(spark):
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


def test_a_compacted_topic_refuses_a_record_without_a_key_with_invalid_record(spark):
    # Kafka's LogValidator: "Compacted topic cannot accept message without key"
    meta = spark.createDataFrame([("c", 0, 0, 1, [0], 1, 100, True), ("d", 0, 0, 1, [0], 1, 100, False)], META_COLS)
    keyless = inbox(spark, [("a", 0, "c", 0, b"v", 1, 1), ("b", 0, "d", 0, b"v", 1, 1)])
    keyed = inbox(spark, [("k", 0, "c", 0, b"v", 1, 1)], key=b"k")
    result = validate_produce_requests(keyless.unionByName(keyed), meta).select("request_id", "error_code")
    assert_df_equality(result, spark.createDataFrame([("a", "INVALID_RECORD"), ("b", None), ("k", None)],
                                                     "request_id string, error_code string"),
                       ignore_row_order=True, ignore_nullable=True)


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


