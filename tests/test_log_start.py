"""Log start offset: the retention rule, delete_records and retention through rounds."""

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock, ReplogError
from pipeline.control.log_start import retention_log_start_offsets
from pipeline.control.replication import RECORD_OVERHEAD_BYTES

LOG = ("topic string, partition int, offset long, timestamp long, key binary, value binary, log_end_offset long, "
       "retention_ms long, retention_bytes long")


def test_retention_log_start_offsets(spark):
    rows = []
    for partition, retention_ms, retention_bytes, stamps in [
        (0, 250, -1, [100, 200, 300, 400, 500]),   # time: offsets 0-2 older than 600-250=350
        (1, -1, 2 * (RECORD_OVERHEAD_BYTES + 10) + 5, [0] * 5),   # size: the newest two fit
        (2, 250, -1, [0, 0, 0, 0, 0]),             # every record too old: all go
        (3, 250, -1, [500] * 5),                   # none too old: no change
    ]:
        rows += [("t", partition, o, ts, None, b"0123456789", 5, retention_ms, retention_bytes)
                 for o, ts in enumerate(stamps)]
    result = retention_log_start_offsets(spark.createDataFrame(rows, LOG), now_ms=600)
    expected = spark.createDataFrame([("t", 0, 3), ("t", 1, 3), ("t", 2, 5), ("t", 3, None)],
                                     "topic string, partition int, retention_start_offset long")
    assert_df_equality(result, expected, ignore_row_order=True, ignore_nullable=True)


def offsets_per_broker(cluster, topic):
    return {b: sorted(r["offset"] for r in cluster.storage.read_log(b).filter(F.col("topic") == topic).collect())
            for b in cluster.brokers}


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    clock = ManualClock(start_ms=0)
    cluster = Cluster.create(spark, str(tmp_path_factory.mktemp("lso") / "c"), brokers=3, clock=clock,
                             config={"log.retention.check.interval.ms": "1000"})
    cluster.create_topic("del", partitions=1, replication_factor=3)
    cluster.create_topic("timed", partitions=1, replication_factor=3, config={"retention.ms": "1000"})
    cluster.create_topic("sized", partitions=1, replication_factor=2,
                         config={"retention.bytes": str(2 * (RECORD_OVERHEAD_BYTES + 1))})
    for topic in ("del", "timed", "sized"):
        cluster.produce(topic, [{"value": v} for v in "abc"], acks="all")
    out = {"cluster": cluster, "clock": clock}
    for t in (500, 1000):                  # t=500 appended (first retention check), t=1000 HW 3
        clock.advance(500)
        cluster.run_round()
    out["errors"] = []
    before = cluster.storage.version("admin")
    for bad in (4, -2, "1"):
        with pytest.raises(ReplogError) as err:
            cluster.delete_records("del", 0, bad)
        out["errors"].append(err.value.code)
    out["admin_unchanged"] = cluster.storage.version("admin") == before
    out["returned"] = cluster.delete_records("del", 0, 2)
    for topic in ("timed", "sized"):
        cluster.produce(topic, [{"value": v} for v in "de"], acks="all")
    clock.advance(500)
    out["r1500"] = cluster.run_round()     # retention due: timed and sized move; del applies the request
    out["lso_1500"] = {r["topic"]: r["log_start_offset"] for r in cluster.describe().collect()}
    out["replica_lso"] = {(r["topic"], r["broker"]): r["log_start_offset"]
                          for r in cluster.storage.replica_state().collect()}
    clock.advance(500)
    cluster.run_round()
    out["logs"] = {t: offsets_per_broker(cluster, t) for t in ("del", "timed", "sized")}
    return out


def test_delete_records_refuses_offsets_above_the_hw_and_writes_nothing(run):
    assert run["errors"] == ["OFFSET_OUT_OF_RANGE"] * 3
    assert run["admin_unchanged"]
    assert run["returned"] == 2


def test_log_start_offsets_after_the_round(run):
    # del: asked for 2; timed: records at t=0 are older than 1500-1000, bounded by the HW 3;
    # sized: retention runs before this round's append, on 3 records of 22 bytes: 44 bytes kept
    assert run["lso_1500"] == {"del": 2, "timed": 3, "sized": 1}
    for (topic, broker), lso in run["replica_lso"].items():
        assert lso == run["lso_1500"][topic], (topic, broker)  # followers learned it from the response


def test_records_below_the_log_start_are_gone_from_every_replica(run):
    assert run["logs"]["del"] == {0: [2], 1: [2], 2: [2]}
    assert run["logs"]["timed"] == {0: [3, 4], 1: [3, 4], 2: [3, 4]}
    sized = run["logs"]["sized"]
    assert sorted(sized.values()) == [[], [1, 2, 3, 4], [1, 2, 3, 4]]  # RF 2: one broker holds none


def test_reads_below_the_log_start_offset(run):
    cluster = run["cluster"]
    with pytest.raises(ReplogError, match="OFFSET_OUT_OF_RANGE"):
        cluster.read("del", partition=0, from_offset=1)
    assert [r["offset"] for r in cluster.read("del", from_offset=2).collect()] == [2]
    assert [r["offset"] for r in cluster.read("timed").orderBy("offset").collect()] == [3, 4]
    desc = cluster.describe("timed").first()
    assert (desc["log_start_offset"], desc["high_watermark"], desc["log_end_offset"]) == (3, 5, 5)


def test_retention_reads_no_log_while_no_record_is_older_than_the_latest_cutoff(spark, new_cluster, clock):
    """A due retention check with only time limits first asks the logs' file statistics for a
    record older than now - retention.ms (the latest cutoff of the topics' limits): with none, it
    asks the leaders nothing, and once one is that old it reads the leaders' logs as before."""
    from pipeline.round.inputs import RoundInputs
    from pipeline.round.reads import partition_meta
    from pipeline.round.run import _retention_leaders, _topic_config

    cluster = new_cluster()
    cluster.create_topic("timed", partitions=1, replication_factor=3, config={"retention.ms": "1000"})
    cluster.create_topic("weekly", partitions=1, replication_factor=3)  # Kafka's default: 7 days
    cluster.produce("timed", [{"value": "a", "partition": 0}], acks="all")  # stamped t=0
    clock.advance(500)
    cluster.run_round()
    topics = _topic_config(partition_meta(cluster.storage, cluster.config))
    checks = topics.select("topic", "retention_ms", "retention_bytes").distinct()
    state = topics.select("topic", "partition", "leader", "replicas", F.array(F.lit(0), F.lit(0), F.lit(0)).alias(
        "log_start_offset"), F.array(F.lit(1), F.lit(1), F.lit(1)).alias("log_end_offset"))

    def leaders(now_ms):
        inputs = RoundInputs(round_id=9, now_ms=now_ms, last_inbox_version=0, cluster_config=cluster.config,
                             brokers=cluster.brokers, paused_brokers={}, throttles={}, previous_round_ms=None)
        return _retention_leaders(cluster.storage, inputs, state, checks, set())

    assert leaders(1000) is None  # the record (t=0) is not older than 1000 - 1000
    asked = leaders(1001)
    assert asked is not None
    assert sorted((r["topic"], r["retention_ms"]) for r in asked.collect()) == [("timed", 1000),
                                                                              ("weekly", 604_800_000)]
    # a size limit cannot be judged from timestamps: the leaders are asked
    sized = checks.withColumn("retention_bytes", F.lit(10).cast("long"))
    inputs = RoundInputs(round_id=9, now_ms=500, last_inbox_version=0, cluster_config=cluster.config,
                         brokers=cluster.brokers, paused_brokers={}, throttles={}, previous_round_ms=None)
    assert _retention_leaders(cluster.storage, inputs, state, sized, set()) is not None
