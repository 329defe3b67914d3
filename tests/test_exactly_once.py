"""Exactly-once output (Kafka's design 4.6): a consumer's output rows and its positions in one
Delta commit; crashes before and after a commit, and a stale replay of a batch, neither lose nor
double a record."""

import pytest

from pipeline import Cluster, ManualClock
from pipeline.errors import ReplogError
from pipeline.consume.exactly_once import ExactlyOnceOutput


@pytest.fixture(scope="module")
def cluster(spark, tmp_path_factory):
    clock = ManualClock(start_ms=0)
    cluster = Cluster.create(spark, str(tmp_path_factory.mktemp("eo") / "c"), brokers=1, clock=clock)
    cluster.create_topic("t", partitions=2, replication_factor=1)
    cluster.produce("t", [{"value": f"a{i}", "partition": 0} for i in range(5)]
                    + [{"value": f"b{i}", "partition": 1} for i in range(3)], acks=1)
    clock.advance(500)
    cluster.run_round()
    return cluster


def output_keys(spark, path):
    return sorted((r["partition"], r["offset"]) for r in spark.read.format("delta").load(path).collect())


def to_rows(records):
    return records.select("partition", "offset", "value")


class Crash(RuntimeError):
    pass


def test_no_record_lost_or_doubled_across_crashes(spark, cluster, tmp_path):
    out = str(tmp_path / "out")
    first = ExactlyOnceOutput(cluster, "c1", "t", out)

    def crash_before_commit(records):
        records.count()
        raise Crash("killed while computing the batch")

    with pytest.raises(Crash):
        first.run_batch(crash_before_commit)
    assert first.positions() == {}  # nothing landed: the batch is read again whole

    batch = ExactlyOnceOutput(cluster, "c1", "t", out).run_batch(to_rows)
    assert (batch.number, batch.records, batch.positions) == (1, 8, {0: 5, 1: 3})

    # killed right after the commit: a new process resumes from the positions in that commit
    restarted = ExactlyOnceOutput(cluster, "c1", "t", out)
    assert restarted.positions() == {0: 5, 1: 3}
    assert restarted.run_batch(to_rows) is None  # nothing new committed: nothing written

    cluster.produce("t", [{"value": f"a{i}", "partition": 0} for i in range(5, 7)], acks=1)
    cluster.clock.advance(500)
    cluster.run_round()

    # a stale process that never saw batch 1 writes "batch 1" again: Delta's txnAppId/txnVersion
    # makes that write a no-op
    stale = ExactlyOnceOutput(cluster, "c1", "t", out)
    stale.last_batch = lambda: None
    stale.run_batch(to_rows)
    assert len(output_keys(spark, out)) == 8

    batch = restarted.run_batch(to_rows)
    assert (batch.number, batch.records, batch.positions) == (2, 2, {0: 7, 1: 3})
    expected = sorted((r["partition"], r["offset"]) for r in cluster.read("t").collect())
    assert output_keys(spark, out) == expected and len(expected) == 10

    # another consumer of the same output table keeps its own positions
    other = ExactlyOnceOutput(cluster, "c2", "t", str(tmp_path / "out2"))
    assert other.run_batch(to_rows).positions == {0: 7, 1: 3}


def test_errors(cluster, tmp_path):
    with pytest.raises(ReplogError) as err:
        ExactlyOnceOutput(cluster, " ", "t", str(tmp_path / "o"))
    assert err.value.code == "INVALID_GROUP_ID"
    with pytest.raises(ReplogError) as err:
        ExactlyOnceOutput(cluster, "c", "missing", str(tmp_path / "o"))
    assert err.value.code == "UNKNOWN_TOPIC_OR_PARTITION"
