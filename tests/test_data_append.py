"""The round's records numbered once and written once per broker (pipeline/data/append.py), with
exact frames: each request's base offset from the control job plus the record's place among its
request's records of the partition; a follower whose fetch took from the batch gets its slice."""

from chispa import assert_df_equality
from pyspark.sql.types import BooleanType, IntegerType, StringType, StructField, StructType

from pipeline.control.state import FETCH_TYPE, RESULT_TYPE
from pipeline.data.append import log_rows

INBOX = ("request_id string, record_index long, topic string, partition int, key binary, value binary, acks int, "
         "timestamp long, producer_id long, producer_epoch int, sequence int")
CONTROL = StructType([StructField("topic", StringType()), StructField("partition", IntegerType()),
                      StructField("is_known", BooleanType()), StructField("leader", IntegerType()),
                      StructField("leader_epoch", IntegerType()), StructField("fetches", FETCH_TYPE),
                      StructField("results", RESULT_TYPE)])


def record(request, index, partition, value, timestamp):
    return (request, index, "t", partition, None, value, 1, timestamp, None, None, None)


def result(request, base):
    return (request, base, base, 1, 1, "acked" if base is not None else "error", None)


def test_records_take_their_requests_base_offset_in_record_order_and_followers_their_slice(spark):
    # partition 0 (leader 0, epoch 3): r1's 3 records (stored out of order) from base 10, r2's one
    # at 13; follower 1 took [10, 14) of the batch, follower 2 [10, 12) (its response limit).
    # Partition 1 (leader 2, epoch 1): r1's record at 5; follower 0 read [5, 6) from the leader's
    # log (not from the batch: no copy here). r3 was refused (no base offset): nothing written.
    inbox = spark.createDataFrame(
        [record("r1", 2, 0, b"c", 7), record("r1", 0, 0, b"a", 7), record("r1", 1, 0, b"b", 7),
         record("r2", 0, 0, b"d", 8), record("r1", 3, 1, b"x", 7), record("r3", 0, 1, b"refused", 9)], INBOX)
    control = spark.createDataFrame(
        [("t", 0, True, 0, 3, [(1, 10, 14, True), (2, 10, 12, True)], [result("r1", 10), result("r2", 13)]),
         ("t", 1, True, 2, 1, [(0, 5, 6, False)], [result("r1", 5), result("r3", None)])], CONTROL)
    rows = log_rows(inbox, control).select("broker", "partition", "offset", "leader_epoch", "value", "timestamp")
    expected = ([(b, 0, o, 3, v, 7) for b in (0, 1) for o, v in ((10, b"a"), (11, b"b"), (12, b"c"))]
                + [(0, 0, 13, 3, b"d", 8), (1, 0, 13, 3, b"d", 8), (2, 0, 10, 3, b"a", 7), (2, 0, 11, 3, b"b", 7),
                   (2, 1, 5, 1, b"x", 7)])
    assert_df_equality(rows, spark.createDataFrame(
        expected, "broker int, partition int, offset long, leader_epoch int, value binary, timestamp long"),
        ignore_row_order=True, ignore_nullable=True)
