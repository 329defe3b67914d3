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


def test_retries_in_one_round_of_a_retained_or_refused_batch_are_answered_alike(spark):
    """Soak seed 18: two retries of a retained batch in one round are both duplicates of it, with its
    offsets (not the second a duplicate of the first, which appended nothing); two copies of a
    refused batch in one round are both refused."""
    state = spark.createDataFrame([("t", 0, 7, 0, 0, 2, 10, 12), ("t", 0, 9, 3, 0, 0, 30, 30)], STATE)
    batches = producer_batches(rows(spark, [
        ("retry-a", 1, 7, 0, [0, 1, 2]),       # a retained batch, sent again
        ("retry-b", 2, 7, 0, [0, 1, 2]),       # and again, in the same round
        ("fenced-a", 1, 9, 2, [1]),            # an older epoch than the stored 3
        ("fenced-b", 2, 9, 2, [1]),            # the same batch again: refused the same way
    ]))
    result = check_producer_sequences(batches, retained_batches(state))
    expected = [
        ("retry-a", "duplicate", None, 10, 12, None), ("retry-b", "duplicate", None, 10, 12, None),
        ("fenced-a", "error", "INVALID_PRODUCER_EPOCH", None, None, None),
        ("fenced-b", "error", "INVALID_PRODUCER_EPOCH", None, None, None),
    ]
    assert_df_equality(result.select(*[c.split()[0] for c in OUT.split(", ")]), spark.createDataFrame(expected, OUT),
                       ignore_row_order=True, ignore_nullable=True)


def test_retained_batches_keeps_the_last_five(spark):
    state = spark.createDataFrame([("t", 0, 1, 0, s, s, s, s) for s in range(8)], STATE)
    assert sorted(r["base_sequence"] for r in retained_batches(state).collect()) == [3, 4, 5, 6, 7]


def test_a_batch_counts_while_its_leaders_log_holds_its_last_record(spark):
    state_cols = STATE + ", round_id long"
    state = spark.createDataFrame([
        ("t", 0, 7, 0, 0, 2, 10, 12, 3),   # the leader's record at 12 is its last: held
        ("t", 0, 7, 0, 3, 4, 20, 21, 5),   # at or above the leader's LEO 20: another leader's, gone
        ("t", 0, 8, 0, 0, 1, 14, 15, 4),   # the leader holds another producer's record at 15: gone
        ("t", 0, 9, 1, 0, 0, 16, 16, 4),   # the record at 16 is of epoch 0, the batch's 1: gone
        ("t", 0, 9, 0, 4, 4, 17, 17, 4),   # the record at 17 has sequence 3: gone
        ("t", 0, 6, 0, 0, 0, 18, 18, 4),   # no record at 18 (compacted away), below the LEO: held
        ("t", 0, 5, 0, 0, 0, 2, 2, 1),     # below the leader's log start 5 (deleted records): held
        ("t", 1, 7, 0, 0, 0, 5, 5, 4),     # partition 1's leader is down: its log is not read, held
        ("u", 0, 7, 0, 0, 0, 30, 30, 2),   # another topic's partition 0, at its leader's LEO: gone
    ], state_cols)
    leaders = spark.createDataFrame([("t", 0, 2, 5, 20), ("u", 0, 1, 0, 30)],
                                    "topic string, partition int, broker int, log_start_offset long, "
                                    "log_end_offset long")
    logs = spark.createDataFrame([
        (2, "t", 0, 12, 7, 0, 2), (2, "t", 0, 15, None, None, None), (2, "t", 0, 16, 9, 0, 0),
        (2, "t", 0, 17, 9, 0, 3), (1, "t", 0, 12, 8, 0, 0),  # broker 1 is no leader of t-0
        (1, "u", 0, 29, 7, 0, 0)],
        "broker int, topic string, partition int, offset long, producer_id long, producer_epoch int, sequence int")
    expected = spark.createDataFrame([("t", 0, 7, 0, 0, 2, 10, 12, 3), ("t", 0, 6, 0, 0, 0, 18, 18, 4),
                                      ("t", 0, 5, 0, 0, 0, 2, 2, 1), ("t", 1, 7, 0, 0, 0, 5, 5, 4)], state_cols)
    assert_df_equality(batches_in_leader_log(state, leaders, logs), expected, ignore_row_order=True,
                       ignore_nullable=True)


def batch(pid, first, count, value="v"):
    return [{"value": f"{value}{first + i}", "partition": 0, "producer_id": pid, "producer_epoch": 0,
             "sequence": first + i} for i in range(count)]


def run_rounds(cluster, clock, n):
    for _ in range(n):
        clock.advance(500)
        cluster.run_round()


def outcomes(cluster):
    """request id -> (status, error_code, base_offset, last_offset)."""
    return {r["request_id"]: (r["status"], r["error_code"], r["base_offset"], r["last_offset"])
            for r in cluster.produce_results().collect()}


def values_of(cluster, replica):
    return [bytes(r["value"]).decode() for r in cluster.read("t", replica=replica).orderBy("offset").collect()]


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
    results = outcomes(cluster)
    assert results[first] == ("acked", None, 1, 3)
    assert results[retry] == ("acked", None, 1, 3)
    assert results[gap] == ("error", "OUT_OF_ORDER_SEQUENCE_NUMBER", None, None)
    assert results[follow] == ("acked", None, 4, 5)
    for replica in (0, 1):
        assert values_of(cluster, replica) == ["other", "v0", "v1", "v2", "v3", "v4"]


def test_a_copy_with_acks_1_of_a_batch_refused_not_enough_replicas_in_the_same_round_is_appended(spark, tmp_path):
    """A custom client sends one idempotent batch twice before a round, first with acks=all, then
    with acks=1, while the ISR is below min.insync.replicas. The leader refuses the first with
    NOT_ENOUGH_REPLICAS before it looks at the producer state, so the second is no duplicate: it
    is appended and acked with its own offsets (not the offsets of a copy that appended nothing).
    The HW stays put below min ISR, so a read_committed reader sees nothing yet."""
    clock = ManualClock(1_700_000_000_000)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=2, config={"min.insync.replicas": 2}, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=2)  # leader 0
    run_rounds(cluster, clock, 1)
    cluster.stop_broker(1)
    clock.advance(9001)  # broker 1's session ends: fenced, the ISR is [0]
    cluster.run_round()
    refused = cluster.produce("t", batch(7, 0, 2), acks="all")
    copy = cluster.produce("t", batch(7, 0, 2), acks=1)
    run_rounds(cluster, clock, 1)
    results = outcomes(cluster)
    assert results[refused] == ("error", "NOT_ENOUGH_REPLICAS", None, None)
    assert results[copy] == ("acked", None, 0, 1)
    log = cluster.read("t", replica=0, isolation="read_uncommitted").orderBy("offset").collect()
    assert [bytes(r["value"]).decode() for r in log] == ["v0", "v1"]
    assert values_of(cluster, 0) == []


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
    run_rounds(cluster, clock, 2)
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
    run_rounds(cluster, clock, 3)
    results = outcomes(cluster)
    assert results[lost] == ("error", "NOT_LEADER_OR_FOLLOWER", 2, 3)
    assert results[retry] == ("acked", None, 2, 3)
    for replica in (1, 2):
        assert values_of(cluster, replica) == ["a0", "a1", "v2", "v3"]


def test_a_retry_after_a_leader_that_never_took_over_is_a_duplicate_of_the_batch_still_held(spark, tmp_path):
    """Soak seed 10: a preferred election names a lagging follower that has just crashed (its broker
    session has not ended, so the controller still counts it); it never leads, so no follower
    truncates to its LEO. When its session ends, the old leader is elected again with the batch
    still in its log, and the producer's retry of that batch is a duplicate answered with the
    original offsets (before, the first election's start offset below the batch made it count as
    gone, and the retry was appended a second time)."""
    clock = ManualClock(1_700_000_000_000)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=3, config={"min.insync.replicas": 2}, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=3)  # replicas [0, 1, 2], leader 0
    cluster.produce("t", batch(7, 0, 2, "a"), acks="all")
    cluster.reassign_partitions({("t", 0): [2, 0, 1]})  # broker 2 is the preferred leader; 0 still leads
    run_rounds(cluster, clock, 2)
    cluster.pause_fetcher(2)
    first = cluster.produce("t", batch(7, 2, 2), acks=1)
    run_rounds(cluster, clock, 2)  # at offsets 2-3 on brokers 0 and 1; broker 2 (paused, in the ISR) has 2
    cluster.stop_broker(2)
    cluster.elect_preferred_leaders("t", 0)
    run_rounds(cluster, clock, 1)
    clock.advance(9001)  # broker 2's session ends: fenced, broker 0 leads again
    cluster.run_round()
    elections = [(r["leader"], r["start_offset"]) for r in cluster.elections().orderBy("round_id").collect()]
    assert elections[-2:] == [(2, 2), (0, 4)]
    retry = cluster.produce("t", batch(7, 2, 2), acks="all")
    run_rounds(cluster, clock, 3)
    results = outcomes(cluster)
    assert results[first] == ("acked", None, 2, 3)
    assert results[retry] == ("acked", None, 2, 3)
    for replica in (0, 1):
        assert values_of(cluster, replica) == ["a0", "a1", "v2", "v3"]


def test_two_retries_in_one_round_of_an_appended_batch_are_acked_with_its_offsets(spark, tmp_path):
    """Soak seed 18: the ack of an appended batch is lost and the producer's two retries of it reach
    the leader before one round; both are answered with the batch's offsets (before, the second was
    acked with base offset -1)."""
    clock = ManualClock(0)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=2, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=2)
    cluster.produce("t", [{"value": "other", "partition": 0}], acks=1)
    first = cluster.produce("t", batch(7, 0, 2), acks="all")
    run_rounds(cluster, clock, 1)
    retries = [cluster.produce("t", batch(7, 0, 2), acks="all") for _ in range(2)]
    run_rounds(cluster, clock, 2)
    results = outcomes(cluster)
    assert results[first] == ("acked", None, 1, 2)
    assert [results[r] for r in retries] == [("acked", None, 1, 2)] * 2
    for replica in (0, 1):
        assert values_of(cluster, replica) == ["other", "v0", "v1"]
