"""The front door's Produce, Fetch, InitProducerId and CreateTopics (pipeline/wire/, issue 51):
the rules with exact expected responses, and stock clients (kafka-python, confluent-kafka on
librdkafka) producing with acks=all and idempotence into a real cluster whose rounds the door runs,
then consuming every record back with the offsets cluster.read shows."""

import io
from datetime import timedelta

import pytest
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch_req
from kio.schema.produce.v9 import request as produce_req
from kio.schema.produce.v9 import response as produce_resp
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i32Timedelta, i64

from pipeline.wire.fetch import answers, fetch_ranges, fetch_response
from pipeline.wire.fetch_sessions import Answer, requested
from pipeline.wire.front_door import serve
from pipeline.wire.produce import ProducePlan, produce_plan, produce_response, result_of
from pipeline.wire.records import RecordsRefused, read_produced, write_fetched
from pipeline.wire.topics import create_topics_response, topics_asked

NOW = TZAwareMicros.parse(__import__("datetime").datetime(2026, 12, 3, tzinfo=__import__("datetime").timezone.utc))


def batch(values, producer_id=-1, epoch=-1, base_sequence=-1, attributes=0, headers=()):
    buffer = io.BytesIO()
    write_new_batch(buffer, NewRecordBatch(
        producer_id=i64(producer_id), producer_epoch=i16(epoch), base_sequence=i32(base_sequence),
        attributes=i16(attributes),
        records=tuple(Record(attributes=i8(0), timestamp=NOW, offset=i64(n), key=k, value=v, headers=headers)
                      for n, (k, v) in enumerate(values))))
    return buffer.getvalue()


def produce_request(acks, topics):
    return produce_req.ProduceRequest(
        transactional_id=None, acks=i16(acks), timeout=i32Timedelta.parse(timedelta(seconds=30)),
        topic_data=tuple(produce_req.TopicProduceData(name=name, partition_data=tuple(
            produce_req.PartitionProduceData(index=i32(p), records=data) for p, data in parts))
            for name, parts in topics))


def test_produced_batches_become_inbox_records_with_their_sequences():
    data = batch([(b"k1", b"v1"), (None, b"v2")], producer_id=7, epoch=2, base_sequence=10)
    data += batch([(b"k3", None)], producer_id=7, epoch=2, base_sequence=12)
    assert read_produced(data, 3) == [
        {"key": b"k1", "value": b"v1", "partition": 3, "producer_id": 7, "producer_epoch": 2, "sequence": 10},
        {"key": None, "value": b"v2", "partition": 3, "producer_id": 7, "producer_epoch": 2, "sequence": 11},
        {"key": b"k3", "value": None, "partition": 3, "producer_id": 7, "producer_epoch": 2, "sequence": 12}]
    # a producer without idempotence: no producer fields
    assert read_produced(batch([(None, b"x")]), 0) == [{"key": None, "value": b"x", "partition": 0}]


@pytest.mark.parametrize("data, error", [
    (batch([(None, b"x")], attributes=1), "UNSUPPORTED_COMPRESSION_TYPE"),  # gzip
    (batch([(None, b"x")], attributes=0x10), "INVALID_RECORD"),  # transactional
    (batch([(None, b"x")], headers=(__import__("kio.records.schema", fromlist=["RecordHeader"]).RecordHeader(
        key=b"h", value=b"1"),)), "INVALID_RECORD"),
    (batch([(None, b"x")])[:-1] + b"\x01", "CORRUPT_MESSAGE"),  # a byte changed: the CRC fails
    (b"", "INVALID_RECORD"),
])
def test_batches_the_door_does_not_take_are_refused_with_kafkas_error(data, error):
    with pytest.raises(RecordsRefused) as refused:
        read_produced(data, 0)
    assert refused.value.error == error


def test_fetched_records_are_batches_per_leader_epoch_that_read_back():
    from kio.records.readers import read_batch
    data = write_fetched([(5, 1, 1_700_000_000_123, b"k", b"v"), (6, 1, 1_700_000_000_124, None, b"w"),
                          (7, 2, 1_700_000_000_125, b"x", None)])
    batches, offset = [], 0
    while offset < len(data):
        b, size = read_batch(data, offset)
        batches.append((b.base_offset, b.partition_leader_epoch, b.base_timestamp,
                        [(r.offset, r.key, r.value) for r in b.records]))
        offset += size
    assert batches == [(5, 1, 1_700_000_000_123, [(5, b"k", b"v"), (6, None, b"w")]),
                       (7, 2, 1_700_000_000_125, [(7, b"x", None)])]


def test_a_produce_request_plans_its_appends_and_refusals_exactly():
    good = batch([(b"k", b"v")])
    body = produce_request(-1, [("orders", [(0, good), (5, good)]), ("nope", [(0, good)])])
    plan = produce_plan(body, {"orders": 2})
    assert plan.acks == -1
    assert plan.records == {"orders": [{"key": b"k", "value": b"v", "partition": 0}]}
    assert plan.partitions == {"orders": [0]}
    assert {k: v[0] for k, v in plan.errors.items()} == {("orders", 5): "UNKNOWN_TOPIC_OR_PARTITION",
                                                         ("nope", 0): "UNKNOWN_TOPIC_OR_PARTITION"}
    bad_acks = produce_plan(produce_request(2, [("orders", [(0, good)])]), {"orders": 2})
    assert bad_acks.records == {} and bad_acks.errors[("orders", 0)][0] == "INVALID_REQUIRED_ACKS"


def test_a_produce_answer_waits_for_a_final_result():
    assert result_of([]) is None
    assert result_of([{"status": "pending", "error_code": None, "base_offset": 4}]) is None
    assert result_of([{"status": "throttled", "error_code": None, "base_offset": None}]) is None
    assert result_of([{"status": "acked", "error_code": None, "base_offset": 4}]) == (None, 4)
    assert result_of([{"status": "error", "error_code": "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "base_offset": 4}]) == \
        ("NOT_ENOUGH_REPLICAS_AFTER_APPEND", 4)


def test_the_produce_response_gives_each_partition_its_offset_or_error():
    good = batch([(b"k", b"v")])
    body = produce_request(-1, [("orders", [(0, good), (1, good), (2, good), (9, good)])])
    plan = ProducePlan(-1, partitions={"orders": [0, 1, 2]},
                       errors={("orders", 9): ("UNKNOWN_TOPIC_OR_PARTITION", "no partition 9 of topic 'orders'")})
    answers = {("orders", 0): (None, 41), ("orders", 1): ("NOT_ENOUGH_REPLICAS_AFTER_APPEND", 3)}
    response = produce_response(9, body, plan, answers, {("orders", 0): 0, ("orders", 1): 2})

    def part(index, code, base, start, message=None):
        return produce_resp.PartitionProduceResponse(index=i32(index), error_code=code, base_offset=i64(base),
                                                     log_append_time=None, log_start_offset=i64(start),
                                                     record_errors=(), error_message=message)
    assert response.responses == (produce_resp.TopicProduceResponse(name="orders", partition_responses=(
        part(0, ErrorCode.none, 41, 0),
        part(1, ErrorCode.not_enough_replicas_after_append, -1, 2),
        part(2, ErrorCode.request_timed_out, -1, -1, "the records were not answered within the request's timeout"),
        part(9, ErrorCode.unknown_topic_or_partition, -1, -1, "no partition 9 of topic 'orders'"))),)


def fetch_request(parts, max_bytes=1 << 20):
    return fetch_req.FetchRequest(
        max_wait=i32Timedelta.parse(timedelta(milliseconds=10)), min_bytes=i32(1), max_bytes=i32(max_bytes),
        topics=tuple(fetch_req.FetchTopic(topic=t, partitions=tuple(
            fetch_req.FetchPartition(partition=i32(p), current_leader_epoch=i32(e), fetch_offset=i64(o),
                                     partition_max_bytes=i32(1 << 20)) for p, o, e in ps)) for t, ps in parts),
        forgotten_topics_data=())


def test_fetch_reads_below_the_hw_and_refuses_what_kafka_refuses():
    rows = {("t", p): {"leader": 0 if p != 4 else -1, "leader_epoch": 2, "log_start_offset": 3,
                       "high_watermark": 10, "log_end_offset": 12} for p in range(6)}
    body = fetch_request([("t", [(0, 5, -1), (1, 10, 2), (2, 2, 2), (3, 13, 2), (4, 5, -1), (5, 5, 1)]),
                          ("u", [(0, 0, -1)])])
    wanted = requested(body)
    ranges, errors = fetch_ranges(wanted, rows)
    assert ranges == {("t", 0): (5, 10, 1 << 20)}  # (1: at the HW, nothing to read yet)
    assert errors == {("t", 2): "OFFSET_OUT_OF_RANGE", ("t", 3): "OFFSET_OUT_OF_RANGE",
                      ("t", 4): "NOT_LEADER_OR_FOLLOWER", ("t", 5): "FENCED_LEADER_EPOCH",
                      ("u", 0): "UNKNOWN_TOPIC_OR_PARTITION"}
    assert fetch_ranges(requested(fetch_request([("t", [(0, 5, 3)])])), rows)[1] == {("t", 0): "UNKNOWN_LEADER_EPOCH"}
    answered = answers(wanted, rows, errors, {("t", 0): b"batches"})
    assert answered[("t", 0)] == Answer(10, 3, 7, None) and answered[("t", 5)] == Answer(-1, -1, 0, "FENCED_LEADER_EPOCH")
    response = fetch_response(12, [w.key for w in wanted], answered, {("t", 0): b"batches"})
    assert response.session_id == 0 and response.error_code == ErrorCode.none
    t = {int(p.partition_index): p for p in response.responses[0].partitions}
    assert (t[0].error_code, t[0].high_watermark, t[0].last_stable_offset, t[0].log_start_offset, t[0].records) == \
        (ErrorCode.none, 10, 10, 3, b"batches")
    assert (t[1].error_code, t[1].high_watermark, t[1].records) == (ErrorCode.none, 10, b"")
    assert t[5].error_code == ErrorCode.fenced_leader_epoch and t[5].high_watermark == -1
    assert response.responses[1].partitions[0].error_code == ErrorCode.unknown_topic_or_partition
    # a session's error: the top-level code, no session, no partitions
    refused = fetch_response(12, [], {}, {}, error="FETCH_SESSION_ID_NOT_FOUND")
    assert (refused.error_code, refused.session_id, refused.responses) == (ErrorCode.fetch_session_id_not_found, 0, ())
    # v4 has no session id: the same answer without it
    assert fetch_response(4, [("t", 0)], answered, {}).responses[0].partitions[0].high_watermark == 10


def test_create_topics_takes_defaults_and_refuses_duplicates_and_manual_assignments():
    def topic(name, partitions=-1, rf=-1, assignments=(), configs=()):
        return ct_req.CreatableTopic(name=name, num_partitions=i32(partitions), replication_factor=i16(rf),
                                     assignments=assignments, configs=configs)
    body = ct_req.CreateTopicsRequest(topics=(
        topic("a", configs=(ct_req.CreatableTopicConfig(name="retention.ms", value="1000"),)), topic("b", 4, 3),
        topic("dup"), topic("dup"),
        topic("manual", assignments=(ct_req.CreatableReplicaAssignment(partition_index=i32(0), broker_ids=(i32(1),)),))),
        timeout=i32Timedelta.parse(timedelta(seconds=5)))
    asked = topics_asked(body)
    assert [(t.name, t.partitions, t.replication_factor, t.config, t.error and t.error[0]) for t in asked] == [
        ("a", 1, 1, {"retention.ms": "1000"}, None), ("b", 4, 3, {}, None), ("dup", 1, 1, {}, "INVALID_REQUEST"),
        ("dup", 1, 1, {}, "INVALID_REQUEST"), ("manual", 1, 1, {}, "INVALID_REQUEST")]
    response = create_topics_response(7, asked, {"a": None, "b": ("INVALID_REPLICATION_FACTOR", "too many")})
    assert [(t.name, t.error_code, t.error_message, t.num_partitions, t.replication_factor) for t in response.topics] == [
        ("a", ErrorCode.none, None, 1, 1), ("b", ErrorCode.invalid_replication_factor, "too many", -1, -1),
        ("dup", ErrorCode.invalid_request, "topic 'dup' is named more than once in the request", -1, -1),
        ("manual", ErrorCode.invalid_request, asked[4].error[1], -1, -1)]


def test_producer_id_blocks_never_overlap(new_cluster):
    cluster = new_cluster(brokers=1)
    first, second = cluster.producer_id_block(), cluster.producer_id_block()
    assert len(first) == len(second) == 1000 and first[0] > 0
    assert not set(first) & set(second)


def _committed(cluster, topic):
    return [(r["partition"], r["offset"], r["key"], r["value"])
            for r in cluster.read(topic).orderBy("partition", "offset").collect()]


def consumed(consumer, topic, partitions, count):
    """The first `count` messages a kafka-python consumer assigned `partitions` of `topic` reads from
    their beginning (fewer if its consumer_timeout_ms passes first)."""
    from kafka import TopicPartition
    consumer.assign([TopicPartition(topic, p) for p in partitions])
    consumer.seek_to_beginning()
    got = []
    for message in consumer:
        got.append(message)
        if len(got) == count:
            break
    return got


def test_kafka_python_produces_idempotently_with_acks_all_and_consumes_it_back(new_cluster):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    cluster = new_cluster(brokers=3)
    server = serve(cluster, port=0, run_rounds=True, round_interval_ms=200)
    address = f"127.0.0.1:{server.port}"
    try:
        admin = KafkaAdminClient(bootstrap_servers=address, request_timeout_ms=120_000)
        try:
            admin.create_topics([NewTopic("orders", num_partitions=2, replication_factor=3,
                                          topic_configs={"min.insync.replicas": "2"})])
        finally:
            admin.close()
        assert cluster.describe("orders").count() == 2
        producer = KafkaProducer(bootstrap_servers=address, acks="all", enable_idempotence=True,
                                 request_timeout_ms=60_000, delivery_timeout_ms=240_000, max_block_ms=120_000,
                                 linger_ms=5)
        try:
            futures = [producer.send("orders", key=f"k{n % 3}".encode(), value=f"v{n}".encode()) for n in range(12)]
            sent = [f.get(timeout=180) for f in futures]
        finally:
            producer.close()
        committed = _committed(cluster, "orders")
        assert sorted((m.partition, m.offset) for m in sent) == [(p, o) for p, o, _, _ in committed]
        assert sorted(v for _, _, _, v in committed) == sorted(f"v{n}".encode() for n in range(12))
        # the producer's idempotence reached the log: its records carry one producer id
        ids = {r["producer_id"] for r in cluster.read("orders", isolation="read_uncommitted")
               .join(cluster.spark.read.format("delta").load(cluster.storage.log_path(0)).select(
                   "partition", "offset", "producer_id"), ["partition", "offset"]).collect()}
        assert len(ids) == 1 and None not in ids

        consumer = KafkaConsumer(bootstrap_servers=address, request_timeout_ms=120_000, fetch_max_wait_ms=100,
                                 enable_auto_commit=False, consumer_timeout_ms=60_000)
        try:
            got = [(m.partition, m.offset, m.key, m.value) for m in consumed(consumer, "orders", [0, 1], len(committed))]
            assert sorted(got) == committed
            # a record produced while the consumer polls in its sessions reaches it incrementally
            with server.handler.lock:
                cluster.produce("orders", [{"partition": 1, "value": b"late"}])
            late = next(iter(consumer))
        finally:
            consumer.close()
        latest = _committed(cluster, "orders")
        assert (late.partition, late.offset, late.value) == latest[-1][:2] + (b"late",)
        # kafka-python opened a KIP-227 session with each leader and went on incrementally in them
        kinds = server.handler.fetch_kinds
        assert kinds["full"] >= 1 and kinds["incremental"] > kinds["full"] and kinds["error"] == 0, kinds
    finally:
        server.shutdown()


def test_librdkafka_produces_idempotently_and_consumes_in_order(new_cluster):
    from confluent_kafka import Consumer, Producer, TopicPartition

    cluster = new_cluster(brokers=3)
    cluster.create_topic("events", partitions=1, replication_factor=3)
    server = serve(cluster, port=0, run_rounds=True, round_interval_ms=200)
    address = f"127.0.0.1:{server.port}"
    try:
        delivered, errors = [], []
        producer = Producer({"bootstrap.servers": address, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 5, "message.timeout.ms": 180_000, "request.timeout.ms": 120_000})
        for n in range(20):
            producer.produce("events", key=b"k", value=f"e{n}".encode(),
                             on_delivery=lambda err, msg: (errors if err else delivered).append(err or msg.offset()))
        assert producer.flush(240) == 0
        assert errors == [] and sorted(delivered) == list(range(20))
        committed = _committed(cluster, "events")
        assert [v for _, _, _, v in committed] == [f"e{n}".encode() for n in range(20)]

        consumer = Consumer({"bootstrap.servers": address, "group.id": "readers", "enable.auto.commit": False,
                             "fetch.wait.max.ms": 100})
        try:
            consumer.assign([TopicPartition("events", 0, 0)])
            got = []
            while len(got) < 20:
                message = consumer.poll(60)
                assert message is not None and message.error() is None
                got.append((message.partition(), message.offset(), message.key(), message.value()))
        finally:
            consumer.close()
        assert got == committed
        assert set(server.handler.fetch_kinds) == {"sessionless"}  # (librdkafka sends epoch -1: no sessions)
    finally:
        server.shutdown()


def test_acks_0_gets_no_response_and_a_request_no_round_answers_times_out(new_cluster):
    import socket

    from kio.index import load_response_schema
    from kio.serial import entity_reader

    from tests.test_wire_protocol import _read_frame, api_versions, frame

    cluster = new_cluster(brokers=1)
    cluster.create_topic("t")
    server = serve(cluster, port=0)  # no rounds: nothing answers an acks=-1 request
    try:
        def produce(acks, correlation_id, value, timeout_ms, partition=0):
            return frame(0, 9, correlation_id, transactional_id=None, acks=i16(acks),
                         timeout=i32Timedelta.parse(timedelta(milliseconds=timeout_ms)),
                         topic_data=(produce_req.TopicProduceData(name="t", partition_data=(
                             produce_req.PartitionProduceData(index=i32(partition), records=batch([(None, value)])),)),))

        with socket.create_connection(("127.0.0.1", server.port), timeout=120) as conn:
            conn.sendall(produce(0, 1, b"fire and forget", 30_000) + frame(18, 3, 2, client_software_name="t",
                                                                           client_software_version="1"))
            correlation_id, body = api_versions(_read_frame(conn), 3)
            assert correlation_id == 2 and body.error_code == ErrorCode.none  # (nothing came for request 1)
            conn.sendall(produce(-1, 3, b"waits", 300))
            payload = _read_frame(conn)
        with socket.create_connection(("127.0.0.1", server.port), timeout=120) as conn:
            # acks=0 with an error: no response to carry it, so the connection is closed (Kafka's KafkaApis)
            conn.sendall(produce(0, 4, b"nowhere", 30_000, partition=7))
            assert _read_frame(conn) == b""
        schema = load_response_schema(0, 9)
        header, offset = entity_reader(schema.__header_schema__)(payload, 0)
        response, _ = entity_reader(schema)(payload, offset)
        assert header.correlation_id == 3
        answer = response.responses[0].partition_responses[0]
        assert (answer.error_code, answer.base_offset) == (ErrorCode.request_timed_out, -1)
        cluster.run_round()  # both were in the inbox: a timed-out request may still be appended, as in Kafka
        assert [r["value"] for r in cluster.read("t").orderBy("offset").collect()] == [b"fire and forget", b"waits"]
        # (the refused acks=0 request wrote nothing)
    finally:
        server.shutdown()


def test_init_producer_id_gives_idempotent_producers_an_id_and_transactions_not_coordinator():
    from kio.schema.init_producer_id.v4 import request as q

    from pipeline.wire.produce import init_producer_id_response

    def ask(transactional_id):
        return q.InitProducerIdRequest(transactional_id=transactional_id,
                                       transaction_timeout=i32Timedelta.parse(timedelta(seconds=60)))
    granted = init_producer_id_response(4, ask(None), 5001)
    assert (granted.error_code, granted.producer_id, granted.producer_epoch) == (ErrorCode.none, 5001, 0)
    refused = init_producer_id_response(4, ask("tx-1"), None)
    assert (refused.error_code, refused.producer_id, refused.producer_epoch) == (ErrorCode.not_coordinator, -1, -1)
