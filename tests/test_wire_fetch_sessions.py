"""KIP-227 fetch sessions at the front door (pipeline/wire/fetch_sessions.py, issue 51): the
session's partitions and what a response carries, with exact expected values after Kafka's
FetchSession.scala; the door's cache through a request's life (epochs, errors, slots, eviction); and
a real cluster's door answering raw incremental requests and a kafka-python consumer's session."""

from datetime import timedelta

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v6 import request as fetch_v6
from kio.schema.fetch.v12 import request as fetch_req
from kio.static.primitive import i32, i32Timedelta, i64

from pipeline.control.session_cache import EVICTION_MS
from pipeline.wire.fetch_sessions import (UNKNOWN, Answer, DoorSessions, Wanted, forgotten, request_metadata,
                                          requested, respond, update_session)


def request(parts=(), session_id=0, epoch=0, forget=(), max_wait_ms=10, version=12, max_bytes=1 << 20):
    """A Fetch request: parts [(topic, partition, fetch_offset)], forget [(topic, [partitions])]."""
    module = fetch_req if version >= 7 else fetch_v6
    topics = {}
    for t, p, o in parts:
        topics.setdefault(t, []).append(module.FetchPartition(
            partition=i32(p), fetch_offset=i64(o), partition_max_bytes=i32(1000),
            **({"current_leader_epoch": i32(-1)} if version >= 9 else {})))
    extra = {} if version < 7 else {
        "session_id": i32(session_id), "session_epoch": i32(epoch),
        "forgotten_topics_data": tuple(fetch_req.ForgottenTopic(topic=t, partitions=tuple(i32(p) for p in ps))
                                       for t, ps in forget)}
    return module.FetchRequest(max_wait=i32Timedelta.parse(timedelta(milliseconds=max_wait_ms)), min_bytes=i32(1),
                               max_bytes=i32(max_bytes),
                               topics=tuple(module.FetchTopic(topic=t, partitions=tuple(ps)) for t, ps in topics.items()),
                               **extra)


def w(topic, partition, offset, hw=UNKNOWN, lso=UNKNOWN, max_bytes=1000):
    return Wanted(topic, partition, offset, max_bytes, -1, hw, lso)


# -- the session's partitions and the response -------------------------------------------------


def test_a_request_names_its_session_partitions_and_forgotten_ones():
    body = request([("a", 0, 5), ("b", 1, 7)], session_id=42, epoch=3, forget=[("c", [0, 2])])
    assert request_metadata(12, body) == (42, 3)
    assert requested(body) == [w("a", 0, 5), w("b", 1, 7)]
    assert forgotten(12, body) == [("c", 0), ("c", 2)]
    v6 = request([("a", 0, 5)], version=6)  # before sessions: sessionless, nothing to forget
    assert request_metadata(6, v6) == (0, -1) and forgotten(6, v6) == []


def test_an_incremental_request_updates_in_place_adds_last_and_forgets():
    parts = (w("a", 0, 5, hw=9, lso=0), w("a", 1, 2, hw=4, lso=1), w("b", 0, 0, hw=0, lso=0))
    after, added, updated, removed = update_session(
        parts, [w("a", 1, 4, max_bytes=50), w("c", 0, 3)], [("b", 0), ("z", 9)])
    # a-1 keeps its place and what was last sent, and takes the new offset and bytes; c-0 is new;
    # b-0 leaves (z-9 was never in the session)
    assert after == (w("a", 0, 5, hw=9, lso=0), w("a", 1, 4, hw=4, lso=1, max_bytes=50), w("c", 0, 3))
    assert (added, updated, removed) == ([("c", 0)], [("a", 1)], [("b", 0)])


def test_a_full_response_carries_every_partition_and_caches_what_it_sent():
    parts = (w("a", 0, 5), w("a", 1, 2))
    carried, after = respond("full", parts, {("a", 0): Answer(9, 0, 120), ("a", 1): Answer(-1, -1, 0, "FENCED_LEADER_EPOCH")})
    assert carried == [("a", 0), ("a", 1)]
    assert after == (w("a", 0, 5, hw=9, lso=0), w("a", 1, 2, hw=-1, lso=-1))


def test_an_incremental_response_carries_what_changed_and_rotates_partitions_with_records():
    parts = (w("t", 0, 9, hw=9, lso=0), w("t", 1, 4, hw=6, lso=0), w("t", 2, 3, hw=3, lso=0),
             w("t", 3, 5, hw=5, lso=0), w("t", 4, 1, hw=1, lso=0))
    carried, after = respond("incremental", parts, {
        ("t", 0): Answer(9, 0),  # nothing new: left out
        ("t", 1): Answer(6, 0, 80),  # records: carried, moves to the end
        ("t", 2): Answer(3, 2),  # a new log start offset
        ("t", 3): Answer(-1, -1, 0, "NOT_LEADER_OR_FOLLOWER"),  # an error: carried, cached HW -1
        ("t", 4): Answer(2, 0)})  # a new HW without records for this fetch offset
    assert carried == [("t", 1), ("t", 2), ("t", 3), ("t", 4)]
    assert after == (w("t", 0, 9, hw=9, lso=0), w("t", 2, 3, hw=3, lso=2), w("t", 3, 5, hw=-1, lso=-1),
                     w("t", 4, 1, hw=2, lso=0), w("t", 1, 4, hw=6, lso=0))
    # once the error is gone the partition is sent again (its HW differs from the cached -1)
    again, _ = respond("incremental", after, {k.key: Answer(k.high_watermark, k.log_start_offset) for k in after}
                       | {("t", 3): Answer(5, 0)})
    assert again == [("t", 3)]


# -- the door's cache ----------------------------------------------------------------------------


def open_full(cache, parts, now=0, slots=10, leader=0, session_id=0):
    return cache.open(12, request(parts, session_id=session_id), now, "wire-c", leader, slots)


def test_a_session_opens_on_a_full_request_and_goes_on_incrementally():
    cache = DoorSessions()
    full = open_full(cache, [("t", 0, 0), ("t", 1, 0)])
    assert full.kind == "full" and full.session_id != 0 and full.fetch == (w("t", 0, 0), w("t", 1, 0))
    assert cache.close(full, {("t", 0): Answer(3, 0, 30), ("t", 1): Answer(0, 0)}) == ([("t", 0), ("t", 1)], None)
    (session, parts), = cache.snapshot()
    assert (session.epoch, session.size, session.leader, session.privileged) == (1, 2, 0, False)
    assert parts == (w("t", 0, 0, hw=3, lso=0), w("t", 1, 0, hw=0, lso=0))

    # epoch 1: t-0 moved on (the client sends it), t-1 is served from the cache
    inc = cache.open(12, request([("t", 0, 3)], session_id=full.session_id, epoch=1), 5, "wire-c")
    assert (inc.kind, inc.session_id, inc.fetch) == (
        "incremental", full.session_id, (w("t", 0, 3, hw=3, lso=0), w("t", 1, 0, hw=0, lso=0)))
    assert cache.close(inc, {("t", 0): Answer(3, 0), ("t", 1): Answer(2, 0, 20)}) == ([("t", 1)], None)
    (session, _), = cache.snapshot()
    assert (session.epoch, session.last_used_ms) == (2, 5)

    # the same epoch again (a replayed request) and an id the door never gave
    assert cache.open(12, request(session_id=full.session_id, epoch=1), 6, "wire-c").error == "INVALID_FETCH_SESSION_EPOCH"
    assert cache.open(12, request(session_id=12345, epoch=1), 6, "wire-c").error == "FETCH_SESSION_ID_NOT_FOUND"
    # epoch -1 closes the session it names and is answered without one
    final = cache.open(12, request([("t", 0, 3)], session_id=full.session_id, epoch=-1), 7, "wire-c")
    assert (final.kind, final.session_id) == ("sessionless", 0) and cache.snapshot() == []


def test_a_request_that_forgets_every_partition_closes_its_session():
    cache = DoorSessions()
    full = open_full(cache, [("t", 0, 0)])
    cache.close(full, {("t", 0): Answer(0, 0)})
    closing = cache.open(12, request(session_id=full.session_id, epoch=1, forget=[("t", [0])]), 1, "wire-c")
    assert (closing.kind, closing.session_id, closing.fetch) == ("sessionless", 0, ())
    assert cache.snapshot() == []


def test_a_full_request_reopens_and_old_clients_stay_sessionless():
    cache = DoorSessions()
    first = open_full(cache, [("t", 0, 0)])
    again = open_full(cache, [("t", 0, 4)], session_id=first.session_id)  # epoch 0 naming a session: closed, new one
    assert again.kind == "full" and again.session_id not in (0, first.session_id)
    assert [s.session_id for s, _ in cache.snapshot()] == [again.session_id]
    old = cache.open(6, request([("t", 0, 0)], version=6), 0, "wire-c")
    assert (old.kind, old.session_id) == ("sessionless", 0)


def test_no_room_gives_a_full_response_without_a_session():
    cache = DoorSessions()
    none = open_full(cache, [("t", 0, 0)], slots=0)  # the leader's slots are the followers'
    assert (none.kind, none.session_id) == ("full", 0)
    assert cache.close(none, {("t", 0): Answer(1, 0, 10)}) == ([("t", 0)], None) and cache.snapshot() == []


def test_sessions_are_evicted_in_kafkas_order_per_leader():
    cache = DoorSessions()
    small = open_full(cache, [("t", 0, 0)], now=0)
    cache.close(small, {("t", 0): Answer(0, 0)})
    other_leader = open_full(cache, [("u", 0, 0)], now=0, leader=1, slots=1)
    # one slot at leader 0: a newcomer of 2 partitions cannot evict a session younger than EVICTION_MS
    refused = open_full(cache, [("t", 1, 0), ("t", 2, 0)], now=1000, slots=1)
    assert refused.session_id == 0
    # used again when it had existed past EVICTION_MS: a bigger newcomer evicts it
    inc = cache.open(12, request(session_id=small.session_id, epoch=1), EVICTION_MS + 10, "wire-c")
    cache.close(inc, {("t", 0): Answer(0, 0)})
    bigger = open_full(cache, [("t", 1, 0), ("t", 2, 0)], now=EVICTION_MS + 20, slots=1)
    assert bigger.session_id != 0
    assert {s.session_id for s, _ in cache.snapshot()} == {bigger.session_id, other_leader.session_id}
    # a session unused for more than EVICTION_MS is stale: any newcomer takes its slot
    smaller = open_full(cache, [("t", 3, 0)], now=2 * EVICTION_MS + 30, slots=1)
    assert smaller.session_id != 0 and cache.evictions == 2
    assert {s.session_id for s, _ in cache.snapshot()} == {smaller.session_id, other_leader.session_id}


def test_a_response_whose_session_moved_on_is_an_epoch_error():
    cache = DoorSessions()
    full = open_full(cache, [("t", 0, 0)])
    cache.close(full, {("t", 0): Answer(0, 0)})
    first = cache.open(12, request(session_id=full.session_id, epoch=1), 1, "wire-c")
    open_full(cache, [("t", 0, 0)], session_id=full.session_id)  # the session closed while `first` waited
    assert cache.close(first, {("t", 0): Answer(1, 0, 10)}) == ([], "INVALID_FETCH_SESSION_EPOCH")


# -- a real cluster's door -----------------------------------------------------------------------


def _fetch(conn, correlation_id, **kwargs):
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    from tests.test_wire_protocol import _read_frame, frame

    body = request(**kwargs)
    from dataclasses import fields
    conn.sendall(frame(1, 12, correlation_id, **{f.name: getattr(body, f.name) for f in fields(body)}))
    payload = _read_frame(conn)
    schema = load_response_schema(1, 12)
    header, offset = entity_reader(schema.__header_schema__)(payload, 0)
    assert header.correlation_id == correlation_id
    return entity_reader(schema)(payload, offset)[0]


def _carried(response):
    from kio.records.readers import read_batch

    def offsets(data):
        out, at = [], 0
        while at < len(data):
            batch, size = read_batch(data, at)
            out += [int(r.offset) for r in batch.records]
            at += size
        return out
    return {(t.topic, int(p.partition_index)): (int(p.high_watermark), offsets(p.records))
            for t in response.responses for p in t.partitions}


def test_the_door_serves_a_consumers_session_incrementally(new_cluster):
    import socket

    from pipeline.wire.front_door import serve

    cluster = new_cluster(brokers=1)
    cluster.create_topic("t", partitions=2)
    cluster.produce("t", [{"partition": 0, "value": b"a"}, {"partition": 0, "value": b"b"}])
    cluster.run_round()
    server = serve(cluster, port=0)
    door = server.handler
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=120) as conn:
            full = _fetch(conn, 1, parts=[("t", 0, 0), ("t", 1, 0)])
            sid = int(full.session_id)
            assert sid != 0 and full.error_code == ErrorCode.none
            assert _carried(full) == {("t", 0): (2, [0, 1]), ("t", 1): (0, [])}
            # nothing new: the incremental response carries no partition (t-0 moved to its HW)
            quiet = _fetch(conn, 2, parts=[("t", 0, 2)], session_id=sid, epoch=1)
            assert (int(quiet.session_id), _carried(quiet)) == (sid, {})
            # a record for t-1: only t-1 comes, though the request names no partition
            cluster.produce("t", [{"partition": 1, "value": b"c"}])
            cluster.run_round()
            news = _fetch(conn, 3, session_id=sid, epoch=2)
            assert (int(news.session_id), _carried(news)) == (sid, {("t", 1): (1, [0])})
            # the same epoch again; then a full request at epoch -1 closes the session
            stale = _fetch(conn, 4, session_id=sid, epoch=2)
            assert (stale.error_code, int(stale.session_id), stale.responses) == (
                ErrorCode.invalid_fetch_session_epoch, 0, ())
            last = _fetch(conn, 5, parts=[("t", 1, 1)], session_id=sid, epoch=-1)
            assert (int(last.session_id), _carried(last)) == (0, {("t", 1): (1, [])})
        assert door.fetch_sessions() == [] and door.fetch_kinds == {
            "full": 1, "incremental": 2, "error": 1, "sessionless": 1}
    finally:
        server.shutdown()


def test_the_followers_sessions_keep_their_slots_from_the_doors_consumers(new_cluster):
    import socket

    from pipeline.wire.front_door import serve

    # two brokers, one slot each: broker 1's replica fetcher holds broker 0's only slot
    cluster = new_cluster(brokers=2, config={"max.incremental.fetch.session.cache.slots": 1})
    cluster.create_topic("t", partitions=1, replication_factor=2)
    cluster.run_round()
    assert [(s.leader, s.privileged) for s in __import__("pipeline.round.driver", fromlist=["x"]).round_sessions(
        cluster.core)[0]] == [(0, True)]
    server = serve(cluster, port=0)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=120) as conn:
            full = _fetch(conn, 1, parts=[("t", 0, 0)])
            assert (full.error_code, int(full.session_id)) == (ErrorCode.none, 0)  # answered, without a session
        assert server.handler.fetch_sessions() == []
    finally:
        server.shutdown()


def test_a_fetchs_max_bytes_spans_its_topics_and_the_first_record_always_comes(new_cluster):
    import socket

    from pipeline.wire.front_door import serve

    cluster = new_cluster(brokers=1)
    for topic in ("a", "b"):
        cluster.create_topic(topic)
        cluster.produce(topic, [{"value": bytes(100)} for _ in range(3)])  # 112 bytes a record, as counted
    cluster.run_round()
    server = serve(cluster, port=0)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=120) as conn:
            # 150 bytes: a-0 gets its first record (and no second); b-0 none, in the same response
            tight = _fetch(conn, 1, parts=[("a", 0, 0), ("b", 0, 0)], epoch=-1, max_bytes=150)
            assert _carried(tight) == {("a", 0): (3, [0]), ("b", 0): (3, [])}
            # 10 bytes: still the first record of the first partition with any (KIP-74)
            assert _carried(_fetch(conn, 2, parts=[("b", 0, 1), ("a", 0, 0)], epoch=-1, max_bytes=10)) == {
                ("b", 0): (3, [1]), ("a", 0): (3, [])}
            assert _carried(_fetch(conn, 3, parts=[("a", 0, 0), ("b", 0, 0)], epoch=-1, max_bytes=1000)) == {
                ("a", 0): (3, [0, 1, 2]), ("b", 0): (3, [0, 1, 2])}
    finally:
        server.shutdown()
