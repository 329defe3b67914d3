"""A cluster's round (pipeline/round/run.py) end to end: it appends, replicates, answers and
idles; the produce checks, idempotent producers, reassignments, throttles, quotas, retention,
replica_state's compaction, bulk rounds and an election, each running in the round."""

from pathlib import Path

from pyspark.sql import functions as F

from pipeline.control.replication import RECORD_OVERHEAD_BYTES
from pipeline.round import Carry, table_versions
from pipeline.round import run as round_run
from pipeline.storage import added_rows, all_null



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
