"""Client quotas end to end (Kafka's design 4.9): a producer over its producer_byte_rate gets a
throttle time and its records are committed later, in order, none dropped, across a restart of
the process; a consumer over its consumer_byte_rate is served nothing while it waits; and the
quota changes a user can get wrong write nothing."""

import pytest
from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock
from pipeline.errors import ReplogError
from pipeline.control.replication import RECORD_OVERHEAD_BYTES

KB = 1000 - RECORD_OVERHEAD_BYTES  # a value whose record counts exactly 1000 bytes


def _results(cluster, ids):
    rows = {r["request_id"]: r for r in cluster.produce_results().collect()}
    return [(rows[i]["status"], rows[i]["base_offset"], rows[i]["throttle_time_ms"]) for i in ids]


def test_a_producer_over_its_quota_gets_a_throttle_time_and_all_its_records_committed_later_in_order(spark, tmp_path):
    clock = ManualClock(start_ms=0)
    root = str(tmp_path / "c")
    # 2 samples of 1 s: a fresh client's window is 1 s, so 1000 B/s lets 2000 bytes through at once
    cluster = Cluster.create(spark, root, brokers=3, clock=clock, config={"quota.window.num": 2})
    cluster.create_topic("t", partitions=2, replication_factor=3)
    assert cluster.alter_configs("clients", "loader", set={"producer_byte_rate": 1000}) == {"producer_byte_rate": 1000}
    loader = [cluster.produce("t", [{"value": "x" * KB, "partition": 0}], acks="all", client_id="loader")
              for _ in range(6)]
    free = cluster.produce("t", [{"value": "y" * 10 * KB, "partition": 1}], client_id="other")

    report = cluster.run_round()  # t=0: requests 1 and 2 (the rate was at the quota before 2), then throttled
    assert report.throttled_requests == 4
    assert _results(cluster, loader)[2:] == [("throttled", None, None)] * 4
    assert _results(cluster, [free]) == [("acked", 0, 0)]  # another client is not held back
    clock.advance(500)
    cluster.run_round()  # t=500: the 1000 ms throttle (2000 B/s over 1 s at 1000 B/s) still runs
    assert cluster.run_round().throttled_requests == 4

    # another process takes over (its quota measurements start empty, as a restarted Kafka broker's):
    # the waiting requests come back from the tables
    clock.advance(500)
    cluster = Cluster.open(spark, root, clock=clock)
    waiting = []
    for _ in range(7):
        waiting.append(cluster.run_round().throttled_requests)
        clock.advance(500)
    # t=1000: requests 3-4 (2000 bytes in a fresh 1 s window), throttled 1000 ms; t=2000: the window
    # still holds those 2000 bytes, so request 5 alone (3000 B/s: 2000 ms); t=4000: request 6
    assert waiting == [2, 2, 1, 1, 1, 1, 0]
    cluster.run_round()  # acks=all: the HW passes request 6 a round after its append
    assert _results(cluster, loader) == [("acked", 0, 0), ("acked", 1, 0), ("acked", 2, 1000), ("acked", 3, 1000),
                                         ("acked", 4, 2000), ("acked", 5, 4000)]
    offsets = cluster.read("t", partition=0).orderBy("offset").select("offset", F.length("value").alias("n")).collect()
    assert [(r["offset"], r["n"]) for r in offsets] == [(i, KB) for i in range(6)]  # once each, in order


def test_a_consumer_over_its_quota_is_served_nothing_until_its_throttle_has_passed(spark, tmp_path):
    clock = ManualClock(start_ms=0)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=1, clock=clock, config={"quota.window.num": 2})
    cluster.create_topic("t", partitions=1, replication_factor=1)
    cluster.alter_client_quotas({"user": None}, {"consumer_byte_rate": 1000})  # every user's default
    cluster.produce("t", [{"value": "x" * KB}] * 3)
    cluster.run_round()

    first = cluster.read_incremental("c1", "t", user="alice")
    # 3000 bytes over a 1 s window: 3000 B/s, throttled (3000-1000)/1000 x 1000 ms
    assert first.count() == 3 and cluster.fetch_throttle_time_ms("c1") == 2000
    cluster.produce("t", [{"value": "y"}])
    cluster.run_round()
    clock.advance(1500)
    assert cluster.read_incremental("c1", "t", user="alice").count() == 0  # waits 500 ms more, nothing moved
    assert cluster.fetch_throttle_time_ms("c1") == 500
    assert cluster.read_incremental("c2", "t", user="bob").count() == 4  # bob's default quota is his own
    clock.advance(500)
    after = cluster.read_incremental("c1", "t", user="alice").collect()
    assert [r["offset"] for r in after] == [3] and cluster.fetch_throttle_time_ms("c1") == 0


def test_client_quota_changes_a_user_can_get_wrong_write_nothing(spark, tmp_path):
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=1, clock=ManualClock(start_ms=0))
    cluster.create_topic("t", partitions=1, replication_factor=1)
    cluster.alter_client_quotas({"user": "alice", "client-id": None}, {"producer_byte_rate": 5000})
    versions = (cluster.storage.version("client_quotas"), cluster.storage.version("inbox"))
    for call, words in [
        (lambda: cluster.alter_client_quotas({"user": "alice"}, {"producer_byte_rate": 0}), "> 0"),
        (lambda: cluster.alter_client_quotas({"team": "a"}, {"producer_byte_rate": 10}), "entity"),
        (lambda: cluster.alter_configs("clients", "app", set={"request_percentage": 10}), "unknown"),
        (lambda: cluster.alter_configs("users", "", set={"producer_byte_rate": 10}), "user"),
        (lambda: cluster.produce("t", [{"value": "v"}], client_id=""), "client_id"),
        (lambda: cluster.produce("t", [{"value": "v"}], user=7), "user"),
        (lambda: cluster.read_incremental("c", "t", client_id=3), "client_id"),
    ]:
        with pytest.raises(ReplogError) as e:
            call()
        assert e.value.code == "INVALID_REQUEST" and words in str(e.value)
    assert (cluster.storage.version("client_quotas"), cluster.storage.version("inbox")) == versions
    assert cluster.describe_client_quotas() == [
        {"entity": {"user": "alice", "client-id": None}, "quotas": {"producer_byte_rate": 5000}}]
    assert cluster.describe_configs("users", "alice") == {}  # (alice) is another entity than (alice, default)
    cluster.alter_client_quotas({"user": "alice", "client-id": None}, delete=["producer_byte_rate"])
    assert cluster.describe_client_quotas() == []
    cluster.run_round()  # still usable
    assert cluster.spark.sql("SELECT count(*) FROM replog.client_quotas").first()[0] == 0


def test_a_quota_another_process_sets_holds_back_a_job_that_started_without_quotas(spark, tmp_path):
    """A job that started on a root with no quota set (its client_quotas table never written: read
    as empty with no Spark job) throttles from its next round once another process sets one."""
    clock = ManualClock(start_ms=0)
    root = str(tmp_path / "c")
    job = Cluster.create(spark, root, brokers=1, clock=clock, config={"quota.window.num": 2})
    job.create_topic("t", partitions=1, replication_factor=1)
    assert job.storage.unwritten("client_quotas")
    assert job.run_round().throttled_requests == 0
    Cluster.open(spark, root, clock=clock).alter_configs("clients", "loader", set={"producer_byte_rate": 1000})
    assert not job.storage.unwritten("client_quotas")
    loader = [job.produce("t", [{"value": "x" * KB}], acks=1, client_id="loader") for _ in range(6)]
    assert job.run_round().throttled_requests == 4
    assert [s for s, _, _ in _results(job, loader)] == ["acked"] * 2 + ["throttled"] * 4


def test_a_round_with_no_new_produce_request_and_none_waiting_runs_no_quota_job(spark):
    """The round's quota step costs nothing when no request is new and none waits, even with a
    quota configured (its sensors are not asked, no Spark job runs); with the new rows unknown it
    reads the inbox to find out."""
    from pipeline.round.client_quotas import QuotaStep, apply_client_quotas
    from pipeline.round.inputs import RoundInputs
    from pipeline.schemas import INBOX_SCHEMA

    asked = []
    inputs = RoundInputs(round_id=1, now_ms=0, last_inbox_version=0, cluster_config={}, brokers=[0],
                         paused_brokers={}, throttles={}, previous_round_ms=None,
                         quota_sensors=lambda pairs: asked.append(pairs) or [])
    inbox = spark.createDataFrame([], INBOX_SCHEMA).withColumn("_commit_version", F.lit(0).cast("long"))
    tracker, sc = spark.sparkContext.statusTracker(), spark.sparkContext
    try:
        sc.setJobGroup("quota-no-request", "a round with no new request")
        served, step = apply_client_quotas(spark, inbox, None, inputs, new_rows=0)
        assert (served is inbox, step, asked) == (True, QuotaStep(), [])
        assert list(tracker.getJobIdsForGroup("quota-no-request")) == []
        sc.setJobGroup("quota-rows-unknown", "a round whose new rows are not known")
        served, step = apply_client_quotas(spark, inbox, None, inputs, new_rows=None)
        assert (step, asked) == (QuotaStep(), [[]])
        assert list(tracker.getJobIdsForGroup("quota-rows-unknown")) != []
    finally:
        sc.setJobGroup(None, None)
