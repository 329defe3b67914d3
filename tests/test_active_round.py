"""The active round on real Delta tables (pipeline/round/active.py): the control job, the
records numbered from each request's base offset and written once per broker, followers taking
their slice of the same batch, lagging followers' reads within the fetch limits; every replica
holds the same records at the same offsets."""

from pyspark.sql import functions as F

from pipeline.control.fetch_round import RoundContext
from pipeline.control.state import PARTITION_STATE_SCHEMA
from pipeline.round.control_job import produce_results
from pipeline.round.active import RoundTables, run_active_round
from pipeline.schemas import INBOX_SCHEMA


def empty_partition(p):
    return ("t", p, 0, p % 3, 1, 0, 1, [p % 3, (p + 1) % 3, (p + 2) % 3], [p % 3, (p + 1) % 3, (p + 2) % 3], [], 0, 2,
            30_000, *([[0, 0, 0]] * 8), [0, 0, 0], [0, 0, 0], [-1, -1, -1], [-1, -1, -1],
            [1, 1, 1])  # (in no fetch session; validated the leader's epoch)


def produced(spark, requests, version):
    """Inbox rows: (request, acks, [(partition, value), ...]) with record_index in request order."""
    rows = [(request, i, "t", p, None, value.encode(), acks, 0, None, None, None, None, None)
            for request, acks, records in requests for i, (p, value) in enumerate(records)]
    return spark.createDataFrame(rows, INBOX_SCHEMA).withColumn("_commit_version", F.lit(version).cast("long"))


def results_of(spark, tables):
    return produce_results(spark.read.format("delta").load(tables.partition_state))


def appender(tables):
    def append_all(appends):
        for df, path in appends:
            df.write.format("delta").mode("append").save(path)
    return append_all


def log(spark, path):
    return sorted((r["partition"], r["offset"], r["value"].decode(), r["leader_epoch"])
                  for r in spark.read.format("delta").load(path).collect())


def test_a_round_writes_each_record_once_per_replica_at_the_offsets_its_request_was_given(spark, tmp_path):
    tables = RoundTables({b: str(tmp_path / f"log{b}") for b in range(3)}, str(tmp_path / "state"))
    state = spark.createDataFrame([empty_partition(0), empty_partition(1)], PARTITION_STATE_SCHEMA)
    # a request over two partitions, its records interleaved; then another to partition 0
    first = produced(spark, [("a", -1, [(0, "a0"), (1, "a1"), (0, "a2")]), ("b", 1, [(0, "b0")])], 1)
    out = run_active_round(state, first, None, RoundContext(1, 100, (0, 1, 2)), 1, tables, appender(tables))
    assert (out.records_appended, out.records_replicated, out.requests_answered) == (4, 8, 3)
    expected = [(0, 0, "a0", 1), (0, 1, "a2", 1), (0, 2, "b0", 1), (1, 0, "a1", 1)]
    assert all(log(spark, tables.logs[b]) == expected for b in range(3))
    results = {(r["request_id"], r["partition"]): (r["base_offset"], r["last_offset"], r["status"])
               for r in results_of(spark, tables).collect()}
    assert results == {("a", 0): (0, 1, "acked"), ("a", 1): (0, 0, "acked"), ("b", 0): (2, 2, "acked")}
    # the next round starts from the carried state: offsets go on from each leader's LEO
    second = produced(spark, [("c", -1, [(1, "c0"), (1, "c1")])], 2)
    out = run_active_round(out.state, second, out.pending, RoundContext(2, 200, (0, 1, 2)), 1, tables, appender(tables))
    assert all(log(spark, tables.logs[b]) == expected + [(1, 1, "c0", 1), (1, 2, "c1", 1)] for b in range(3))
    after = {r["partition"]: (r["high_watermark"], r["log_end_offset"]) for r in out.state.collect()}
    assert after == {0: (3, [3, 3, 3]), 1: (3, [3, 3, 3])}
    # only the partition the round moved is persisted again
    assert [r["partition"] for r in spark.read.format("delta").load(tables.partition_state)
            .filter("round_id = 2").collect()] == [1]
    # an idle round of settled partitions writes nothing at all
    versions = [len(spark.sql(f"DESCRIBE HISTORY delta.`{p}`").collect()) for p in (*tables.logs.values(),
                                                                                    tables.partition_state)]
    idle = run_active_round(out.state, produced(spark, [], 3), out.pending, RoundContext(3, 300, (0, 1, 2)), 1,
                            tables, appender(tables))
    assert (idle.records_appended, idle.records_replicated, idle.requests_answered, idle.unsettled) == (0, 0, 0, 0)
    assert versions == [len(spark.sql(f"DESCRIBE HISTORY delta.`{p}`").collect()) for p in (*tables.logs.values(),
                                                                                            tables.partition_state)]


def test_a_paused_follower_gets_nothing_and_the_hw_waits_for_it_while_it_is_in_the_isr(spark, tmp_path):
    tables = RoundTables({b: str(tmp_path / f"log{b}") for b in range(3)}, str(tmp_path / "state"))
    state = spark.createDataFrame([empty_partition(0)], PARTITION_STATE_SCHEMA)
    out = run_active_round(state, produced(spark, [("a", -1, [(0, "x"), (0, "y")])], 1), None,
                           RoundContext(1, 100, (0, 1)), 1, tables, appender(tables))
    assert log(spark, tables.logs[0]) == log(spark, tables.logs[1]) == [(0, 0, "x", 1), (0, 1, "y", 1)]
    assert not (tmp_path / "log2").exists()  # broker 2 took nothing: no commit on its log
    # broker 2 is still in the ISR (within replica.lag.time.max.ms): the HW waits for it, the ack too
    row = out.state.first()
    assert row["high_watermark"] == 0 and row["log_end_offset"] == [2, 2, 0] and row["isr"] == [0, 1, 2]
    assert [r["status"] for r in results_of(spark, tables).collect()] == ["pending"]
    # its fetcher resumes: behind the leader's LEO, it reads the leader's log from its LEO and writes
    # both records; its follow-up fetch tells the leader, which moves the HW and answers the ack
    out = run_active_round(out.state, produced(spark, [], 2), out.pending, RoundContext(2, 200, (0, 1, 2)), 1,
                           tables, appender(tables), lagging_leaders=out.figures["lagging_leaders"])
    assert log(spark, tables.logs[2]) == [(0, 0, "x", 1), (0, 1, "y", 1)]
    row = out.state.first()
    assert (row["log_end_offset"], row["high_watermark"], out.records_replicated) == ([2, 2, 2], 2, 2)
    # broker 1 fetched before the HW moved: it learns HW 2 at its next fetch (as Kafka's follower
    # does when its waiting fetch is answered), so the partition settles a round later
    assert (row["replica_high_watermark"], out.unsettled) == ([2, 0, 2], 1)
    final = results_of(spark, tables).filter("round_id = 2").collect()
    assert [(r["request_id"], r["status"], r["base_offset"], r["last_offset"]) for r in final] == [("a", "acked", 0, 1)]


def test_a_lagging_follower_whose_fetch_is_refused_with_a_session_error_writes_nothing_of_its_read(spark, tmp_path):
    tables = RoundTables({b: str(tmp_path / f"log{b}") for b in range(3)}, str(tmp_path / "state"))
    state = spark.createDataFrame([empty_partition(0), empty_partition(1)], PARTITION_STATE_SCHEMA)
    out = run_active_round(state, produced(spark, [("a", 1, [(0, "x")])], 1), None, RoundContext(1, 100, (0, 1)), 1,
                           tables, appender(tables))
    # broker 2 resumes, 1 record behind on partition 0 (leader 0), whose leader answers its fetch
    # with FETCH_SESSION_ID_NOT_FOUND; its fetch from leader 1 takes partition 1's new record. The
    # range it is behind by on partition 0 was read before the job, and none of it is written
    contexts = ((1, 0, "sessionless", 0), (2, 0, "error", 7), (2, 1, "sessionless", 0), (0, 1, "sessionless", 0))
    out = run_active_round(out.state, produced(spark, [("b", 1, [(1, "y")])], 2), None,
                           RoundContext(2, 200, (0, 1, 2), fetch_contexts=contexts), 1, tables, appender(tables),
                           lagging_leaders=out.figures["lagging_leaders"])
    assert log(spark, tables.logs[2]) == [(1, 0, "y", 1)]
    assert {r["partition"]: r["log_end_offset"] for r in out.state.collect()} == {0: [1, 1, 0], 1: [1, 1, 1]}


def test_a_lagging_followers_read_of_the_leaders_log_runs_compiled_and_the_round_interpreted(spark, tmp_path,
                                                                                          monkeypatch):
    from pipeline.round import active
    tables = RoundTables({b: str(tmp_path / f"log{b}") for b in range(3)}, str(tmp_path / "state"))
    state = spark.createDataFrame([empty_partition(0)], PARTITION_STATE_SCHEMA)
    out = run_active_round(state, produced(spark, [("a", 1, [(0, "x"), (0, "y")])], 1), None,
                           RoundContext(1, 100, (0, 1)), 1, tables, appender(tables))
    keys = ("spark.sql.codegen.wholeStage", "spark.sql.codegen.factoryMode")
    session = tuple(spark.conf.get(k) for k in keys)
    assert session == ("false", "NO_CODEGEN")  # (the round's settings: FAST_CONFS)
    seen, read = [], active.read_lagging_ranges

    def reading(*args, **kwargs):  # the settings the read's plan is made and run under
        df = read(*args, **kwargs)
        checkpoint = df.localCheckpoint
        monkeypatch.setattr(df, "localCheckpoint", lambda *a: seen.append(tuple(spark.conf.get(k) for k in keys))
                            or checkpoint(*a))
        return df

    monkeypatch.setattr(active, "read_lagging_ranges", reading)
    out = run_active_round(out.state, produced(spark, [], 2), None, RoundContext(2, 200, (0, 1, 2)), 1, tables,
                           appender(tables), lagging_leaders=out.figures["lagging_leaders"])
    assert seen == [("true", "FALLBACK")]
    assert tuple(spark.conf.get(k) for k in keys) == session
    assert log(spark, tables.logs[2]) == [(0, 0, "x", 1), (0, 1, "y", 1)]


def test_a_lagging_followers_fetch_and_follow_up_each_take_the_partition_limit_at_least_one_record(spark, tmp_path):
    tables = RoundTables({b: str(tmp_path / f"log{b}") for b in range(3)}, str(tmp_path / "state"))
    state = spark.createDataFrame([empty_partition(0)], PARTITION_STATE_SCHEMA)
    records = [(0, "v" * 40) for _ in range(7)]  # 61 bytes each with the record overhead
    out = run_active_round(state, produced(spark, [("a", 1, records)], 1), None, RoundContext(1, 100, (0, 1)), 1,
                           tables, appender(tables))
    # broker 2 comes back 7 records behind; 130 bytes a partition: its fetch takes 2 records, its
    # follow-up 2 more
    ctx = dict(fetching_brokers=(0, 1, 2), partition_max_bytes=130)
    out = run_active_round(out.state, produced(spark, [], 2), None, RoundContext(2, 200, **ctx), 1, tables,
                           appender(tables))
    assert [o for _, o, _, _ in log(spark, tables.logs[2])] == [0, 1, 2, 3]
    # a limit below one record still moves one a response (KIP-74)
    ctx = dict(fetching_brokers=(0, 1, 2), partition_max_bytes=10)
    out = run_active_round(out.state, produced(spark, [], 3), None, RoundContext(3, 300, **ctx), 1, tables,
                           appender(tables))
    assert [o for _, o, _, _ in log(spark, tables.logs[2])] == [0, 1, 2, 3, 4, 5]
    out = run_active_round(out.state, produced(spark, [], 4), None, RoundContext(4, 400, **ctx), 1, tables,
                           appender(tables))
    assert [o for _, o, _, _ in log(spark, tables.logs[2])] == list(range(7))
    assert out.state.first()["log_end_offset"] == [7, 7, 7]


def test_a_lagging_followers_reads_share_the_response_limit_across_its_partitions(spark, tmp_path):
    tables = RoundTables({b: str(tmp_path / f"log{b}") for b in range(3)}, str(tmp_path / "state"))
    led_by_0 = [0, 3, 6, 9, 12]
    state = spark.createDataFrame([empty_partition(p) for p in led_by_0], PARTITION_STATE_SCHEMA)
    out = run_active_round(state, produced(spark, [("a", 1, [(p, "v" * 40) for p in led_by_0])], 1), None,
                           RoundContext(1, 100, (0, 1)), 1, tables, appender(tables))
    # broker 2 comes back a record behind on 5 partitions; a response holds 130 bytes (2 records):
    # the fetch takes partitions 0 and 3, the follow-up 6 and 9 (0 and 3 returned data: at the
    # back), the next round 12
    ctx = dict(fetching_brokers=(0, 1, 2), response_max_bytes=130)
    out = run_active_round(out.state, produced(spark, [], 2), None, RoundContext(2, 200, **ctx), 1, tables,
                           appender(tables), lagging_leaders=out.figures["lagging_leaders"])
    assert [p for p, _, _, _ in log(spark, tables.logs[2])] == [0, 3, 6, 9]
    out = run_active_round(out.state, produced(spark, [], 3), None, RoundContext(3, 300, **ctx), 1, tables,
                           appender(tables), lagging_leaders=out.figures["lagging_leaders"])
    assert [p for p, _, _, _ in log(spark, tables.logs[2])] == led_by_0
    # (partition 12's HW moved at broker 2's follow-up, after broker 1 fetched: it settles next round)
    assert (out.records_replicated, out.unsettled) == (1, 1)


def test_what_the_responses_leave_of_a_lagging_followers_read_is_not_written(spark, tmp_path):
    tables = RoundTables({b: str(tmp_path / f"log{b}") for b in range(3)}, str(tmp_path / "state"))
    state = spark.createDataFrame([empty_partition(0)], PARTITION_STATE_SCHEMA)
    out = run_active_round(state, produced(spark, [("a", 1, [(0, "v" * 40) for _ in range(7)])], 1), None,
                           RoundContext(1, 100, (0, 1)), 1, tables, appender(tables))
    # the partition limit (1 MB) lets broker 2 read all 7 records; the response limit (130 bytes)
    # lets its fetch and follow-up take 2 each: 4 are written, and its LEO says so
    out = run_active_round(out.state, produced(spark, [], 2), None,
                           RoundContext(2, 200, (0, 1, 2), response_max_bytes=130), 1, tables, appender(tables))
    assert [o for _, o, _, _ in log(spark, tables.logs[2])] == [0, 1, 2, 3]
    assert out.state.first()["log_end_offset"] == [7, 7, 4]


def test_a_request_answered_not_enough_replicas_after_append_is_in_the_leaders_log(spark, tmp_path):
    """Found by the seed-104 soak case on v2: the followers stopped fetching past the lag, so the
    round appends an acks=all request, shrinks the ISR under min ISR and answers it
    NOT_ENOUGH_REPLICAS_AFTER_APPEND. Its records were appended (the leader's LEO says so) and
    must be in the leader's log; they were left out of the numbering, which took only requests
    that did not fail."""
    tables = RoundTables({b: str(tmp_path / f"log{b}") for b in range(3)}, str(tmp_path / "state"))
    state = spark.createDataFrame([empty_partition(0)], PARTITION_STATE_SCHEMA)
    out = run_active_round(state, produced(spark, [("a", -1, [(0, "a0"), (0, "a1")])], 1), None,
                           RoundContext(1, 100_000, (0,)), 1, tables, appender(tables))
    assert [(r["status"], r["error_code"], r["base_offset"]) for r in results_of(spark, tables).collect()] == \
        [("error", "NOT_ENOUGH_REPLICAS_AFTER_APPEND", 0)]
    assert (out.state.first()["isr"], out.state.first()["log_end_offset"]) == ([0], [2, 0, 0])
    assert log(spark, tables.logs[0]) == [(0, 0, "a0", 1), (0, 1, "a1", 1)]


# -- the cluster's round (Cluster.run_round) -----------------------------------------------------
