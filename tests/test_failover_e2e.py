"""Failover end to end on real Delta tables: a leader crashes, the controller fences it after
broker.session.timeout.ms and elects the next ISR member; the old leader restarts, truncates its
uncommitted suffix by leader epoch (not by HW) and rejoins. Then the last ISR member crashes: its
partition goes offline, unless the topic allows an unclean election, which is recorded with the
offsets it lost. Clocks start at a real epoch time: Kafka's "never caught up" is time 0."""

import shutil

import pytest
from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock
from pipeline.errors import ReplogError
from tests.helpers import advance_round, partition_row, replica_log

EPOCH_MS = 1_700_000_000_000


def _result(cluster, request_id):
    return cluster.produce_results().filter(F.col("request_id") == request_id).first()


def test_leader_crash_clean_election_restart_with_truncation_by_epoch_then_a_lost_disk(spark, tmp_path):
    clock = ManualClock(start_ms=EPOCH_MS)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=3, config={"min.insync.replicas": 2}, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=3)
    committed = cluster.produce("t", [{"value": f"c{i}"} for i in range(3)], acks="all")
    advance_round(cluster, clock), advance_round(cluster, clock)
    assert _result(cluster, committed)["status"] == "acked"
    assert partition_row(cluster, "t")["leader"] == 0

    # the followers stall; the leader takes two acks=1 records only it will ever have, then crashes
    cluster.pause_fetcher(1), cluster.pause_fetcher(2)
    leader_only = cluster.produce("t", [{"value": f"a{i}"} for i in range(2)], acks=1)
    advance_round(cluster, clock)
    cluster.stop_broker(0)
    cluster.resume_fetcher(1), cluster.resume_fetcher(2)
    last_heartbeat = clock.now_ms()

    # not fenced yet: still the leader in the metadata, but it answers nothing
    refused = cluster.produce("t", [{"value": "x"}], acks="all")
    advance_round(cluster, clock)
    p = partition_row(cluster, "t")
    assert (p["leader"], p["leader_epoch"], p["isr"]) == (0, 0, [0, 1, 2])
    assert _result(cluster, refused)["error_code"] == "NOT_LEADER_OR_FOLLOWER"
    assert cluster.broker_states().filter("broker = 0").first()["state"] == "stopped"

    # the session ends 9000 ms after the last heartbeat: fenced, and broker 1 leads epoch 1 from its LEO 3
    clock.advance(last_heartbeat + 9000 - clock.now_ms())
    advance_round(cluster, clock, ms=0)
    assert partition_row(cluster, "t")["leader"] == 0  # 9000 ms is still a valid session
    advance_round(cluster, clock, ms=1)
    p = partition_row(cluster, "t")
    assert (p["leader"], p["leader_epoch"], p["partition_epoch"], p["isr"], p["high_watermark"]) == (1, 1, 1, [1, 2], 3)
    election = cluster.elections().first()
    assert (election["election"], election["previous_leader"], election["leader"], election["leader_epoch"],
            election["start_offset"], election["high_watermark"], election["offsets_lost"]) == ("clean", 0, 1, 1, 3, 3, 0)
    assert cluster.broker_states().filter("broker = 0").first()["state"] == "fenced"
    assert spark.sql("SELECT count(*) AS n FROM replog.elections WHERE leader = 1").first()["n"] == 1
    # a reader that still knows epoch 0 is fenced (KIP-320's currentLeaderEpoch); epoch 1 reads
    with pytest.raises(ReplogError) as stale:
        cluster.read("t", partition=0, leader_epoch=0)
    assert stale.value.code == "FENCED_LEADER_EPOCH"
    with pytest.raises(ReplogError) as ahead:
        cluster.read("t", partition=0, leader_epoch=2)
    assert ahead.value.code == "UNKNOWN_LEADER_EPOCH"
    assert cluster.read("t", partition=0, leader_epoch=1).count() == 3

    # min ISR 2 holds with [1, 2]: the new leader takes and commits acks=all records in epoch 1
    after = cluster.produce("t", [{"value": f"n{i}"} for i in range(2)], acks="all")
    advance_round(cluster, clock), advance_round(cluster, clock)
    assert (_result(cluster, after)["status"], _result(cluster, after)["base_offset"]) == ("acked", 3)

    # the old leader restarts: its epoch-0 records at 3 and 4 diverge from the leader's epoch 1 at 3,
    # so it truncates to 3 (its HW checkpoint would have said the same here; the KIP-101 cases are
    # where it would not) and fetches; it rejoins the ISR once at the HW
    cluster.start_broker(0)
    for _ in range(3):
        advance_round(cluster, clock)
    p = partition_row(cluster, "t")
    assert (p["leader"], p["leader_epoch"], p["isr"], p["high_watermark"]) == (1, 1, [0, 1, 2], 5)
    expected = [(0, 0, "c0"), (1, 0, "c1"), (2, 0, "c2"), (3, 1, "n0"), (4, 1, "n1")]
    assert [replica_log(cluster, "t", b, ("offset", "leader_epoch", "value")) for b in range(3)] == [expected] * 3
    # acks=1 is the leader's word alone: those two records died with it, as in Kafka
    assert _result(cluster, leader_only)["status"] == "acked"
    assert cluster.broker_states().filter("broker = 0").first()["state"] == "running"

    # broker 2 crashes and its log directory is lost; acks=all goes on with [0, 1] once it is fenced
    cluster.stop_broker(2)
    shutil.rmtree(cluster.storage.log_path(2))
    advance_round(cluster, clock, ms=9500)
    assert partition_row(cluster, "t")["isr"] == [0, 1]
    more = cluster.produce("t", [{"value": f"m{i}"} for i in range(2)], acks="all")
    advance_round(cluster, clock), advance_round(cluster, clock)
    assert (_result(cluster, more)["status"], _result(cluster, more)["base_offset"]) == ("acked", 5)

    # it restarts empty, out of the ISR, refetches everything from the log start and rejoins
    cluster.start_broker(2)
    assert cluster.broker_states().filter("broker = 2").first()["log_lost"]
    # its first fetch of the round, from offset 0, takes the whole log; its follow-up fetch, at the
    # HW, is where the leader adds it back (Kafka's expansion at every fetch)
    advance_round(cluster, clock)
    p = partition_row(cluster, "t")
    assert (p["leader"], p["isr"], p["high_watermark"]) == (1, [0, 1, 2], 7)
    expected += [(5, 1, "m0"), (6, 1, "m1")]
    assert [replica_log(cluster, "t", b, ("offset", "leader_epoch", "value")) for b in range(3)] == [expected] * 3
    assert not cluster.broker_states().filter("broker = 2").first()["log_lost"]

    # preferred leader election: broker 0, the first replica, in the ISR again, leads epoch 2; its
    # followers fetch from it in the round that elected it, so an acks=all record it takes in that
    # round commits in it (the HW moves to 8 at once, not a round later)
    cluster.elect_preferred_leaders("t")
    final = cluster.produce("t", [{"value": "f0"}], acks="all")
    advance_round(cluster, clock)
    p = partition_row(cluster, "t")
    assert (p["leader"], p["leader_epoch"], p["isr"], p["high_watermark"]) == (0, 2, [0, 1, 2], 8)
    assert [(r["election"], r["previous_leader"], r["leader"], r["start_offset"]) for r in
            cluster.elections().filter("election = 'preferred'").collect()] == [("preferred", 1, 0, 7)]
    assert (_result(cluster, final)["status"], _result(cluster, final)["base_offset"]) == ("acked", 7)
    expected.append((7, 2, "f0"))
    assert [replica_log(cluster, "t", b, ("offset", "leader_epoch", "value")) for b in range(3)] == [expected] * 3


def test_last_isr_member_crash_offline_unless_unclean_election_is_enabled(spark, tmp_path):
    clock = ManualClock(start_ms=EPOCH_MS)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=2, config={"replica.lag.time.max.ms": 1000},
                             clock=clock)
    cluster.create_topic("safe", partitions=1, replication_factor=2)
    cluster.create_topic("pad", partitions=1, replication_factor=1)  # so that "risky" is led by broker 0 too
    cluster.create_topic("risky", partitions=1, replication_factor=2,
                         config={"unclean.leader.election.enable": "true"})
    assert [partition_row(cluster, t)["leader"] for t in ("safe", "risky")] == [0, 0]
    for topic in ("safe", "risky"):
        cluster.produce(topic, [{"value": f"r{i}"} for i in range(2)], acks="all")
    advance_round(cluster, clock), advance_round(cluster, clock)

    # broker 1 stops fetching and leaves both ISRs; the leader alone commits three more records
    cluster.pause_fetcher(1)
    advance_round(cluster, clock, ms=1500)
    for topic in ("safe", "risky"):
        cluster.produce(topic, [{"value": f"s{i}"} for i in range(3)], acks=1)
    advance_round(cluster, clock)
    assert [(partition_row(cluster, t)["isr"], partition_row(cluster, t)["high_watermark"]) for t in ("safe", "risky")] \
        == [([0], 5), ([0], 5)]

    # the leader crashes and is fenced; broker 1 is alive and fetching again, but out of sync
    cluster.stop_broker(0)
    cluster.resume_fetcher(1)
    report = advance_round(cluster, clock, ms=9500)
    safe, risky = partition_row(cluster, "safe"), partition_row(cluster, "risky")
    # no live ISR member: offline, the ISR keeps its last member (no committed record is elsewhere)
    assert (safe["leader"], safe["leader_epoch"], safe["isr"]) == (-1, 1, [0])
    # unclean: broker 1 leads from its LEO 2, and the 3 committed offsets it lacks are lost, on record
    assert (risky["leader"], risky["leader_epoch"], risky["isr"], risky["high_watermark"]) == (1, 1, [1], 2)
    rows = {r["topic"]: r for r in cluster.elections().collect()}
    assert (rows["safe"]["election"], rows["safe"]["leader"], rows["safe"]["offsets_lost"]) == ("offline", -1, 0)
    assert (rows["risky"]["election"], rows["risky"]["leader"], rows["risky"]["start_offset"],
            rows["risky"]["offsets_lost"]) == ("unclean", 1, 2, 3)
    assert report.offline_partitions == 1
    assert cluster.metrics().filter("name = 'OfflinePartitionsCount'").first()["value"] == 1
    refused = cluster.produce("safe", [{"value": "x"}], acks=1)
    advance_round(cluster, clock)
    assert _result(cluster, refused)["error_code"] == "NOT_LEADER_OR_FOLLOWER"
    admin = cluster.storage.version("admin")
    with pytest.raises(ReplogError, match="LEADER_NOT_AVAILABLE: partition safe-0 has no leader"):
        cluster.delete_records("safe", 0, -1)  # (Kafka's DeleteRecords needs a leader to take it)
    assert cluster.storage.version("admin") == admin

    # broker 0 returns: "safe" is led by it again (epoch 2: fenced, then unfenced); on "risky" it
    # follows broker 1 and truncates its epoch-0 suffix at 2, where broker 1's epoch 1 starts
    cluster.start_broker(0)
    advance_round(cluster, clock), advance_round(cluster, clock)
    safe, risky = partition_row(cluster, "safe"), partition_row(cluster, "risky")
    assert (safe["leader"], safe["leader_epoch"], safe["high_watermark"]) == (0, 2, 5)
    assert (risky["leader"], risky["leader_epoch"]) == (1, 1)
    assert [v for _, _, v in replica_log(cluster, "safe", 0, ("offset", "leader_epoch", "value"))] == ["r0", "r1", "s0", "s1", "s2"]
    assert replica_log(cluster, "risky", 0, ("offset", "leader_epoch", "value")) == [(0, 0, "r0"), (1, 0, "r1")]
    assert replica_log(cluster, "risky", 1, ("offset", "leader_epoch", "value")) == [(0, 0, "r0"), (1, 0, "r1")]
    assert cluster.describe().filter("leader = -1").count() == 0


def test_a_broker_that_crashes_again_while_starting_keeps_its_lost_log_on_record(spark, tmp_path):
    """Found by soak seed 109: a broker stopped again after start_broker, before a round registered
    it. That is a crash like any other; and an empty log it restarted with is still a lost one at
    its next start, so the controller keeps the empty replica out of the ISR until it refetched."""
    clock = ManualClock(start_ms=EPOCH_MS)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=3, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=3, config={"min.insync.replicas": "2"})
    request = cluster.produce("t", [{"value": f"c{i}"} for i in range(3)], acks="all")
    advance_round(cluster, clock)
    assert (_result(cluster, request)["status"], partition_row(cluster, "t")["high_watermark"]) == ("acked", 3)

    def broker_2():
        row = cluster.broker_states().filter("broker = 2").first()
        return row["state"], row["log_lost"]

    # a crash, a lost log directory, a restart (empty), a crash before any round, a restart
    cluster.stop_broker(2)
    shutil.rmtree(cluster.storage.log_path(2))
    cluster.start_broker(2)
    assert broker_2() == ("starting", True)
    cluster.stop_broker(2)
    assert broker_2() == ("stopped", True)
    with pytest.raises(ReplogError, match="BROKER_NOT_AVAILABLE: broker 2 is not running"):
        cluster.stop_broker(2)
    cluster.start_broker(2)
    assert broker_2() == ("starting", True)
    # still in the ISR when it restarted (never fenced): the controller takes the empty replica out
    # (a partition epoch); its first fetch takes the whole log, and the leader adds it back at the
    # follow-up fetch (Kafka's expansion at every fetch: another partition epoch)
    report = advance_round(cluster, clock)
    p = partition_row(cluster, "t")
    assert (report.isr_expands, p["partition_epoch"]) == (1, 2)
    assert (p["isr"], p["high_watermark"], broker_2()) == ([0, 1, 2], 3, ("running", False))
    expected = [(i, 0, f"c{i}") for i in range(3)]
    assert [replica_log(cluster, "t", b, ("offset", "leader_epoch", "value")) for b in range(3)] == [expected] * 3
