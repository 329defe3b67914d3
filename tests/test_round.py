"""The round on real Delta tables (pipeline/round/): the active round's control job, the
records numbered from each request's base offset and written once per broker, followers taking
their slice of the same batch; every replica holds the same records at the same offsets."""

from pathlib import Path

from pyspark.sql import functions as F

from pipeline.control.fetch_round import RoundContext
from pipeline.control.state import PARTITION_STATE_SCHEMA
from pipeline.control.replication import RECORD_OVERHEAD_BYTES
from pipeline.round.control_job import produce_results
from pipeline.round import Carry, table_versions
from pipeline.round import run as round_run
from pipeline.round.active import RoundTables, run_active_round
from pipeline.schemas import INBOX_SCHEMA
from pipeline.storage import added_rows, all_null


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

def v2_cluster(new_cluster, clock, topic_config=None, **config):
    """A cluster with a topic, after its first round (the retention check is due in it)."""
    cluster = new_cluster(config=config)
    cluster.create_topic("orders", partitions=2, replication_factor=3,
                         config={"min.insync.replicas": 2, **(topic_config or {})})
    cluster.run_round()
    clock.advance(100)
    return cluster


def ran_v2(cluster):
    """The last round was an active one of this process, which left its carry."""
    return isinstance(cluster.core.carry, Carry)


def test_a_v2_cluster_round_appends_replicates_answers_and_then_idles(spark, new_cluster, clock):
    cluster = v2_cluster(new_cluster, clock)
    request = cluster.produce("orders", [{"value": f"v{i}", "partition": i % 2} for i in range(5)], acks="all")
    report = cluster.run_round()
    assert ran_v2(cluster)
    assert (report.records_appended, report.records_replicated, report.requests_acked, report.pending_requests,
            report.fetch_request_partitions, report.under_replicated_partitions) == (5, 10, 2, 0, 4, 0)
    assert sorted((r["partition"], r["base_offset"], r["last_offset"], r["status"])
                  for r in cluster.produce_results().filter(F.col("request_id") == request).collect()) == \
        [(0, 0, 2, "acked"), (1, 0, 1, "acked")]
    assert sorted((r["partition"], r["broker"], r["log_end_offset"], r["high_watermark"])
                  for r in cluster.replicas("orders").collect()) == \
        [(p, b, 3 - p, 3 - p) for p in range(2) for b in range(3)]
    assert sorted((r["partition"], r["offset"], r["value"].decode())
                  for r in spark.sql("SELECT * FROM replog.committed WHERE topic = 'orders'").collect()) == \
        [(0, 0, "v0"), (0, 1, "v2"), (0, 2, "v4"), (1, 0, "v1"), (1, 1, "v3")]
    # nothing left to do: the next round writes its rounds row only
    written = [cluster.storage.version(t) for t in ("replica_state", "results", "partitions")]
    clock.advance(100)
    idle = cluster.run_round()
    assert (idle.records_appended, idle.active_partitions, idle.pending_requests) == (0, 0, 0)
    assert [cluster.storage.version(t) for t in ("replica_state", "results", "partitions")] == written


def test_a_v2_round_refuses_records_over_message_max_bytes_and_keyless_records_on_a_compacted_topic(
        new_cluster, clock):
    cluster = v2_cluster(new_cluster, clock, topic_config={"message.max.bytes": 100, "cleanup.policy": "compact"})
    large = cluster.produce("orders", [{"key": "k", "value": "x" * 200, "partition": 0}], acks=1)
    keyless = cluster.produce("orders", [{"value": "x", "partition": 1}], acks=1)
    fine = cluster.produce("orders", [{"key": "k", "value": "x", "partition": 1}], acks=1)
    report = cluster.run_round()
    assert ran_v2(cluster)
    assert (report.records_appended, report.requests_failed, report.requests_acked) == (1, 2, 1)
    assert {r["request_id"]: (r["status"], r["error_code"]) for r in cluster.produce_results().collect()} == {
        large: ("error", "MESSAGE_TOO_LARGE"), keyless: ("error", "INVALID_RECORD"), fine: ("acked", None)}


def test_idempotent_producers_run_in_v2_retries_answered_with_their_offsets_and_written_once(new_cluster, clock):
    cluster = v2_cluster(new_cluster, clock)

    def batch(first, count, value):
        return [{"value": f"{value}{first + i}", "partition": 0, "producer_id": 7, "producer_epoch": 0,
                 "sequence": first + i} for i in range(count)]

    first = cluster.produce("orders", batch(0, 2, "a"), acks=1)
    again = cluster.produce("orders", batch(0, 2, "a"), acks=1)  # a retry in the same round: its offsets
    cluster.run_round()
    assert ran_v2(cluster)
    plain = cluster.produce("orders", [{"value": "y", "partition": 0}], acks=1)
    retry = cluster.produce("orders", batch(0, 2, "a"), acks="all")  # a stored batch: answered, not written
    bad = cluster.produce("orders", [{"value": "z", "partition": 0, "producer_id": 7, "producer_epoch": -1,
                                      "sequence": 2}], acks=1)  # INVALID_RECORD first: no part of the sequence
    nxt = cluster.produce("orders", batch(2, 1, "a"), acks="all")     # continues 0-1
    gap = cluster.produce("orders", batch(4, 1, "a"), acks=1)        # sequence 3 missing
    clock.advance(100)
    report = cluster.run_round()
    assert ran_v2(cluster)
    assert report.records_appended == 2  # plain and nxt
    results = {r["request_id"]: (r["status"], r["error_code"], r["base_offset"], r["last_offset"])
               for r in cluster.produce_results().collect()}
    assert results == {first: ("acked", None, 0, 1), again: ("acked", None, 0, 1), plain: ("acked", None, 2, 2),
                       retry: ("acked", None, 0, 1), gap: ("error", "OUT_OF_ORDER_SEQUENCE_NUMBER", None, None),
                       bad: ("error", "INVALID_RECORD", None, None), nxt: ("acked", None, 3, 3)}
    for replica in range(3):
        assert [r["value"] for r in cluster.read("orders", partition=0, replica=replica).orderBy("offset").collect()] \
            == [b"a0", b"a1", b"y", b"a2"]
    stored = sorted(tuple(r) for r in cluster.storage.read("producers")
                    .select("producer_id", "base_sequence", "last_sequence", "base_offset", "last_offset").collect())
    assert stored == [(7, 0, 1, 0, 1), (7, 2, 2, 3, 3)]


def test_a_reassignment_runs_in_v2_the_new_replica_catches_up_joins_and_the_old_one_goes(spark, new_cluster, clock):
    cluster = v2_cluster(new_cluster, clock)
    cluster.produce("orders", [{"value": f"a{i}", "partition": 1} for i in range(4)], acks="all")
    cluster.run_round()
    new = cluster.add_broker()
    old = list(cluster.describe("orders").filter("partition = 1").first()["replicas"])
    gone = next(b for b in old if b != cluster.describe("orders").filter("partition = 1").first()["leader"])
    target = [new if b == gone else b for b in old]
    cluster.reassign_partitions({("orders", 1): target})
    acked = []
    for i in range(4):
        acked.append(cluster.produce("orders", [{"value": f"b{i}", "partition": 1}], acks="all"))
        clock.advance(100)
        cluster.run_round()
        assert ran_v2(cluster)
    p = cluster.describe("orders").filter("partition = 1").first()
    assert (p["replicas"], sorted(p["isr"]), p["adding_replicas"], p["removing_replicas"]) == \
        (target, sorted(target), [], [])
    assert cluster.reassignments().count() == 0
    assert {r["status"] for r in cluster.produce_results().filter(F.col("request_id").isin(acked)).collect()} == \
        {"acked"}
    logs = {b: [(r["offset"], r["value"]) for r in cluster.read("orders", partition=1, replica=b,
                                                                  isolation="read_uncommitted").orderBy("offset").collect()]
            for b in target}
    assert len(logs[new]) == 8 and all(log == logs[new] for log in logs.values())
    assert cluster.storage.read_log(gone).filter("partition = 1").count() == 0  # its log and its row went
    assert cluster.replicas("orders").filter(f"partition = 1 AND broker = {gone}").count() == 0
    assert sorted(r["broker"] for r in cluster.replicas("orders").filter("partition = 1").collect()) == sorted(target)
    # each leader's fetch sessions hold the partitions their followers fetch: the dropped one left
    # its session (KIP-227: an incremental request forgets it; a session left empty stays until
    # evicted), the new one joined one
    followed = {}
    for r in cluster.storage.replica_state().collect():
        if r["session_id"]:
            followed[r["session_id"]] = followed.get(r["session_id"], 0) + 1
    sizes = {r["session_id"]: r["partitions"] for r in cluster.fetch_sessions().collect()}
    assert sizes == {sid: followed.get(sid, 0) for sid in sizes} and set(followed) <= set(sizes)


def test_replication_throttles_run_in_v2_an_out_of_sync_follower_catches_up_at_the_rate_while_the_isr_keeps_up(
        new_cluster, clock):
    size = 100 + RECORD_OVERHEAD_BYTES  # a 100-byte value, no key
    rate = 20 * size  # follower.replication.throttled.rate: 20 records a second
    cluster = v2_cluster(new_cluster, clock, **{"replica.lag.time.max.ms": 1000})
    cluster.pause_fetcher(2)
    for _ in range(3):  # 150 records follower 2 does not take; it leaves the ISR after the lag
        cluster.produce("orders", [{"value": "v" * 100, "partition": 0} for _ in range(50)], acks="all")
        clock.advance(1000)
        cluster.run_round()
    assert cluster.describe("orders").filter("partition = 0").first()["isr"] == [0, 1]
    cluster.alter_configs("brokers", set={"follower.replication.throttled.rate": rate})
    cluster.alter_configs("topics", "orders", set={"follower.replication.throttled.replicas": "*"})
    cluster.resume_fetcher(2)
    moved = []
    for _ in range(3):
        acked = cluster.produce("orders", [{"value": "w" * 100, "partition": 0} for _ in range(5)], acks="all")
        clock.advance(1000)
        report = cluster.run_round()
        assert ran_v2(cluster) and report.throttled_bytes == {("follower", 2): rate}
        moved.append(cluster.read("orders", partition=0, replica=2, isolation="read_uncommitted").count())
        leo = {r["broker"]: r["log_end_offset"] for r in cluster.replicas("orders").filter("partition = 0").collect()}
        assert leo[1] == leo[0]  # the follower in the ISR is not held back
        assert cluster.produce_results().filter(F.col("request_id") == acked).first()["status"] == "acked"
    assert moved == [20, 40, 60]  # the rate's worth a second, by the cluster clock
    cluster.alter_configs("brokers", delete=["follower.replication.throttled.rate"])
    clock.advance(1000)
    report = cluster.run_round()
    assert ran_v2(cluster) and report.throttled_bytes == {}
    partition = cluster.describe("orders").filter("partition = 0").first()
    assert partition["isr"] == [0, 1, 2] and partition["high_watermark"] == 165


def test_client_quotas_run_in_v2_a_request_over_the_quota_waits_and_is_served_with_its_throttle_time(
        new_cluster, clock):
    cluster = v2_cluster(new_cluster, clock, **{"quota.window.num": 2})
    cluster.alter_client_quotas({"client-id": "app"}, set={"producer_byte_rate": 1000})
    value = "x" * (1000 - RECORD_OVERHEAD_BYTES)  # 1000 bytes a record: the quota lets two through at once
    sent = [cluster.produce("orders", [{"value": value, "partition": 0}], acks=1, client_id="app") for _ in range(3)]
    report = cluster.run_round()
    assert ran_v2(cluster) and report.throttled_requests == 1
    statuses = lambda: [(r["status"], r["base_offset"], r["throttle_time_ms"]) for r in sorted(  # noqa: E731
        cluster.produce_results().filter(F.col("request_id").isin(*sent)).collect(),
        key=lambda r: sent.index(r["request_id"]))]
    assert statuses() == [("acked", 0, 0), ("acked", 1, 0), ("throttled", None, None)]
    waited = []
    while report.throttled_requests:
        clock.advance(500)
        report = cluster.run_round()
        assert ran_v2(cluster)
        waited.append(clock.now_ms())
    status, offset, throttle = statuses()[2]
    assert (status, offset) == ("acked", 2) and throttle == waited[-1] - waited[0] + 500
def test_retention_and_delete_records_run_in_v2_and_followers_take_the_leaders_log_start(new_cluster, clock):
    cluster = v2_cluster(new_cluster, clock, topic_config={"retention.ms": 1000},
                         **{"log.retention.check.interval.ms": 1000})
    assert ran_v2(cluster)  # (a process's first round checks retention: v2 runs it)
    cluster.produce("orders", [{"value": f"v{i}", "partition": 0} for i in range(3)], acks="all")
    for _ in range(2):
        clock.advance(100)
        cluster.run_round()

    def log_starts():
        return sorted((r["partition"], r["broker"], r["log_start_offset"])
                      for r in cluster.storage.replica_state().collect())

    assert log_starts() == [(p, b, 0) for p in range(2) for b in range(3)]
    clock.advance(1000)  # records 0-2 older than retention.ms, and the check due
    cluster.produce("orders", [{"value": "new", "partition": 0}], acks="all")
    clock.advance(100)
    cluster.run_round()
    assert ran_v2(cluster)
    assert log_starts() == [(0, b, 3) for b in range(3)] + [(1, b, 0) for b in range(3)]
    assert [r["offset"] for r in cluster.read("orders", partition=0).collect()] == [3]
    for broker in range(3):  # the records below are gone from every replica's log
        assert [r["offset"] for r in cluster.storage.read_log(broker).filter("partition = 0").collect()] == [3]
    assert cluster.delete_records("orders", 0, 4) == 4
    clock.advance(100)
    report = cluster.run_round()
    assert ran_v2(cluster) and report.admin_version == cluster.storage.version("admin")
    assert log_starts() == [(0, b, 4) for b in range(3)] + [(1, b, 0) for b in range(3)]


def test_a_v2_round_compacts_replica_state_to_its_current_rows_and_keeps_its_carry(spark, new_cluster, clock,
                                                                                  monkeypatch):
    monkeypatch.setattr(round_run, "STATE_COMPACTION_MIN_ROWS", 0)
    monkeypatch.setattr(round_run, "STATE_COMPACTION_RATIO", 1)
    cluster = v2_cluster(new_cluster, clock)
    storage = cluster.storage
    assert storage.read("replica_state").count() == 6  # (the round compacted it too)
    # each round moves partition 0's replicas: their 3 rows are appended, until the superseded rows
    # are as many as the current ones (6) and the round compacts the table to those
    sizes = []
    for i in range(3):
        cluster.produce("orders", [{"value": f"v{i}", "partition": 0}], acks="all")
        clock.advance(100)
        cluster.run_round()
        assert ran_v2(cluster)
        sizes.append(storage.read("replica_state").count())
    assert sizes == [9, 6, 9]
    # the carry went on: the table's versions are the ones the carry holds, and the rows are right
    assert cluster.core.carry.versions == table_versions(storage)
    assert sorted((r["partition"], r["broker"], r["log_end_offset"], r["high_watermark"])
                  for r in cluster.replicas("orders").collect()) == \
        [(p, b, 3 - 3 * p, 3 - 3 * p) for p in range(2) for b in range(3)]
    assert storage.replica_state().select("topic", "partition", "broker").distinct().count() == 6


def test_replica_state_is_compacted_once_the_superseded_rows_are_three_times_the_current_ones(
        spark, new_cluster, clock, monkeypatch):
    monkeypatch.setattr(round_run, "STATE_COMPACTION_MIN_ROWS", 0)
    assert round_run.STATE_COMPACTION_RATIO == 3
    cluster = v2_cluster(new_cluster, clock)
    storage = cluster.storage
    # 6 current rows; the first round rewrote each once: 6 superseded, fewer than 3 x 6
    sizes = [storage.read("replica_state").count()]
    # each round moves every replica of both partitions: 6 rows appended, until 18 are superseded
    for i in range(3):
        cluster.produce("orders", [{"value": f"v{i}", "partition": p} for p in range(2)], acks="all")
        clock.advance(100)
        cluster.run_round()
        assert ran_v2(cluster)
        sizes.append(storage.read("replica_state").count())
    assert sizes == [12, 18, 6, 12]
    assert cluster.core.carry.versions == table_versions(storage)
    assert sorted((r["partition"], r["broker"], r["log_end_offset"]) for r in cluster.replicas("orders").collect()) \
        == [(p, b, 3) for p in range(2) for b in range(3)]


def test_a_bulk_round_runs_compiled_and_a_round_of_a_few_records_interpreted(spark, new_cluster, clock, monkeypatch):
    monkeypatch.setattr(round_run, "BULK_ROWS", 5)
    cluster = v2_cluster(new_cluster, clock)
    storage = cluster.storage
    start = storage.version("inbox")
    cluster.produce("orders", [{"value": f"a{i}", "partition": i % 2} for i in range(3)], acks=1)
    cluster.produce("orders", [{"value": f"b{i}", "partition": 0} for i in range(2)], acks=1)
    assert added_rows(storage.added_file_stats("inbox", start, storage.version("inbox"))) == 5
    assert added_rows(storage.added_file_stats("inbox", start + 1, storage.version("inbox"))) == 2
    keys = ("spark.sql.codegen.wholeStage", "spark.sql.codegen.factoryMode")
    session, seen, run_active = tuple(spark.conf.get(k) for k in keys), [], round_run.run_active_round
    monkeypatch.setattr(round_run, "run_active_round",
                        lambda *a, **k: seen.append(tuple(spark.conf.get(key) for key in keys)) or run_active(*a, **k))
    clock.advance(100)
    report = cluster.run_round()  # 5 new inbox rows: bulk
    assert report.records_appended == 5 and report.records_replicated == 10
    for value in ("c", "d"):
        cluster.produce("orders", [{"value": value, "partition": 1}], acks=1)
        clock.advance(100)
        # one new record: after the round that replicated 10 (bulk too), then after one that replicated 2
        assert cluster.run_round().records_replicated == 2
    assert seen == [("true", "FALLBACK"), ("true", "FALLBACK"), session]
    assert tuple(spark.conf.get(k) for k in keys) == session == ("false", "NO_CODEGEN")
    assert sorted(r["value"] for r in cluster.read("orders").collect()) == \
        [b"a0", b"a1", b"a2", b"b0", b"b1", b"c", b"d"]


def test_the_idempotence_probe_reads_the_inbox_commits_statistics(spark, new_cluster, clock):
    cluster = v2_cluster(new_cluster, clock)
    storage = cluster.storage
    start = storage.version("inbox")
    cluster.produce("orders", [{"value": "a", "partition": 0}, {"value": "b", "partition": 1}], acks=1)
    plain = storage.version("inbox")
    cluster.produce("orders", [{"value": "c", "partition": 0, "producer_id": 7, "producer_epoch": 0, "sequence": 0}],
                    acks=1)
    assert all_null(storage.added_file_stats("inbox", start, plain), "producer_id") is True
    assert all_null(storage.added_file_stats("inbox", start, storage.version("inbox")), "producer_id") is False
    assert all_null(storage.added_file_stats("inbox", plain, storage.version("inbox")), "producer_id") is False
    # a commit whose log file is gone (cleaned up after a checkpoint) tells nothing
    (Path(storage.path("inbox")) / "_delta_log" / f"{plain:020d}.json").unlink()
    assert all_null(storage.added_file_stats("inbox", start, plain), "producer_id") is None


def test_a_leader_crash_elects_in_v2_and_the_old_leader_truncates_its_diverging_suffix_when_it_returns(
        new_cluster, clock):
    """The controller's wave (controller_wave.py) in v2 rounds: the election when the crashed
    leader is fenced, the pending acks=all request on it failed, and the returning broker's check of
    its log against the new leader epoch, which drops the record only it held."""
    cluster = v2_cluster(new_cluster, clock)
    cluster.produce("orders", [{"value": "m0", "partition": 0}], acks="all")
    cluster.run_round()
    leader = cluster.describe("orders").filter(F.col("partition") == 0).first()["leader"]
    followers = [b for b in range(3) if b != leader]
    for b in followers:
        cluster.pause_fetcher(b)
    lost = cluster.produce("orders", [{"value": "lost", "partition": 0}], acks="all")  # on the leader only
    clock.advance(100)
    cluster.run_round()
    assert ran_v2(cluster)
    cluster.stop_broker(leader)
    for b in followers:
        cluster.resume_fetcher(b)
    clock.advance(9500)  # past broker.session.timeout.ms: fenced, and its partitions elect
    cluster.run_round()
    assert ran_v2(cluster)
    p = cluster.describe("orders").filter(F.col("partition") == 0).first()
    assert (p["leader"] in followers, p["leader_epoch"], sorted(p["isr"])) == (True, 1, followers)
    assert [(r["election"], r["previous_leader"], r["leader_epoch"], r["start_offset"]) for r in
            cluster.elections().filter(F.col("partition") == 0).collect()] == [("clean", leader, 1, 1)]
    assert {r["request_id"]: (r["status"], r["error_code"]) for r in cluster.produce_results().collect()
            if r["request_id"] == lost} == {lost: ("error", "NOT_LEADER_OR_FOLLOWER")}
    kept = cluster.produce("orders", [{"value": "m1", "partition": 0}], acks="all")
    clock.advance(100)
    cluster.run_round()
    assert ran_v2(cluster)
    cluster.start_broker(leader)
    for _ in range(3):
        clock.advance(100)
        cluster.run_round()
        assert ran_v2(cluster)
    for replica in range(3):
        assert [(r["offset"], r["leader_epoch"], r["value"]) for r in cluster.read(
            "orders", partition=0, replica=replica, isolation="read_uncommitted").orderBy("offset").collect()] == \
            [(0, 0, b"m0"), (1, 1, b"m1")]
    assert sorted(cluster.describe("orders").filter(F.col("partition") == 0).first()["isr"]) == [0, 1, 2]
    assert {r["request_id"]: r["status"] for r in cluster.produce_results().collect()
            if r["request_id"] == kept} == {kept: "acked"}
    assert cluster.storage.replica_state().filter(F.col("validated_leader_epoch") < 1).filter(
        (F.col("partition") == 0) & (F.col("broker") != p["leader"])).count() == 0
