"""Configs altered at run time (kafka-configs --alter, Kafka's IncrementalAlterConfigs): a topic's
override and the cluster-wide broker default, each used by the next round of a cluster object that
was already running rounds; and the requests a user can get wrong, which write nothing."""

import pytest
from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock
from pipeline.cli import config_list
from pipeline.config import validate_cluster_config, with_defaults
from pipeline.errors import ReplogError
from tests.helpers import advance_rounds


def _error(cluster, request_id):
    return cluster.produce_results().filter(F.col("request_id") == request_id).first()["error_code"]


def test_a_topic_override_and_a_broker_default_take_effect_at_the_next_round(spark, tmp_path):
    clock = ManualClock(start_ms=0)
    root = str(tmp_path / "c")
    job = Cluster.create(spark, root, brokers=2, clock=clock)
    job.create_topic("t", partitions=1, replication_factor=2)
    job.create_topic("u", partitions=1, replication_factor=2)
    big = [{"value": "x" * 200}]
    accepted = job.produce("t", big)
    advance_rounds(job, clock, 2)
    assert _error(job, accepted) is None

    admin = Cluster.open(spark, root, clock=clock)  # another process: the job's object must notice
    assert admin.alter_configs("topics", "t", set={"message.max.bytes": "100"}) == {"message.max.bytes": 100}
    refused, other = job.produce("t", big), job.produce("u", big)
    advance_rounds(job, clock, 2)
    assert (_error(job, refused), _error(job, other)) == ("MESSAGE_TOO_LARGE", None)

    admin.alter_configs("brokers", set={"message.max.bytes": 150})
    assert job.config["message.max.bytes"] == 1048588
    refused_u = job.produce("u", big)
    advance_rounds(job, clock, 2)
    assert _error(job, refused_u) == "MESSAGE_TOO_LARGE" and job.config["message.max.bytes"] == 150
    assert admin.describe_configs("brokers")["message.max.bytes"] == 150

    admin.alter_configs("topics", "t", delete=["message.max.bytes"])  # back to the cluster's 150
    admin.alter_configs("brokers", delete=["message.max.bytes"])     # back to Kafka's default
    assert admin.describe_configs("topics", "t") == {}
    again = job.produce("t", big)
    advance_rounds(job, clock, 2)
    assert _error(job, again) is None


def test_config_changes_a_user_can_get_wrong_write_nothing(spark, tmp_path):
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=2, clock=ManualClock(start_ms=0))
    cluster.create_topic("t", partitions=1, replication_factor=2)
    versions = (cluster.storage.version("topics"), cluster.storage.version("cluster"))
    for call, code, words in [
        (lambda: cluster.alter_configs("topics", "nope", set={"retention.ms": 1}), "UNKNOWN_TOPIC_OR_PARTITION", "nope"),
        (lambda: cluster.alter_configs("topics", "t", set={"retention.mss": 1}), "INVALID_CONFIG", "retention.mss"),
        (lambda: cluster.alter_configs("topics", "t", set={"min.insync.replicas": 3}), "INVALID_CONFIG",
         "exceeds the replication factor (2)"),
        (lambda: cluster.alter_configs("topics", "t", set={"retention.ms": "soon"}), "INVALID_CONFIG", "retention.ms"),
        (lambda: cluster.alter_configs("topics", "t", delete=["nope"]), "INVALID_CONFIG", "nope"),
        (lambda: cluster.alter_configs("brokers", set={"num.replica.fetchers": 0}), "INVALID_CONFIG",
         "num.replica.fetchers"),
        (lambda: cluster.alter_configs("brokers", "1", set={"message.max.bytes": 5}), "INVALID_CONFIG", "cluster-wide"),
        (lambda: cluster.alter_configs("groups", set={}), "INVALID_CONFIG", "entity type"),
        (lambda: cluster.alter_configs("clients", set={}), "INVALID_REQUEST", "nothing to alter"),
    ]:
        with pytest.raises(ReplogError) as error:
            call()
        assert error.value.code == code and words in str(error.value), str(error.value)
    assert (cluster.storage.version("topics"), cluster.storage.version("cluster")) == versions


def test_kafka_configs_add_config_list():
    assert config_list("retention.ms=1000, cleanup.policy=[compact,delete]") == {
        "retention.ms": "1000", "cleanup.policy": "compact,delete"}
    assert config_list(None) == {}
    with pytest.raises(ReplogError) as error:
        config_list("retention.ms")
    assert error.value.code == "INVALID_CONFIG"


def test_a_removed_key_is_refused_when_given_and_dropped_from_a_stored_config():
    # replication.round chose between two rounds until the round before v2 went: a config that
    # names it now is refused (it would do nothing), and a root that stored it still opens
    with pytest.raises(ReplogError, match="unknown cluster config key 'replication.round'") as error:
        validate_cluster_config({"replication.round": "v1"})
    assert error.value.code == "INVALID_CONFIG"
    stored = with_defaults({"replication.round": "v2", "num.replica.fetchers": 2})
    assert "replication.round" not in stored and stored["num.replica.fetchers"] == 2
    assert validate_cluster_config(stored) == stored
