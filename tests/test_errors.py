"""Every error a user can cause: a clear message with Kafka's error name, and nothing written."""

import os

import pytest

from pipeline import Cluster, ManualClock, ReplogError

TABLES = ["topics", "partitions", "replica_state", "inbox", "results"]


@pytest.fixture(scope="module")
def cluster(spark, tmp_path_factory):
    c = Cluster.create(spark, str(tmp_path_factory.mktemp("errors") / "c"), brokers=3, clock=ManualClock(0))
    c.create_topic("t", partitions=2, replication_factor=2)
    return c


def versions(cluster):
    return {t: cluster.storage.version(t) for t in TABLES}


def assert_refused(cluster, code, fn, *args, **kwargs):
    before = versions(cluster)
    with pytest.raises(ReplogError) as err:
        fn(*args, **kwargs)
    assert err.value.code == code
    assert code in str(err.value)
    assert versions(cluster) == before, "an error must write nothing"
    return err.value


@pytest.mark.parametrize("rf", [0, -1, 4, "3", True])
def test_invalid_replication_factor(cluster, rf):
    err = assert_refused(cluster, "INVALID_REPLICATION_FACTOR", cluster.create_topic, "x", 1, rf)
    assert "broker count 3" in str(err)


@pytest.mark.parametrize("partitions", [0, -3, 1.5, None])
def test_invalid_partitions(cluster, partitions):
    assert_refused(cluster, "INVALID_PARTITIONS", cluster.create_topic, "x", partitions, 1)


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "bad/name", "ü", "x" * 250, None, 7])
def test_invalid_topic_names(cluster, name):
    assert_refused(cluster, "INVALID_TOPIC_EXCEPTION", cluster.create_topic, name, 1, 1)


def test_longest_legal_topic_name_is_accepted(cluster):
    cluster.create_topic("a._-Z9" + "x" * 243, partitions=1, replication_factor=1)


def test_existing_topic(cluster):
    assert_refused(cluster, "TOPIC_ALREADY_EXISTS", cluster.create_topic, "t", 2, 2)


@pytest.mark.parametrize("acks", [2, -2, "ALL", "one", None, True, 1.0])
def test_invalid_acks(cluster, acks):
    assert_refused(cluster, "INVALID_REQUIRED_ACKS", cluster.produce, "t", [{"value": "v"}], acks=acks)


@pytest.mark.parametrize("config,key", [
    ({"no.such.key": "1"}, "no.such.key"),
    ({"min.insync.replicas": "two"}, "min.insync.replicas"),
    ({"min.insync.replicas": 0}, "min.insync.replicas"),
    ({"replica.lag.time.max.ms": -5}, "replica.lag.time.max.ms"),
    ({"unclean.leader.election.enable": "yes"}, "unclean.leader.election.enable"),
    ({"min.insync.replicas": 3}, "min.insync.replicas"),  # above the replication factor 2
    ({"cleanup.policy": "compact,compact"}, "cleanup.policy"),
    ({"cleanup.policy": "forever"}, "cleanup.policy"),
    ({"min.cleanable.dirty.ratio": 1.5}, "min.cleanable.dirty.ratio"),
    ({"min.cleanable.dirty.ratio": "half"}, "min.cleanable.dirty.ratio"),
    ({"min.cleanable.dirty.ratio": True}, "min.cleanable.dirty.ratio"),
    ({"max.compaction.lag.ms": 0}, "max.compaction.lag.ms"),
    ({"delete.retention.ms": -1}, "delete.retention.ms"),
    ({"log.cleaner.backoff.ms": 100}, "log.cleaner.backoff.ms"),  # a cluster key, not a topic's
])
def test_invalid_topic_config_names_the_key(cluster, config, key):
    err = assert_refused(cluster, "INVALID_CONFIG", cluster.create_topic, "cfg", 1, 2, config)
    assert key in str(err)


@pytest.mark.parametrize("config,key", [
    ({"bogus": 1}, "bogus"),
    ({"num.replica.fetchers": 0}, "num.replica.fetchers"),
    ({"replica.fetch.max.bytes": "lots"}, "replica.fetch.max.bytes"),
])
def test_invalid_cluster_config_creates_nothing(spark, tmp_path, config, key):
    root = tmp_path / "bad"
    with pytest.raises(ReplogError, match=key) as err:
        Cluster.create(spark, str(root), brokers=1, config=config)
    assert err.value.code == "INVALID_CONFIG"
    assert not root.exists()


def test_topic_config_values_are_normalized():
    from pipeline.config import validate_topic_config
    assert validate_topic_config({"cleanup.policy": " delete, compact", "min.cleanable.dirty.ratio": "0.25"}, 1) == \
        {"cleanup.policy": "compact,delete", "min.cleanable.dirty.ratio": 0.25}


def test_create_on_existing_cluster_and_open_on_empty_root(spark, cluster, tmp_path):
    with pytest.raises(ReplogError, match="already holds a cluster") as err:
        Cluster.create(spark, cluster.storage.root, brokers=1)
    assert err.value.code == "CLUSTER_ALREADY_EXISTS"
    with pytest.raises(ReplogError, match="holds no cluster") as err:
        Cluster.open(spark, str(tmp_path / "nothing-here"))
    assert err.value.code == "CLUSTER_NOT_FOUND"
    assert not os.path.exists(tmp_path / "nothing-here")


@pytest.mark.parametrize("records", [[{"key": "k"}], [{"value": "v"}, {"key": "only"}], [{"value": 5}],
                                     [{"value": "v", "extra": 1}], [], "just a string", [{"value": "v", "partition": "0"}]])
def test_invalid_records(cluster, records):
    assert_refused(cluster, "INVALID_RECORD", cluster.produce, "t", records)


def test_dataframe_without_value_column(spark, cluster):
    df = spark.createDataFrame([("k",)], "key string")
    err = assert_refused(cluster, "INVALID_RECORD", cluster.produce, "t", df)
    assert "'value'" in str(err)


@pytest.mark.parametrize("schema,row", [
    ("value string, extra int", ("v", 1)),          # an unknown column
    ("value int", (5,)),                            # a value that is not string or binary
    ("value string, partition string", ("v", "0")),  # a partition that is not an integer
    ("value string, sequence double", ("v", 1.0)),
])
def test_invalid_records_dataframe_names_the_column(spark, cluster, schema, row):
    err = assert_refused(cluster, "INVALID_RECORD", cluster.produce, "t", spark.createDataFrame([row], schema))
    assert schema.split(", ")[-1].split()[0] in str(err)


def test_unknown_topic_and_partition_fail_in_the_produce_result_and_append_nothing(spark, cluster):
    unknown_topic = cluster.produce("nope", [{"value": "v"}], acks="all")
    bad_partition = cluster.produce("t", [{"value": "v", "partition": 5}], acks=1)
    good = cluster.produce("t", [{"value": "v", "partition": 1}], acks=1)
    report = cluster.run_round()
    results = {r["request_id"]: (r["status"], r["error_code"]) for r in cluster.produce_results().collect()}
    assert results[unknown_topic] == ("error", "UNKNOWN_TOPIC_OR_PARTITION")
    assert results[bad_partition] == ("error", "UNKNOWN_TOPIC_OR_PARTITION")
    assert results[good] == ("acked", None)
    assert report.records_appended == 1 and report.requests_failed == 2
    assert cluster.read("t", isolation="read_uncommitted").count() == 1


def test_reads_of_unknown_topic_or_partition(cluster):
    with pytest.raises(ReplogError, match="UNKNOWN_TOPIC_OR_PARTITION"):
        cluster.read("nope")
    with pytest.raises(ReplogError, match="UNKNOWN_TOPIC_OR_PARTITION"):
        cluster.read("t", partition=2)
    with pytest.raises(ReplogError, match="UNKNOWN_TOPIC_OR_PARTITION"):
        cluster.describe("nope")
    with pytest.raises(ValueError, match="isolation"):
        cluster.read("t", isolation="dirty")


def test_a_10_mb_request_of_tiny_records_is_appended_whole(spark, tmp_path):
    """message.max.bytes (Kafka's default 1048588) bounds a record, not a request: a 10 MB produce of
    one-byte values (what a Kafka producer sends as many batches) is appended in one round, each
    record once, at offsets 0..n-1."""
    from pipeline.control.replication import RECORD_OVERHEAD_BYTES
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=1, clock=ManualClock(0))
    cluster.create_topic("tiny", partitions=1, replication_factor=1)
    n = 10 * 1024 * 1024 // (1 + RECORD_OVERHEAD_BYTES)  # 476,625 records of 22 bytes each
    request = cluster.produce("tiny", spark.range(n).selectExpr("cast(id % 10 AS string) AS value"), acks=1)
    cluster.run_round()
    result = cluster.produce_results().filter(f"request_id = '{request}'").first()
    assert (result["status"], result["error_code"], result["base_offset"], result["last_offset"]) == \
        ("acked", None, 0, n - 1)
    log = cluster.read("tiny", isolation="read_uncommitted")
    assert log.selectExpr("count(*)", "count(DISTINCT offset)", "min(offset)", "max(offset)").first() == (n, n, 0, n - 1)
