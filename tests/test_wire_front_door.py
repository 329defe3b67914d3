"""The front door's Metadata (pipeline/wire/metadata.py, issue 51): the rule with exact expected
responses, and stock clients (kafka-python, confluent-kafka on librdkafka) reading a real
cluster's brokers, topics, leaders and ISRs through the server on 127.0.0.1."""

import time
import uuid

from kio.schema.errors import ErrorCode
from kio.schema.metadata.v1.request import MetadataRequest as MetadataRequestV1
from kio.schema.metadata.v0.request import MetadataRequest as MetadataRequestV0
from kio.schema.metadata.v12 import response as v12
from kio.schema.metadata.v1 import response as v1
from kio.static.primitive import i32

from pipeline.wire.front_door import serve
from pipeline.wire.metadata import metadata_response, requested_topics, topic_id

ROWS = [  # partition 1 has lost its leader; broker 2 is fenced
    {"topic": "orders", "partition": 1, "leader": -1, "leader_epoch": 3, "replicas": [2], "isr": [2]},
    {"topic": "orders", "partition": 0, "leader": 0, "leader_epoch": 1, "replicas": [0, 1, 2], "isr": [0, 1]},
    {"topic": "audit", "partition": 0, "leader": 1, "leader_epoch": 0, "replicas": [1], "isr": [1]},
]


def test_which_topics_a_metadata_request_asks_for_by_version():
    assert requested_topics(0, MetadataRequestV0(topics=())) is None  # v0: empty means every topic
    assert requested_topics(1, MetadataRequestV1(topics=())) == []  # v1 on: empty means none
    assert requested_topics(1, MetadataRequestV1(topics=None)) is None


def test_metadata_gives_live_brokers_partitions_leaders_isrs_and_errors_exactly():
    response = metadata_response(12, ["orders", "nope"], ROWS, live=[1, 0], cluster_id="c1", host="h", port=9)
    zero = i32(0)
    assert response == v12.MetadataResponse(
        throttle_time=response.throttle_time,
        brokers=(v12.MetadataResponseBroker(node_id=i32(0), host="h", port=i32(9), rack=None),
                 v12.MetadataResponseBroker(node_id=i32(1), host="h", port=i32(9), rack=None)),
        cluster_id="c1", controller_id=zero,
        topics=(v12.MetadataResponseTopic(
                    error_code=ErrorCode.none, name="orders", topic_id=topic_id("c1", "orders"), is_internal=False,
                    partitions=(
                        v12.MetadataResponsePartition(error_code=ErrorCode.none, partition_index=zero, leader_id=zero,
                                                      leader_epoch=i32(1), replica_nodes=(zero, i32(1), i32(2)),
                                                      isr_nodes=(zero, i32(1)), offline_replicas=(i32(2),)),
                        v12.MetadataResponsePartition(error_code=ErrorCode.leader_not_available,
                                                      partition_index=i32(1), leader_id=i32(-1), leader_epoch=i32(3),
                                                      replica_nodes=(i32(2),), isr_nodes=(i32(2),),
                                                      offline_replicas=(i32(2),)))),
                v12.MetadataResponseTopic(error_code=ErrorCode.unknown_topic_or_partition, name="nope",
                                          topic_id=uuid.UUID(int=0), is_internal=False, partitions=())))
    assert response.throttle_time.total_seconds() == 0
    # every topic, in an old version without epochs, ids or offline replicas
    old = metadata_response(1, None, ROWS, live=[0, 1], cluster_id="c1", host="h", port=9)
    assert isinstance(old, v1.MetadataResponse) and [t.name for t in old.topics] == ["audit", "orders"]
    assert old.topics[1].partitions[0] == v1.MetadataResponsePartition(
        error_code=ErrorCode.none, partition_index=zero, leader_id=zero, replica_nodes=(zero, i32(1), i32(2)),
        isr_nodes=(zero, i32(1)))
    assert topic_id("c1", "orders") == topic_id("c1", "orders") != topic_id("c2", "orders")


def test_stock_clients_read_the_clusters_metadata_through_the_front_door(new_cluster):
    from confluent_kafka.admin import AdminClient
    from kafka import KafkaAdminClient, KafkaConsumer

    cluster = new_cluster(brokers=3)
    cluster.create_topic("orders", partitions=2, replication_factor=3)
    cluster.create_topic("audit", partitions=1, replication_factor=2)
    expected = {(r["topic"], r["partition"]): (r["leader"], list(r["replicas"]), list(r["isr"]))
                for r in cluster.describe().collect()}
    server = serve(cluster, port=0)
    address = f"127.0.0.1:{server.port}"
    try:
        consumer = KafkaConsumer(bootstrap_servers=address, request_timeout_ms=120_000)
        try:
            assert consumer.topics() == {"orders", "audit"}
            assert consumer.partitions_for_topic("orders") == {0, 1}
        finally:
            consumer.close()
        admin = KafkaAdminClient(bootstrap_servers=address, request_timeout_ms=120_000)
        try:
            described = {t["name"]: t for t in admin.describe_topics(["orders", "nope"])}
            assert described["nope"]["error_code"] == 3  # UNKNOWN_TOPIC_OR_PARTITION
            assert {("orders", p["partition_index"]): (p["leader_id"], p["replica_nodes"], p["isr_nodes"])
                    for p in described["orders"]["partitions"]} == {
                k: v for k, v in expected.items() if k[0] == "orders"}
            brokers = admin.describe_cluster()
            assert sorted(b["broker_id"] for b in brokers["brokers"]) == [0, 1, 2]
            assert brokers["cluster_id"] == cluster.storage.cluster_id
        finally:
            admin.close()
        metadata = AdminClient({"bootstrap.servers": address}).list_topics(timeout=120)  # librdkafka
        assert sorted(metadata.brokers) == [0, 1, 2] and metadata.cluster_id == cluster.storage.cluster_id
        assert {(t.topic, p.id): (p.leader, p.replicas, p.isrs) for t in metadata.topics.values()
                for p in t.partitions.values()} == expected
    finally:
        server.shutdown()


def test_replog_serve_answers_stock_clients_until_sigterm(capsys, new_cluster):
    import os
    import signal
    import socket
    import threading
    from kafka import KafkaConsumer
    from pipeline.cli import main

    cluster = new_cluster(brokers=3)
    cluster.create_topic("orders", partitions=2, replication_factor=3)
    with socket.socket() as s:  # a free port for --listen
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen = {}

    def client():  # once the door is up: a consumer's view of the topics, then SIGTERM to this process
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
            consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=120_000)
            seen["partitions"] = consumer.partitions_for_topic("orders")
            consumer.close()
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    handler = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=client, daemon=True).start()
    assert main(["serve", "--root", cluster.storage.root, "--listen", f"127.0.0.1:{port}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert seen == {"partitions": {0, 1}}
    assert out == [f"Serving Kafka's protocol for {cluster.storage.root} at 127.0.0.1:{port} (ApiVersions, Metadata);"
                   " SIGTERM or Ctrl-C stops.", "Stopped."]
    assert signal.getsignal(signal.SIGTERM) is handler  # (the command put the handlers back)
    assert main(["serve", "--root", cluster.storage.root, "--listen", "9092"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == ["replog: INVALID_REQUEST: --listen '9092' is not HOST:PORT"]
