"""Idempotent producers: retries appended once, sequence gaps and fenced epochs refused."""

from chispa import assert_df_equality

from pipeline import Cluster, ManualClock
from pipeline.control.producer_state import batches_in_leader_log, check_producer_sequences, producer_batches, retained_batches

ROWS = ("request_id string, topic string, partition int, _commit_version long, producer_id long, "
        "producer_epoch int, sequence int")
STATE = ("topic string, partition int, producer_id long, producer_epoch int, base_sequence int, last_sequence int, "
         "base_offset long, last_offset long")
OUT = ("request_id string, outcome string, error_code string, original_base_offset long, original_last_offset long, "
       "duplicate_of string")


def rows(spark, batches):
    data = []
    for request, version, pid, epoch, sequences in batches:
        data += [(request, "t", 0, version, pid, epoch, s) for s in sequences]
    return spark.createDataFrame(data, ROWS)


def test_sequence_rules(spark):
    state = spark.createDataFrame([(7, 0, 0, 2, 10, 12), (7, 0, 3, 4, 20, 21), (9, 3, 0, 0, 30, 30)],
                                  "producer_id long, producer_epoch int, base_sequence int, last_sequence int, "
                                  "base_offset long, last_offset long").selectExpr("'t' AS topic", "0 AS partition", "*")
    batches = producer_batches(rows(spark, [
        ("retry-old", 1, 7, 0, [0, 1, 2]),     # a retained batch: duplicate, original offsets
        ("next", 1, 7, 0, [5, 6]),             # continues 3-4: appended
        ("retry-next", 2, 7, 0, [5, 6]),       # same batch again in this round: duplicate of "next"
        ("gap", 3, 7, 0, [9]),                 # 7-8 missing: out of order
        ("after-gap", 4, 7, 0, [7]),           # would continue 5-6 but follows a failed batch
        ("fenced", 1, 9, 2, [1]),              # older epoch than the stored 3
        ("bumped", 1, 11, 0, [0]),             # a new producer starts at 0
        ("new-bad", 1, 12, 0, [4]),            # a new producer must start at 0
        ("holes", 1, 13, 0, [0, 2]),           # a batch with a hole in its sequences
    ]))
    result = check_producer_sequences(batches, retained_batches(state.select(*[c.split()[0] for c in STATE.split(", ")])))
    expected = [
        ("retry-old", "duplicate", None, 10, 12, None), ("next", "append", None, None, None, None),
        ("retry-next", "duplicate", None, None, None, "next"),
        ("gap", "error", "OUT_OF_ORDER_SEQUENCE_NUMBER", None, None, None),
        ("after-gap", "error", "OUT_OF_ORDER_SEQUENCE_NUMBER", None, None, None),
        ("fenced", "error", "INVALID_PRODUCER_EPOCH", None, None, None),
        ("bumped", "append", None, None, None, None),
        ("new-bad", "error", "OUT_OF_ORDER_SEQUENCE_NUMBER", None, None, None),
        ("holes", "error", "OUT_OF_ORDER_SEQUENCE_NUMBER", None, None, None),
    ]
    assert_df_equality(result.select(*[c.split()[0] for c in OUT.split(", ")]), spark.createDataFrame(expected, OUT),
                       ignore_row_order=True, ignore_nullable=True)


def test_retained_batches_keeps_the_last_five(spark):
    state = spark.createDataFrame([("t", 0, 1, 0, s, s, s, s) for s in range(8)], STATE)
    assert sorted(r["base_sequence"] for r in retained_batches(state).collect()) == [3, 4, 5, 6, 7]


def test_a_batch_above_a_later_elections_start_offset_is_not_in_the_new_leaders_log(spark):
    state_cols = STATE + ", round_id long"
    state = spark.createDataFrame([
        ("t", 0, 7, 0, 0, 2, 10, 12, 3),   # below the election's start offset 20: the new leader has it
        ("t", 0, 7, 0, 3, 4, 20, 21, 5),   # at 20-21 before the election: only the old leader had it
        ("t", 0, 8, 0, 0, 0, 19, 20, 5),   # straddles 20: its end is gone
        ("t", 0, 9, 0, 0, 0, 20, 20, 6),   # appended by the new leader in the election's round
        ("t", 1, 7, 0, 0, 0, 5, 5, 4),     # partition 1 went offline: no leader, no log moved
        ("u", 0, 7, 0, 0, 0, 30, 30, 2),   # another topic's partition 0: its own elections only
    ], state_cols)
    elections = spark.createDataFrame([("t", 0, 6, 20), ("t", 1, 9, None), ("u", 0, 1, 0)],
                                      "topic string, partition int, round_id long, start_offset long")
    expected = spark.createDataFrame([("t", 0, 7, 0, 0, 2, 10, 12, 3), ("t", 0, 9, 0, 0, 0, 20, 20, 6),
                                      ("t", 1, 7, 0, 0, 0, 5, 5, 4), ("u", 0, 7, 0, 0, 0, 30, 30, 2)], state_cols)
    assert_df_equality(batches_in_leader_log(state, elections), expected, ignore_row_order=True, ignore_nullable=True)


def batch(pid, first, count, value="v"):
    return [{"value": f"{value}{first + i}", "partition": 0, "producer_id": pid, "producer_epoch": 0,
             "sequence": first + i} for i in range(count)]


def test_retry_is_appended_once_and_acked_with_its_original_offsets(spark, tmp_path):
    clock = ManualClock(0)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=2, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=2)
    cluster.produce("t", [{"value": "other", "partition": 0}], acks=1)
    first = cluster.produce("t", batch(7, 0, 3), acks="all")
    clock.advance(500)
    cluster.run_round()
    retry = cluster.produce("t", batch(7, 0, 3), acks="all")        # the ack was lost: sent again
    gap = cluster.produce("t", batch(7, 5, 1), acks="all")          # sequences 3-4 missing
    clock.advance(500)
    cluster.run_round()
    follow = cluster.produce("t", batch(7, 3, 2), acks=1)           # the sequence continues
    clock.advance(500)
    cluster.run_round()
    clock.advance(500)
    cluster.run_round()
    results = {r["request_id"]: (r["status"], r["error_code"], r["base_offset"], r["last_offset"])
               for r in cluster.produce_results().collect()}
    assert results[first] == ("acked", None, 1, 3)
    assert results[retry] == ("acked", None, 1, 3)
    assert results[gap] == ("error", "OUT_OF_ORDER_SEQUENCE_NUMBER", None, None)
    assert results[follow] == ("acked", None, 4, 5)
    for replica in (0, 1):
        values = [bytes(r["value"]).decode() for r in cluster.read("t", replica=replica).orderBy("offset").collect()]
        assert values == ["other", "v0", "v1", "v2", "v3", "v4"]


def test_a_retry_of_a_batch_the_new_leader_never_had_is_appended_not_answered_as_a_duplicate(spark, tmp_path):
    """Soak seed 110: the leader appends an acks=all idempotent batch, crashes before its followers
    fetch it and is fenced; the producer gets NOT_LEADER_OR_FOLLOWER and retries the batch with its
    sequences. The new leader's log ends below that batch, so the retry is a new batch there: it is
    appended, replicated and acked (before, the stored state of the lost batch made every retry a
    duplicate of offsets nobody had, pending for ever)."""
    epoch_ms = 1_700_000_000_000
    clock = ManualClock(epoch_ms)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=3, config={"min.insync.replicas": 2}, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=3)  # leader 0
    cluster.produce("t", batch(7, 0, 2, "a"), acks="all")
    for _ in range(2):
        clock.advance(500)
        cluster.run_round()
    cluster.pause_fetcher(1), cluster.pause_fetcher(2)
    lost = cluster.produce("t", batch(7, 2, 2), acks="all")
    clock.advance(500)
    cluster.run_round()  # on leader 0 only, at offsets 2-3
    cluster.stop_broker(0)
    cluster.resume_fetcher(1), cluster.resume_fetcher(2)
    clock.advance(9001)  # broker 0's session ends: fenced, broker 1 leads from its LEO 2
    cluster.run_round()
    assert cluster.elections().first()["start_offset"] == 2
    retry = cluster.produce("t", batch(7, 2, 2), acks="all")
    for _ in range(3):
        clock.advance(500)
        cluster.run_round()
    results = {r["request_id"]: (r["status"], r["error_code"], r["base_offset"], r["last_offset"])
               for r in cluster.produce_results().collect()}
    assert results[lost] == ("error", "NOT_LEADER_OR_FOLLOWER", 2, 3)
    assert results[retry] == ("acked", None, 2, 3)
    for replica in (1, 2):
        values = [bytes(r["value"]).decode() for r in cluster.read("t", replica=replica).orderBy("offset").collect()]
        assert values == ["a0", "a1", "v2", "v3"]
