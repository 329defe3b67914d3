"""Log compaction end to end on real Delta tables (Kafka's design 4.8): a compacted topic keeps at
least the last value of every key at its offset on every replica, tombstones last
delete.retention.ms after the clean that first passed them, a follower that refetches its log gets
the compacted one, retention does not apply to a compact-only topic, and the cleaner's gauges are in
replog.metrics."""

import shutil

from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock
from tests.helpers import advance_round, replica_log

EPOCH_MS = 1_700_000_000_000


def _records(df):
    return [(r["offset"], r["key"].decode(), r["value"].decode() if r["value"] is not None else None)
            for r in df.orderBy("offset").collect()]


def _state(cluster, topic, broker):
    return cluster.storage.replica_state().filter((F.col("topic") == topic) & (F.col("broker") == broker)).first()


def _metrics(cluster):
    return {r["name"]: r["value"] for r in cluster.metrics().collect()}


def _final_values(records):
    """The last value of each key, in the order the last values were written (None: deleted)."""
    last = {}
    for offset, key, value in records:
        last.pop(key, None)
        last[key] = (offset, value)
    return last


def test_compaction_keeps_the_last_value_of_every_key_on_every_replica(spark, tmp_path):
    clock = ManualClock(start_ms=EPOCH_MS)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=3, clock=clock,
                             config={"replica.lag.time.max.ms": 600000, "log.retention.check.interval.ms": 1000})
    cluster.create_topic("kv", partitions=1, replication_factor=3,
                         config={"cleanup.policy": "compact", "delete.retention.ms": 60000,
                                 "max.compaction.lag.ms": 30000, "retention.ms": 1000})
    cluster.create_topic("plain", partitions=1, replication_factor=1, config={"retention.ms": 1000})
    writes = ([(f"k{i}", "v1") for i in range(5)] + [(f"k{i}", "v2") for i in range(3)]
              + [("k3", None), ("k4", "v2")])
    first = cluster.produce("kv", [{"key": k, "value": v, "partition": 0} for k, v in writes], acks="all")
    keyless = cluster.produce("kv", [{"value": "no key", "partition": 0}], acks=1)
    cluster.produce("plain", [{"value": "old", "partition": 0}], acks=1)
    advance_round(cluster, clock), advance_round(cluster, clock)
    results = {r["request_id"]: r for r in cluster.produce_results().collect()}
    assert results[first]["status"] == "acked"
    # Kafka's LogValidator: a compacted topic refuses a record without a key
    assert (results[keyless]["status"], results[keyless]["error_code"]) == ("error", "INVALID_RECORD")
    written = [(o, k, v) for o, (k, v) in enumerate(writes)]
    assert [replica_log(cluster, "kv", b, ("offset", "key", "value")) for b in range(3)] == [written] * 3
    # a consumer that keeps up with the head (Kafka's first guarantee) reads every record
    tail = _records(cluster.read_incremental("tail", "kv"))

    # the first clean: below the HW (10) and the last record (9); offset 0 starts epoch 0 and stays,
    # k4's v1 stays (its v2 is at the first uncleanable offset), the tombstone stays (too young)
    report = cluster.compact()
    assert (report.partitions_cleaned, report.replicas_cleaned, report.records_removed) == (1, 3, 9)
    survivors = [written[o] for o in (0, 4, 5, 6, 7, 8, 9)]
    assert [replica_log(cluster, "kv", b, ("offset", "key", "value")) for b in range(3)] == [survivors] * 3
    # a reader from the start sees at least the final value of every key, in order, at its offset
    committed = replica_log(cluster, "kv", 0, ("offset", "key", "value"), isolation="read_committed")
    assert _final_values(committed) == _final_values(written)
    assert ("k3", None) in [(k, v) for _, k, v in committed]  # the delete is still visible

    # broker 2 loses its disk and refetches: it gets the compacted log, and its LEO is the leader's
    cluster.stop_broker(2)
    shutil.rmtree(cluster.storage.log_path(2))
    cluster.start_broker(2)
    for _ in range(3):
        advance_round(cluster, clock)
    assert replica_log(cluster, "kv", 2, ("offset", "key", "value")) == survivors
    assert _state(cluster, "kv", 2)["log_end_offset"] == 10
    assert cluster.describe("kv").first()["isr"] == [0, 1, 2]

    # 60 s later (delete.retention.ms after the first clean): k1 gets v3; retention runs in these
    # rounds but a compact-only topic keeps its log start (the delete topic loses its record)
    clock.advance(60_000)
    update = cluster.produce("kv", [{"key": "k1", "value": "v3", "partition": 0}], acks="all")
    advance_round(cluster, clock), advance_round(cluster, clock)
    assert cluster.produce_results().filter(F.col("request_id") == update).first()["status"] == "acked"
    tail += _records(cluster.read_incremental("tail", "kv"))
    assert tail == written + [(10, "k1", "v3")]
    assert [_state(cluster, "kv", b)["log_start_offset"] for b in range(3)] == [0, 0, 0]
    assert _state(cluster, "plain", cluster.describe("plain").first()["leader"])["log_start_offset"] == 1
    # one dirty record (k4 v2) of six: under the dirty ratio, but older than max.compaction.lag.ms
    report = cluster.compact()
    assert (report.partitions_cleaned, report.replicas_cleaned, report.records_removed) == (1, 3, 6)
    written.append((10, "k1", "v3"))
    # k4's v1 goes, and the tombstone: a clean passed it 60 s ago; k1's v2 stays (v3 is at the
    # first uncleanable offset)
    survivors = [written[o] for o in (0, 5, 6, 7, 9, 10)]
    assert [replica_log(cluster, "kv", b, ("offset", "key", "value")) for b in range(3)] == [survivors] * 3
    final = _final_values(written)
    assert {k: v for k, v in _final_values(replica_log(cluster, "kv", 1, ("offset", "key", "value"), isolation="read_committed")).items()} == \
        {k: v for k, v in final.items() if v[1] is not None}  # only the deleted key is gone
    oldest_dirty = cluster.read("kv").filter("offset = 9").first()["timestamp"]
    metrics = _metrics(cluster)
    assert metrics["max-compaction-delay-secs"] == (report.now_ms - 30_000 - oldest_dirty) / 1000
    assert metrics["uncleanable-partitions-count"] == 0
    assert metrics["max-clean-time-secs"] == report.clean_time_ms / 1000 > 0

    # the job's step: a pass once log.cleaner.backoff.ms (15 s) has passed since the last one
    assert cluster.compact_if_due() is None
    clock.advance(15_000)
    assert cluster.compact_if_due().run_id == 3
    assert cluster.compact_if_due() is None

    # a log directory that cannot be read: its replica is uncleanable, the pass still completes
    shutil.rmtree(cluster.storage.log_path(1))
    report = cluster.compact()
    assert report.uncleanable_partitions == 1
    assert _metrics(cluster)["uncleanable-partitions-count"] == 1
    assert cluster.cleaner_runs().count() == 4
