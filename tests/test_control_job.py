"""Round v2's control job on Spark (pipeline/round/control_job.py): the partition state cogrouped with the
inbox summary by bucket, Kafka's rules over each bucket in one task. Scenarios with exact numbers,
among them the two defects of today's round that v2 fixes (issue "Round v2")."""

from dataclasses import replace

from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipeline.control.fetch_round import RoundContext
from pipeline.control.state import PARTITION_STATE_SCHEMA
from pipeline.round.control_job import (partition_state_from_tables, produce_results, producer_checks, run_control_job,
                                  summarise_inbox, with_producer_checks)
from pipeline.data.catch_up import with_reads
from pipeline.schemas import INBOX_SCHEMA

OUT = "topic string, partition int, isr array<int>, high_watermark long, log_end_offset array<long>, " \
      "partition_epoch int, isr_shrinks int, isr_expands int, is_settled boolean"
RESULTS = "request_id string, topic string, partition int, base_offset long, last_offset long, " \
          "record_count long, acks int, status string, error_code string, round_id long"

# the figures of a round that did nothing, over settled partitions
NOTHING = {"records_appended": 0, "records_replicated": 0, "results": 0, "requests_acked": 0, "requests_failed": 0,
           "pending_requests": 0, "brokers": set(), "changed": 0, "unsettled": 0, "isr_shrinks": 0, "isr_expands": 0,
           "isr_changes": 0, "lagging_leaders": set(), "under_replicated_partitions": 0,
           "under_min_isr_partitions": 0, "at_min_isr_partitions": 0, "offline_partitions": 0, "max_lag": 0,
           "fetch_request_partitions": 0, "fetch_response_partitions": 0, "followed_up_sessions": set(),
           "session_partitions_added": {}, "replicas": 0, "changed_replicas": 0, "log_start_brokers": set(),
           "throttled_bytes": {}, "hw_advances": 0}


def partition(topic="t", p=0, leader=0, isr=(0, 1, 2), hw=10, leo=(10, 10, 10), caught_up_ms=0, min_isr=2,
              lag_ms=1000, epoch_start=0, fetch_offset=None):
    fetch_offset = list(fetch_offset or leo)
    return (topic, p, 0, leader, 1, epoch_start, 1, [0, 1, 2], list(isr), [], hw, min_isr, lag_ms, [0, 0, 0], list(leo),
            [hw] * 3, fetch_offset, [caught_up_ms] * 3, fetch_offset, [caught_up_ms] * 3, [0, 0, 0],
            [0, 0, 0], [0, 0, 0], [-1, -1, -1], [-1, -1, -1], [1, 1, 1])  # in no fetch session, validated


def inbox(spark, rows):
    """Inbox rows (request, topic, partition, acks, records), committed at version 1."""
    data = [(request, i, topic, p, None, b"v" * 9, acks, 0, None, None, None, None, None)
            for request, topic, p, acks, n in rows for i in range(n)]
    return spark.createDataFrame(data, INBOX_SCHEMA).withColumn("_commit_version", F.lit(1).cast("long"))


def round_of(spark, partitions, produced, now, fetching=(0, 1, 2)):
    state = spark.createDataFrame(partitions, PARTITION_STATE_SCHEMA)
    out, _ = run_control_job(state, summarise_inbox(inbox(spark, produced), 1),
                             RoundContext(round_id=7, now_ms=now, fetching_brokers=fetching))
    return out


def test_followers_whose_follow_up_catches_them_up_are_not_shrunk(spark):
    # lag 1000 ms, min ISR 2; replicated and caught up at t=2900; no round until t=4500, then one
    # record: the follow-up fetch proves the followers at the leader's LEO, so the ISR stays whole
    # and the HW reaches the LEO in the same round (today's round shrank both followers)
    out = round_of(spark, [partition(caught_up_ms=2900)], [("r1", "t", 0, -1, 1)], now=4500)
    assert_df_equality(out.select(*[c.split()[0] for c in OUT.split(", ")]),
                       spark.createDataFrame([("t", 0, [0, 1, 2], 11, [11, 11, 11], 1, 0, 0, True)], OUT),
                       ignore_nullable=True)
    assert_df_equality(produce_results(out.withColumn("round_id", F.lit(7))),
                       spark.createDataFrame([("r1", "t", 0, 10, 10, 1, -1, "acked", None, 7)], RESULTS),
                       ignore_nullable=True)


def test_caught_up_followers_outside_the_isr_rejoin_an_idle_partition(spark):
    # ISR [2] of 3 with min ISR 2: the HW froze at 21 while both followers wrote all 27 records;
    # with no produce at all, their next fetch (at the leader's LEO) brings them back, and the HW to 27
    idle = partition(leader=2, isr=[2], hw=21, leo=(27, 27, 27), fetch_offset=(21, 21, 27), epoch_start=21)
    out = round_of(spark, [idle], [], now=60_000)
    assert_df_equality(out.select(*[c.split()[0] for c in OUT.split(", ")]),
                       spark.createDataFrame([("t", 0, [0, 1, 2], 27, [27, 27, 27], 2, 0, 2, True)], OUT),
                       ignore_nullable=True)


def test_a_follower_that_stops_fetching_is_shrunk_after_the_lag_and_the_hw_moves_without_it(spark):
    # follower 2 paused (not fetching), last caught up at t=0; at t=1001 it is out (lag 1000), and
    # with ISR [0, 1] >= min ISR 2 the HW follows the leader and follower 1
    out = round_of(spark, [partition()], [("r1", "t", 0, -1, 2)], now=1001, fetching=(0, 1))
    assert_df_equality(out.select(*[c.split()[0] for c in OUT.split(", ")]),
                       spark.createDataFrame([("t", 0, [0, 1], 12, [12, 12, 10], 2, 1, 0, False)], OUT),
                       ignore_nullable=True)


def test_refused_requests_write_nothing_and_name_kafkas_error(spark):
    under_min = partition(p=1, isr=[0], leo=(10, 5, 5), caught_up_ms=0)
    out = round_of(spark, [partition(), under_min],
                   [("all", "t", 1, -1, 2), ("one", "t", 1, 1, 3), ("nope", "u", 4, 1, 1)], now=10)
    assert_df_equality(produce_results(out.withColumn("round_id", F.lit(7))), spark.createDataFrame([
        ("all", "t", 1, None, None, 2, -1, "error", "NOT_ENOUGH_REPLICAS", 7),
        ("one", "t", 1, 10, 12, 3, 1, "acked", None, 7),
        ("nope", "u", 4, None, None, 1, 1, "error", "UNKNOWN_TOPIC_OR_PARTITION", 7)], RESULTS),
        ignore_nullable=True, ignore_row_order=True)
    appended = out.filter("partition = 1").select("records_appended", "log_end_offset").first()
    assert appended["records_appended"] == 3 and appended["log_end_offset"][0] == 13


def test_a_batch_the_leader_refuses_before_its_sequence_is_no_part_of_the_producers_sequence(spark):
    # partition 1 is under min ISR: "all" (acks=all, sequences 0-1) is refused NOT_ENOUGH_REPLICAS
    # before the producer state is looked at, so "one" (acks=1, the same sequences) is a new batch,
    # not a retry of it; "two" continues it; "old" retries the stored batch 0-1 of producer 8
    data = [(request, i, "t", 1, None, b"v", acks, 0, pid, 0, first + i, None, None)
            for request, acks, pid, first, n in (("all", -1, 7, 0, 2), ("one", 1, 7, 0, 2), ("two", 1, 7, 2, 1),
                                                 ("old", 1, 8, 0, 2))
            for i in range(n)]
    rows = spark.createDataFrame(data, INBOX_SCHEMA).withColumn(
        "_commit_version", F.lit(1).cast("long"))
    state = spark.createDataFrame([partition(p=1, isr=[0], leo=(10, 5, 5))], PARTITION_STATE_SCHEMA)
    topics = spark.createDataFrame([("t", 1_000_000, False)], "topic string, message_max_bytes long, compact boolean")
    stored = spark.createDataFrame([("t", 1, 8, 0, 0, 1, 3, 4)], "topic string, partition int, producer_id long, "
                                   "producer_epoch int, base_sequence int, last_sequence int, base_offset long, "
                                   "last_offset long")
    checks = producer_checks(rows, state, topics, stored)
    assert_df_equality(checks.select("request_id", "outcome", "error_code", "original_base_offset", "duplicate_of"),
                       spark.createDataFrame([("one", "append", None, None, None), ("two", "append", None, None, None),
                                              ("old", "duplicate", None, 3, None)],
                                             "request_id string, outcome string, error_code string, "
                                             "original_base_offset long, duplicate_of string"),
                       ignore_nullable=True, ignore_row_order=True)
    out, figures = run_control_job(state, with_producer_checks(summarise_inbox(rows, 1), checks),
                                   RoundContext(round_id=7, now_ms=10, fetching_brokers=(0,)))
    assert_df_equality(produce_results(out.withColumn("round_id", F.lit(7))), spark.createDataFrame([
        ("all", "t", 1, None, None, 2, -1, "error", "NOT_ENOUGH_REPLICAS", 7),
        ("one", "t", 1, 10, 11, 2, 1, "acked", None, 7), ("two", "t", 1, 12, 12, 1, 1, "acked", None, 7),
        ("old", "t", 1, 3, 4, 2, 1, "acked", None, 7)], RESULTS), ignore_nullable=True, ignore_row_order=True)
    assert figures["records_appended"] == 3


def test_a_lagging_follower_reads_a_range_of_the_leaders_log_and_takes_the_batch_after_it(spark):
    # follower 2 is 4 records behind the leader's LEO before the round and read them (offsets 6-9)
    # before the job: its first response is that read and, the read having reached the leader's
    # LEO before the round, this round's batch, as follower 1's; its follow-up fetch at 12 proves
    # it: back in the ISR, HW = LEO
    state = spark.createDataFrame([partition(leo=(10, 10, 6), isr=(0, 1))], PARTITION_STATE_SCHEMA)
    read = spark.createDataFrame([("t", 0, offset, None, b"v" * 9, 2) for offset in range(6, 10)],
                                 "topic string, partition int, offset long, key binary, value binary, broker int")
    out, figures = run_control_job(with_reads(state, read), summarise_inbox(inbox(spark, [("r1", "t", 0, 1, 2)]), 1),
                                   RoundContext(round_id=7, now_ms=10, fetching_brokers=(0, 1, 2)))
    fetches = out.select(F.explode("fetches").alias("f")).select("f.*")
    assert_df_equality(fetches, spark.createDataFrame(
        [(1, 10, 12, True), (2, 6, 10, False), (2, 10, 12, True)],
        "broker int, from_offset long, to_offset long, from_batch boolean"), ignore_nullable=True, ignore_row_order=True)
    row = out.first()
    assert (row["isr"], row["high_watermark"], row["log_end_offset"], row["isr_expands"]) == ([0, 1, 2], 12, [12] * 3, 1)
    assert (figures["records_replicated"], figures["lagging_leaders"]) == (8, set())


def test_the_partition_state_of_todays_tables_gathers_each_replicas_row_in_replica_order(spark, new_cluster, clock):
    cluster = new_cluster()
    cluster.create_topic("orders", partitions=1, replication_factor=3)
    cluster.produce("orders", [{"value": "a", "partition": 0}, {"value": "b", "partition": 0}], acks="all")
    clock.advance(500)
    cluster.run_round()
    storage = cluster.storage
    state = partition_state_from_tables(storage.read("partitions"), storage.read("replica_state"), 1,
                                        min_isr=1, lag_time_max_ms=30_000)
    row = state.first()
    replicas = row["replicas"]
    assert sorted(replicas) == [0, 1, 2] and row["leader"] == replicas[0]
    assert row["log_end_offset"] == [2, 2, 2] and row["high_watermark"] == 2
    newest = {}
    for r in storage.read("replica_state").collect():  # the newest row of each replica
        if r["broker"] not in newest or r["round_id"] > newest[r["broker"]]["round_id"]:
            newest[r["broker"]] = r
    assert row["last_fetch_time_ms"] == [newest[b]["last_fetch_time_ms"] for b in replicas]
    # the followers' entries in their leader's session cache (the leader is in none)
    assert row["session_id"] == [newest[b]["session_id"] for b in replicas] and row["session_id"][0] == 0
    assert all(row["session_id"][1:]) and row["session_high_watermark"] == [-1, 2, 2]
    # and the control job takes it as it is: an idle round in those sessions (incremental fetches)
    # keeps it settled, and its requests and responses carry nothing (KIP-227)
    contexts = tuple((int(c.fetcher.split("-")[1]), c.leader, "incremental", c.session_id)
                     for c in cluster.fetch_requests())
    ctx = RoundContext(round_id=9, now_ms=1000, fetching_brokers=(0, 1, 2), fetch_contexts=contexts)
    out, figures = run_control_job(state, summarise_inbox(inbox(spark, []), 1), ctx)
    # each broker hosts the partition, its leader leads it, both followers at its LEO
    per_broker = {"broker_gauges": {**{("PartitionCount", b): 1 for b in replicas}, ("LeaderCount", replicas[0]): 1},
                  "broker_max_lag": {b: 0 for b in replicas[1:]}}
    assert figures == {**NOTHING, "replicas": 3, **per_broker}
    out = out.first()
    assert out["high_watermark"] == 2 and out["is_settled"] and out["isr"] == replicas
    # without a session every follower fetches in full: each partition in each request and response
    _, figures = run_control_job(state, summarise_inbox(inbox(spark, []), 1), replace(ctx, fetch_contexts=()))
    assert figures == {**NOTHING, "fetch_request_partitions": 2, "fetch_response_partitions": 2, "changed": 1,
                       "replicas": 3, "changed_replicas": 3, **per_broker}


def test_the_rounds_figures_come_back_with_the_control_jobs_tasks(spark):
    # two buckets (fetchers), each a task: the figures are summed over both
    state = spark.createDataFrame([partition(p=0, leo=(10, 10, 6), isr=(0, 1)), partition(p=1)],
                                  PARTITION_STATE_SCHEMA).withColumn("bucket", F.col("partition"))
    _, figures = run_control_job(state, summarise_inbox(inbox(spark, [("r1", "t", 0, 1, 2), ("r2", "t", 1, 1, 3)]), 2)
                                 .withColumn("bucket", F.col("partition")),
                                 RoundContext(round_id=7, now_ms=10, fetching_brokers=(0, 1, 2)))
    # partition 0: 2 appended, follower 1 takes them (2 lags, and read nothing before the job);
    # partition 1: 3 to both
    # partition 0 ends at min ISR 2 with follower 2 six records behind, under-replicated. Without
    # sessions every fetch is full: the 4 first fetches, and the follow-ups of the fetchers that took
    # records, full again: partition 0's follower 1 and partition 1's two (a bucket is a fetcher of
    # its own, and follower 2's fetcher of partition 0 took nothing): 7 in requests and responses.
    # One HW moves: partition 1's. Partition 0's waits for follower 2, out of the ISR but caught up
    # within replica.lag.time.max.ms (Kafka's Partition.maybeIncrementLeaderHW)
    assert figures == {**NOTHING, "records_appended": 5, "records_replicated": 8, "results": 2, "requests_acked": 2,
                       "brokers": {0, 1, 2}, "changed": 2, "unsettled": 1, "lagging_leaders": {0},
                       "under_replicated_partitions": 1, "at_min_isr_partitions": 1, "max_lag": 6,
                       "fetch_request_partitions": 7, "fetch_response_partitions": 7, "replicas": 6,
                       "changed_replicas": 6, "hw_advances": 1,
                       # broker 0 leads both; partition 0 is under-replicated and at its min ISR (2), and
                       # broker 2 lags six records behind on it (MaxLag)
                       "broker_gauges": {("PartitionCount", 0): 2, ("PartitionCount", 1): 2, ("PartitionCount", 2): 2,
                                         ("LeaderCount", 0): 2, ("UnderReplicatedPartitions", 0): 1,
                                         ("AtMinIsrPartitionCount", 0): 1},
                       "broker_max_lag": {1: 0, 2: 6}}
