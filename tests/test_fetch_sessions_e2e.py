"""KIP-227 through rounds on real Delta tables: what incremental requests and responses carry
against full fetches, the session cache in replog.fetch_sessions and the metrics, eviction,
FETCH_SESSION_ID_NOT_FOUND and INVALID_FETCH_SESSION_EPOCH (a replayed request) with the fall back
to full fetches, and the response limit's rotation. Every scenario ends with each replica holding
each record once."""

import json

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock
from pipeline.errors import ErrorCode
from tests.helpers import advance_rounds


def logs_by_replica(cluster, topic):
    """{broker: sorted [(partition, offset, value)]} of every replica's log."""
    out = {}
    for b in cluster.brokers:
        rows = cluster.storage.read_log(b).filter(F.col("topic") == topic).select("partition", "offset", "value").collect()
        out[b] = sorted((r["partition"], r["offset"], bytes(r["value"])) for r in rows)
    return out


def assert_replicated_once(cluster, topic, values):
    """Every replica holds each produced value exactly once, at the same offset as the leader."""
    logs = logs_by_replica(cluster, topic)
    replicas = {r["partition"]: r["replicas"] for r in cluster.describe(topic).collect()}
    for partition, brokers in replicas.items():
        per_broker = [[row for row in logs[b] if row[0] == partition] for b in brokers]
        assert all(rows == per_broker[0] for rows in per_broker), partition
        assert [o for _, o, _ in per_broker[0]] == list(range(len(per_broker[0])))
    held = sorted(v for p, brokers in replicas.items() for q, _, v in logs[brokers[0]] if q == p and v in values)
    assert held == sorted(values)


def owners(cluster):
    return {(s["leader"], s["fetcher"]) for s in cluster.fetch_sessions().collect()}


def counts(report):
    return report.fetch_request_partitions, report.fetch_response_partitions


@pytest.fixture
def clock():
    return ManualClock(start_ms=0)


def test_incremental_rounds_carry_only_what_changed_and_full_rounds_carry_everything(spark, tmp_path, clock):
    reports, clusters = {}, {}
    for mode, n in (("full", 2), ("incremental", 3)):  # the views follow the last cluster created
        cluster = Cluster.create(spark, str(tmp_path / mode), brokers=3, clock=clock,
                                 config={"replication.fetch.mode": mode})
        cluster.create_topic("t", partitions=8, replication_factor=3)
        first = advance_rounds(cluster, clock, 1)
        cluster.produce("t", [{"value": f"a{p}", "partition": p} for p in (1, 6)], acks="all")
        reports[mode] = first + advance_rounds(cluster, clock, n)
        assert_replicated_once(cluster, "t", [b"a1", b"a6"])
        assert cluster.read("t").count() == 2
        clusters[mode] = cluster
    # 8 partitions x 2 followers = 16 follower fetches a round, every round; in round 2 the four
    # followers that received records fetch again at once (a full request again: the 3 partitions
    # each fetches from that leader), so 4 x 3 more
    assert [counts(r) for r in reports["full"]] == [(16, 16), (16 + 12, 16 + 12), (16, 16)]
    # round 1 opens the sessions (full); round 2: records for 2 partitions x 2 followers, then their
    # follow-up fetches carry the new fetch offsets and the responses the HW that answers them;
    # then nothing changes: idle
    assert [counts(r) for r in reports["incremental"]] == [(16, 16), (0 + 4, 4 + 4), (0, 0), (0, 0)]
    assert reports["incremental"][-1].active_partitions == 0

    cluster = clusters["incremental"]
    sessions = cluster.fetch_sessions().collect()
    # each of the 3 leaders caches one privileged session per follower broker
    assert sorted((s["leader"], s["fetcher"], s["privileged"]) for s in sessions) == [
        (0, "replica-1", True), (0, "replica-2", True), (1, "replica-0", True), (1, "replica-2", True),
        (2, "replica-0", True), (2, "replica-1", True)]
    assert sum(s["partitions"] for s in sessions) == 16
    # opened at t=2000 (epoch 1; the full-mode cluster ran first), then three incremental fetches
    # 500 ms apart: the leader expects epoch 4; the four followers' follow-up fetches at t=2500
    # (partitions 1 and 6 have leaders 1 and 0) each used one more epoch of their sessions
    followed = {(0, "replica-1"), (0, "replica-2"), (1, "replica-0"), (1, "replica-2")}
    assert {(s["leader"], s["fetcher"], s["epoch"], s["created_ms"], s["last_used_ms"]) for s in sessions} == {
        (s["leader"], s["fetcher"], 5 if (s["leader"], s["fetcher"]) in followed else 4, 2000, 3500)
        for s in sessions}
    assert len({s["session_id"] for s in sessions}) == 6 and 0 not in {s["session_id"] for s in sessions}
    metrics = {r["name"]: r["value"] for r in spark.sql(  # the view keeps every round's: the newest, cluster-wide
        "SELECT * FROM replog.metrics WHERE broker IS NULL AND round_id = (SELECT max(round_id) FROM replog.rounds)")
        .collect()}
    assert (metrics["NumIncrementalFetchSessions"], metrics["NumIncrementalFetchPartitionsCached"],
            metrics["IncrementalFetchSessionEvictionsPerSec"]) == (6.0, 16.0, 0.0)
    assert spark.sql("SELECT count(*) AS n FROM replog.fetch_sessions").first()["n"] == 6
    # the leaders' cached partitions sit in the follower rows of replica_state: the HW last sent
    cached = cluster.storage.replica_state().filter("session_id != 0")
    assert cached.count() == 16 and cached.select("session_id").distinct().count() == 6
    assert {(r["partition"], r["session_high_watermark"]) for r in cached.collect()} == \
        {(p, 1 if p in (1, 6) else 0) for p in range(8)}


def test_eviction_of_a_stale_session_and_fetch_session_id_not_found_lose_nothing(spark, tmp_path, clock):
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=3, clock=clock,
                             config={"max.incremental.fetch.session.cache.slots": 1})
    cluster.create_topic("t", partitions=3, replication_factor=3)
    advance_rounds(cluster, clock, 1)  # t = 500: every session opened
    # one slot per leader: the first fetcher by name gets it, the other fetches in full every round
    assert owners(cluster) == {(0, "replica-1"), (1, "replica-0"), (2, "replica-0")}
    cluster.pause_fetcher(1)  # replica-1 stops using its session on leader 0
    values = [f"v{p}".encode() for p in range(3)]
    cluster.produce("t", [{"value": v, "partition": p} for p, v in enumerate(values)], acks=1)
    report = advance_rounds(cluster, clock, 1, step=120_001)[0]  # t = 120501: stale; replica-2's full fetch evicts it
    assert report.fetch_session_evictions >= 1 and (0, "replica-2") in owners(cluster)
    assert (0, "replica-1") not in owners(cluster)
    cluster.resume_fetcher(1)
    advance_rounds(cluster, clock, 1)
    # (sessions older than 120 s may also be evicted by an equal-sized newcomer, depending on the
    # sign of their random ids, as in Kafka: the assertions do not depend on it)
    errors = {(c.fetcher, c.leader): c.error_code for c in cluster.fetch_requests() if c.kind == "error"}
    assert errors[("replica-1", 0)] == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    advance_rounds(cluster, clock, 1)
    retry = [c for c in cluster.fetch_requests() if (c.fetcher, c.leader) == ("replica-1", 0)]
    assert [(c.kind, c.session_id) for c in retry] == [("full", 0)]  # no room: a full fetch, no session
    advance_rounds(cluster, clock, 2)
    assert_replicated_once(cluster, "t", values)
    assert {tuple(r["isr"]) for r in cluster.describe("t").collect()} == {(0, 1, 2), (1, 2, 0), (2, 0, 1)}


def test_fifty_partitions_with_data_and_a_limit_that_fits_ten_are_served_ten_a_fetch_two_fetches_a_round(
        spark, tmp_path, clock):
    size = 21 + 10  # record overhead + a 10-byte value
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=2, clock=clock,
                             config={"replica.fetch.response.max.bytes": 10 * size})
    cluster.create_topic("t", partitions=100, replication_factor=2)
    led_by_0 = sorted(r["partition"] for r in cluster.describe("t").collect() if r["leader"] == 0)[:50]
    cluster.produce("t", [{"value": f"{p:010d}", "partition": p} for p in led_by_0], acks=1)
    # each round: the fetch takes ten, and the follow-up (the pair received records) ten more
    replicated = [r.records_replicated for r in advance_rounds(cluster, clock, 4)]
    assert replicated == [20, 20, 10, 0]
    assert_replicated_once(cluster, "t", [f"{p:010d}".encode() for p in led_by_0])


def test_partitions_that_returned_records_go_to_the_back_so_none_starves(spark, tmp_path, clock):
    size = 21 + 10
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=2, clock=clock,
                             config={"replica.fetch.response.max.bytes": 10 * size})
    cluster.create_topic("t", partitions=80, replication_factor=2)
    led = sorted(r["partition"] for r in cluster.describe("t").collect() if r["leader"] == 0)
    busy, quiet = led[:10], led[10:40]
    cluster.produce("t", [{"value": f"q{p:09d}", "partition": p} for p in quiet], acks=1)
    for i in range(2):
        # the first ten partitions (by number) get a new record every round
        cluster.produce("t", [{"value": f"b{i}{p:08d}", "partition": p} for p in busy], acks=1)
        advance_rounds(cluster, clock, 1)
    follower_leo = {r["partition"]: r["log_end_offset"] for r in cluster.replicas("t").collect()
                    if not r["is_leader"] and r["partition"] in quiet}
    # round 1: the fetch served the busy partitions, its follow-up the first ten quiet ones; round
    # 2: the fetch served the next ten quiet ones and the follow-up the last ten, all ahead of the
    # busy ones, which had returned records (in partition order, the busy ones would go first
    # again and the last ten quiet ones wait)
    assert follower_leo == {p: 1 for p in quiet}


def _replay_last_request(cluster, fetcher, leader):
    """Rolls `fetcher`'s handle for `leader` back one epoch in the newest rounds row, as if its
    last request were sent again (a response lost on the way back): the leader has moved on."""
    last = cluster.storage.read("rounds").orderBy(F.col("round_id").desc()).first()
    data = json.loads(last["fetch_sessions"])
    (handle,) = [h for h in data["handles"] if (h["fetcher"], h["leader"]) == (fetcher, leader)]
    handle["epoch"] -= 1
    DeltaTable.forPath(cluster.spark, cluster.storage.path("rounds")).update(
        F.col("round_id") == last["round_id"], {"fetch_sessions": F.lit(json.dumps(data))})
    return handle["session_id"]


def test_a_replayed_fetch_gets_invalid_fetch_session_epoch_and_a_new_session_loses_nothing(spark, tmp_path, clock):
    root = str(tmp_path / "c")
    cluster = Cluster.create(spark, root, brokers=3, clock=clock)
    cluster.create_topic("t", partitions=3, replication_factor=3)  # leaders 0, 1, 2
    cluster.produce("t", [{"value": "a", "partition": 0}], acks="all")
    advance_rounds(cluster, clock, 3)  # sessions opened, then incremental
    old_id = _replay_last_request(cluster, "replica-1", 0)
    cluster = Cluster.open(spark, root, clock=clock)
    cluster.produce("t", [{"value": "b", "partition": 0}, {"value": "c", "partition": 1}], acks="all")
    first = advance_rounds(cluster, clock, 1)[0]
    pairs = {(c.fetcher, c.leader): c for c in cluster.fetch_requests()}
    assert (pairs[("replica-1", 0)].kind, pairs[("replica-1", 0)].error_code, pairs[("replica-1", 0)].session_id) == \
        ("error", ErrorCode.INVALID_FETCH_SESSION_EPOCH, old_id)
    assert {c.kind for k, c in pairs.items() if k != ("replica-1", 0)} == {"incremental"}
    # the errored fetch carried nothing: partition 0's HW waits for replica-1 (in the ISR)
    assert {r["partition"]: r["high_watermark"] for r in cluster.describe("t").collect()}[0] == 1
    assert first.records_replicated == 3  # b to replica-2; c to both of partition 1's followers
    advance_rounds(cluster, clock, 1)
    retry = {(c.fetcher, c.leader): c for c in cluster.fetch_requests()}
    # the fetcher fell back to a full fetch that opened a new session (the old one is closed)
    assert retry[("replica-1", 0)].kind == "full"
    assert retry[("replica-1", 0)].session_id not in (0, old_id)
    sessions_of_0 = {s["fetcher"]: s["session_id"] for s in cluster.fetch_sessions().collect() if s["leader"] == 0}
    assert sessions_of_0["replica-1"] == retry[("replica-1", 0)].session_id
    advance_rounds(cluster, clock, 2)
    assert {c.kind for c in cluster.fetch_requests()} == {"incremental"}
    assert_replicated_once(cluster, "t", [b"a", b"b", b"c"])
    assert sorted((r["partition"], r["high_watermark"]) for r in cluster.describe("t").collect()) == \
        [(0, 2), (1, 1), (2, 0)]
    assert set(r["status"] for r in cluster.produce_results().collect()) == {"acked"}


def test_the_follow_up_fetch_carries_what_the_first_response_had_no_room_for_and_the_hw_moves_over_the_first(
        spark, tmp_path, clock):
    size = 21 + 10
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=2, clock=clock,
                             config={"replica.fetch.response.max.bytes": 5 * size})
    cluster.create_topic("t", partitions=4, replication_factor=2)
    first = advance_rounds(cluster, clock, 2)[-1]  # sessions opened: the second round's fetches are incremental
    a, b = sorted(r["partition"] for r in cluster.describe("t").collect() if r["leader"] == 0)[:2]
    # a's records in two requests (two record batches: a response takes whole batches), b's in one
    request = cluster.produce("t", [{"value": f"{p}{i:09d}", "partition": p} for p in (a, b) for i in range(5)],
                              acks="all")
    cluster.produce("t", [{"value": f"{a}{i:09d}", "partition": a} for i in range(5, 7)], acks="all")
    one = advance_rounds(cluster, clock, 1)[0]
    # the fetch takes five of a's seven records (the response's limit); the follow-up fetch, at a's
    # new offset 5, moves a's HW to 5 and carries b's five records, ahead of a's last two (a
    # returned records, so it goes to the back); b's HW waits for the follower's next fetch
    assert one.records_replicated == 10
    follower = {r["partition"]: (r["log_end_offset"], r["high_watermark"])
                for r in cluster.replicas("t").collect() if not r["is_leader"] and r["partition"] in (a, b)}
    assert follower == {a: (5, 5), b: (5, 0)}
    assert {r["partition"]: r["high_watermark"] for r in cluster.describe("t").collect() if r["partition"] in (a, b)} \
        == {a: 5, b: 0}
    assert cluster.read("t").filter(F.col("partition").isin(a, b)).count() == 5  # committed: a's first five
    statuses = {r["partition"]: r["status"] for r in cluster.produce_results().filter(F.col("request_id") == request)
                .collect()}
    assert statuses == {a: "acked", b: "pending"}  # b's records wait for its HW
    # the fetch's incremental request carries no partition (nothing changed on the follower) and
    # its response a (records); the follow-up's request a (its fetch offset moved), its response a
    # (the HW moved) and b (records)
    assert counts(first) == (0, 0) and counts(one) == (1, 3)
    two = advance_rounds(cluster, clock, 1)[0]
    assert two.records_replicated == 2
    assert {r["status"] for r in cluster.produce_results().filter(F.col("request_id") == request).collect()} == {"acked"}
    assert {r["partition"]: r["high_watermark"] for r in cluster.describe("t").collect() if r["partition"] in (a, b)} \
        == {a: 7, b: 5}
    assert_replicated_once(cluster, "t", [f"{p}{i:09d}".encode() for p in (a, b) for i in range(5)]
                           + [f"{a}{i:09d}".encode() for i in range(5, 7)])
