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
from kio.static.primitive import i8, i32, i64

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
    from kafka import KafkaConsumer, KafkaProducer
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
            producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", acks="all", request_timeout_ms=120_000,
                                     delivery_timeout_ms=240_000)
            sent = producer.send("orders", value=b"through the door", partition=1).get(timeout=240)
            producer.close()
            seen["sent"] = (sent.partition, sent.offset)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    handler = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=client, daemon=True).start()
    assert main(["serve", "--root", cluster.storage.root, "--listen", f"127.0.0.1:{port}", "--run-rounds",
                 "--round-interval-ms", "200"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert seen == {"partitions": {0, 1}, "sent": (1, 0)}  # (acks=all: answered once the round committed it)
    assert [r["value"] for r in cluster.read("orders", partition=1).collect()] == [b"through the door"]
    assert out == [f"Serving Kafka's protocol for {cluster.storage.root} at 127.0.0.1:{port} "
                   "(rounds every 200 ms here); SIGTERM or Ctrl-C stops.", "Stopped."]
    assert signal.getsignal(signal.SIGTERM) is handler  # (the command put the handlers back)
    assert main(["serve", "--root", cluster.storage.root, "--listen", "9092"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == ["replog: INVALID_REQUEST: --listen '9092' is not HOST:PORT"]


def test_list_offsets_answers_latest_earliest_and_timestamps_with_kafkas_errors():
    from kio.schema.list_offsets.v6 import request as q, response as a
    from pipeline.wire.list_offsets import list_offsets_response

    def asked(partition, timestamp, epoch=-1):
        return q.ListOffsetsPartition(partition_index=i32(partition), current_leader_epoch=i32(epoch),
                                      timestamp=i64(timestamp))

    body = q.ListOffsetsRequest(replica_id=i32(-1), isolation_level=i8(0), topics=(
        q.ListOffsetsTopic(name="orders", partitions=(asked(0, -1), asked(0, -2), asked(0, 500), asked(0, 900),
                                                      asked(1, -1), asked(0, -1, epoch=1), asked(0, -1, epoch=3),
                                                      asked(7, -1))),
        q.ListOffsetsTopic(name="nope", partitions=(asked(0, -2),))))
    partitions = {("orders", 0): {"leader": 0, "leader_epoch": 2, "log_start_offset": 4, "high_watermark": 9},
                  ("orders", 1): {"leader": -1, "leader_epoch": 5, "log_start_offset": 0, "high_watermark": 0}}
    found = {("orders", 0, 500): (6, 510, 1)}  # the first record at or after 500; none at 900
    response = list_offsets_response(6, body, partitions, found, {("orders", 0): 1})

    def answer(partition, error=ErrorCode.none, timestamp=-1, offset=-1, epoch=-1):
        return a.ListOffsetsPartitionResponse(partition_index=i32(partition), error_code=error,
                                              timestamp=i64(timestamp), offset=i64(offset), leader_epoch=i32(epoch))

    assert response.topics == (
        a.ListOffsetsTopicResponse(name="orders", partitions=(
            answer(0, offset=9, epoch=2),  # LATEST: the HW, the partition's epoch
            answer(0, offset=4, epoch=1),  # EARLIEST: the log start, the epoch of its record
            answer(0, timestamp=510, offset=6, epoch=1), answer(0),
            answer(1, ErrorCode.not_leader_or_follower),
            answer(0, ErrorCode.fenced_leader_epoch), answer(0, ErrorCode.unknown_leader_epoch),
            answer(7, ErrorCode.unknown_topic_or_partition))),
        a.ListOffsetsTopicResponse(name="nope", partitions=(answer(0, ErrorCode.unknown_topic_or_partition),)))


def test_stock_consumers_list_offsets_by_time_and_at_both_ends(new_cluster, clock):
    from confluent_kafka import Consumer, TopicPartition as Partition
    from kafka import KafkaConsumer, TopicPartition
    from tests.helpers import advance_round

    cluster = new_cluster(brokers=3)
    cluster.create_topic("orders", partitions=2, replication_factor=3)
    cluster.produce("orders", [{"value": f"a{i}", "partition": i % 2} for i in range(6)], acks="all")
    advance_round(cluster)
    clock.advance(10_000)
    later = clock.now_ms()
    cluster.produce("orders", [{"value": f"b{i}", "partition": 0} for i in range(2)], acks="all")
    advance_round(cluster)
    offsets = {r["partition"]: r["offset"] for r in cluster.read("orders").filter(f"timestamp >= {later}")
               .groupBy("partition").agg({"offset": "min"}).withColumnRenamed("min(offset)", "offset").collect()}
    assert offsets == {0: 3}
    server = serve(cluster, port=0)
    try:
        consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{server.port}", request_timeout_ms=120_000)
        try:
            tps = [TopicPartition("orders", 0), TopicPartition("orders", 1)]
            assert consumer.end_offsets(tps) == {tps[0]: 5, tps[1]: 3}
            assert consumer.beginning_offsets(tps) == {tps[0]: 0, tps[1]: 0}
            by_time = consumer.offsets_for_times({tps[0]: later, tps[1]: later})
            assert by_time[tps[1]] is None and (by_time[tps[0]].offset, by_time[tps[0]].timestamp) == (3, later)
        finally:
            consumer.close()
        rd = Consumer({"bootstrap.servers": f"127.0.0.1:{server.port}", "group.id": "g"})  # librdkafka
        try:
            assert rd.get_watermark_offsets(Partition("orders", 0), timeout=120) == (0, 5)
            [found] = rd.offsets_for_times([Partition("orders", 0, later)], timeout=120)
            assert found.offset == 3 and found.error is None
        finally:
            rd.close()
    finally:
        server.shutdown()


def test_group_offsets_commit_what_exists_refuse_the_rest_and_fetch_back_with_kafkas_errors():
    from kio.schema.find_coordinator.v3 import request as fq
    from kio.schema.offset_commit.v8 import request as cq, response as ca
    from kio.schema.offset_fetch.v7 import request as oq
    from pipeline.wire.groups import (find_coordinator_response, offset_commit_plan, offset_commit_response,
                                      offset_fetch_response)

    def part(index, offset, metadata=None):
        return cq.OffsetCommitRequestPartition(partition_index=i32(index), committed_offset=i64(offset),
                                               committed_metadata=metadata)

    def commit(group="billing", generation=-1):
        return cq.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=i32(generation), member_id="",
                                      topics=(cq.OffsetCommitRequestTopic(name="orders", partitions=(
                                          part(0, 5, "m"), part(1, 7), part(9, 1), part(0, 6, "x" * 4097))),))

    known = {("orders", 0), ("orders", 1)}
    commits, errors = offset_commit_plan(commit(), known)
    assert commits == {None: {("orders", 1): 7}}  # (partition 0's last entry, too large, decides)
    assert errors == {("orders", 9): ErrorCode.unknown_topic_or_partition,
                      ("orders", 0): ErrorCode.offset_metadata_too_large}
    response = offset_commit_response(8, commit(), errors)
    assert [p.error_code for p in response.topics[0].partitions] == [
        ErrorCode.offset_metadata_too_large, ErrorCode.none, ErrorCode.unknown_topic_or_partition,
        ErrorCode.offset_metadata_too_large]
    assert offset_commit_plan(commit(), known | {("orders", 9)})[0] == {None: {("orders", 1): 7, ("orders", 9): 1}}
    assert isinstance(response, ca.OffsetCommitResponse)
    # a managed group's member (a generation) has no group here; an empty group id is invalid
    assert set(offset_commit_plan(commit(generation=3), known)[1].values()) == {ErrorCode.illegal_generation}
    assert offset_commit_plan(commit(generation=3), known)[0] == {}
    assert set(offset_commit_plan(commit(group=" "), known)[1].values()) == {ErrorCode.invalid_group_id}

    committed = {("orders", 0): (5, "m"), ("audit", 0): (2, None)}
    asked = oq.OffsetFetchRequest(group_id="billing", topics=(
        oq.OffsetFetchRequestTopic(name="orders", partition_indexes=(i32(0), i32(1))),))
    fetched = offset_fetch_response(7, asked, committed)
    assert [(t.name, p.partition_index, p.committed_offset, p.metadata, p.error_code)
            for t in fetched.topics for p in t.partitions] == [
        ("orders", 0, 5, "m", ErrorCode.none), ("orders", 1, -1, "", ErrorCode.none)]
    every = offset_fetch_response(7, oq.OffsetFetchRequest(group_id="billing", topics=None), committed)
    assert [(t.name, [p.committed_offset for p in t.partitions]) for t in every.topics] == [("audit", [2]),
                                                                                          ("orders", [5])]

    coordinator = find_coordinator_response(3, fq.FindCoordinatorRequest(key="billing", key_type=i8(0)), [2, 1],
                                            "h", 9)
    assert (coordinator.error_code, coordinator.node_id, coordinator.host, coordinator.port) == (
        ErrorCode.none, 1, "h", 9)
    transactional = find_coordinator_response(3, fq.FindCoordinatorRequest(key="tx", key_type=i8(1)), [1], "h", 9)
    assert (transactional.error_code, transactional.node_id) == (ErrorCode.coordinator_not_available, -1)


def test_stock_consumers_commit_and_fetch_group_offsets_through_the_front_door(new_cluster):
    from confluent_kafka import Consumer, TopicPartition as Partition
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    cluster = new_cluster(brokers=3)
    cluster.create_topic("orders", partitions=2, replication_factor=3)
    server = serve(cluster, port=0)
    try:
        consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{server.port}", group_id="billing",
                                 enable_auto_commit=False, request_timeout_ms=120_000)
        try:
            tp = TopicPartition("orders", 0)
            consumer.assign([tp])  # (the door serves no group membership: partitions are assigned by hand)
            consumer.commit({tp: OffsetAndMetadata(0, "first", -1)})
            assert consumer.committed(tp) == 0
        finally:
            consumer.close()
        assert [(r["topic"], r["partition"], r["committed_offset"], r["metadata"])
                for r in cluster.committed_offsets("billing").collect()] == [("orders", 0, 0, "first")]
        rd = Consumer({"bootstrap.servers": f"127.0.0.1:{server.port}", "group.id": "billing",
                       "enable.auto.commit": False})  # librdkafka
        try:
            assert [p.offset for p in rd.committed([Partition("orders", 0), Partition("orders", 1)],
                                                   timeout=120)] == [0, -1001]  # (-1001: none committed)
            rd.commit(offsets=[Partition("orders", 1, 0)], asynchronous=False)
        finally:
            rd.close()
        assert sorted((r["partition"], r["committed_offset"]) for r in cluster.committed_offsets("billing")
                      .collect()) == [(0, 0), (1, 0)]
    finally:
        server.shutdown()
