"""KIP-101's two failure scenarios end to end (2 brokers, RF 2, min ISR 1; the first with a third
replica that holds the HW back): truncating to the high watermark on restart would lose a committed
record in the first and let two replicas diverge in the second; truncating by leader epoch does
neither."""

from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock
from tests.helpers import advance_round, replica_log

EPOCH_MS = 1_700_000_000_000


def _setup(spark, tmp_path, brokers=2, config=None):
    clock = ManualClock(start_ms=EPOCH_MS)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=brokers, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=brokers, config=config)
    first = cluster.produce("t", [{"value": "m0"}], acks="all")
    advance_round(cluster, clock), advance_round(cluster, clock)
    assert _status(cluster, first) == ("acked", 0)
    return cluster, clock


def _status(cluster, request_id):
    r = cluster.produce_results().filter(F.col("request_id") == request_id).first()
    return r["status"], r["base_offset"]


def _replica(cluster, broker):
    return cluster.storage.replica_state().filter(F.col("broker") == broker).first()


def _leader(cluster):
    p = cluster.describe("t").first()
    return p["leader"], p["leader_epoch"], p["isr"]


def test_kip101_a_follower_restarting_below_its_hw_keeps_the_committed_record(spark, tmp_path):
    cluster, clock = _setup(spark, tmp_path, brokers=3, config={"replica.lag.time.max.ms": "1000"})
    # m1 reaches follower 1, which crashes before it learns a HW that commits it: broker 2 stopped
    # fetching but is still in the ISR (500 ms < the lag), so its offset holds the HW back
    cluster.pause_fetcher(2)
    second = cluster.produce("t", [{"value": "m1"}], acks="all")
    advance_round(cluster, clock)
    assert _status(cluster, second)[0] == "pending"
    cluster.stop_broker(1)
    # broker 1 fenced, broker 2 past the lag: both leave the ISR; the leader alone commits m1
    advance_round(cluster, clock, ms=9500)
    advance_round(cluster, clock)
    assert _leader(cluster) == (0, 0, [0])
    assert _status(cluster, second) == ("acked", 1)
    follower = _replica(cluster, 1)
    # its stored HW is 1: truncating to it on restart would drop the committed m1 at offset 1
    assert (follower["log_end_offset"], follower["high_watermark"]) == (2, 1)

    cluster.start_broker(1)
    advance_round(cluster, clock), advance_round(cluster, clock)
    assert _leader(cluster) == (0, 0, [0, 1])
    # now the leader crashes: the restarted follower leads, and m1 is still committed at offset 1
    cluster.stop_broker(0)
    advance_round(cluster, clock, ms=9500)
    assert _leader(cluster) == (1, 1, [1])
    third = cluster.produce("t", [{"value": "m2"}], acks="all")
    advance_round(cluster, clock)
    assert _status(cluster, third) == ("acked", 2)
    assert replica_log(cluster, "t", 1, ("offset", "leader_epoch", "value"), None) == [(0, 0, "m0"), (1, 0, "m1"), (2, 1, "m2")]
    assert cluster.read("t").count() == 3


def test_kip101_both_crash_the_follower_returns_first_and_the_replicas_do_not_diverge(spark, tmp_path):
    cluster, clock = _setup(spark, tmp_path)
    # the leader appends m1 that the (stalled) follower never gets, then both crash
    cluster.pause_fetcher(1)
    cluster.produce("t", [{"value": "m1"}], acks=1)
    advance_round(cluster, clock)
    cluster.stop_broker(0), cluster.stop_broker(1)
    cluster.resume_fetcher(1)
    advance_round(cluster, clock, ms=9500)
    assert _leader(cluster) == (-1, 1, [0, 1])  # offline, both still in the ISR

    # broker 1 returns first and leads (epoch 2) from its LEO 1; it takes m2 at offset 1
    cluster.start_broker(1)
    advance_round(cluster, clock)
    assert _leader(cluster) == (1, 2, [1])
    assert [(r["election"], r["leader"], r["leader_epoch"]) for r in
            cluster.elections().orderBy("round_id", "leader_epoch").collect()] == [("offline", -1, 1), ("clean", 1, 2)]
    other = cluster.produce("t", [{"value": "m2"}], acks=1)
    advance_round(cluster, clock)
    assert _status(cluster, other) == ("acked", 1)

    # broker 0 returns with m1 (epoch 0) at offset 1: the leader's epoch 0 ends at 1, so it truncates
    # m1 there and fetches m2: both logs are the same, offset by offset
    cluster.start_broker(0)
    advance_round(cluster, clock), advance_round(cluster, clock)
    assert replica_log(cluster, "t", 0, ("offset", "leader_epoch", "value"), None) == replica_log(cluster, "t", 1, ("offset", "leader_epoch", "value"), None) == [(0, 0, "m0"), (1, 2, "m2")]
    assert _leader(cluster) == (1, 2, [0, 1])  # the ISR in replica order


def test_kip279_a_follower_with_an_epoch_its_new_leader_never_had_truncates_to_the_last_common_one(spark, tmp_path):
    """KIP-279's fast double leader change: broker 1 leads epoch 1 only briefly, takes m2, and
    crashes; broker 0, which never saw epoch 1, returns and leads (unclean). Broker 1 comes back
    asking for epoch 1: the leader answers with the largest epoch it has below it (0) and where
    that ends for it (2), the follower truncates at its own end of epoch 0 (1), drops m2 and
    fetches the leader's log. (Min ISR 2: m2, taken with one replica in the ISR, is never committed.)"""
    clock = ManualClock(start_ms=EPOCH_MS)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=2, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=2,
                         config={"min.insync.replicas": 2, "unclean.leader.election.enable": True})
    cluster.produce("t", [{"value": "m0"}], acks="all")
    advance_round(cluster, clock), advance_round(cluster, clock)
    cluster.pause_fetcher(1)
    cluster.produce("t", [{"value": "m1"}], acks=1)  # on broker 0 only
    advance_round(cluster, clock)
    cluster.stop_broker(0)
    cluster.resume_fetcher(1)
    advance_round(cluster, clock, ms=9500)
    assert _leader(cluster) == (1, 1, [1])  # epoch 1, starting at broker 1's LEO 1
    m2 = cluster.produce("t", [{"value": "m2"}], acks=1)
    advance_round(cluster, clock)
    assert _status(cluster, m2) == ("acked", 1)
    assert replica_log(cluster, "t", 1, ("offset", "leader_epoch", "value"), None) == [(0, 0, "m0"), (1, 1, "m2")]

    # broker 1 crashes at once; broker 0 returns without ever having seen epoch 1 and leads
    cluster.stop_broker(1)
    advance_round(cluster, clock, ms=9500)
    assert _leader(cluster)[0] == -1
    cluster.start_broker(0)
    advance_round(cluster, clock)
    assert _leader(cluster) == (0, 3, [0])
    assert [(r["election"], r["leader"], r["leader_epoch"], r["start_offset"]) for r in
            cluster.elections().orderBy("leader_epoch").collect()] == [
        ("clean", 1, 1, 1), ("offline", -1, 2, None), ("unclean", 0, 3, 2)]
    m3 = cluster.produce("t", [{"value": "m3"}], acks=1)
    advance_round(cluster, clock)
    assert _status(cluster, m3) == ("acked", 2)
    assert replica_log(cluster, "t", 0, ("offset", "leader_epoch", "value"), None) == [(0, 0, "m0"), (1, 0, "m1"), (2, 3, "m3")]

    # broker 1 returns: its epoch 1 is unknown to the leader; it truncates at 1 and converges
    cluster.start_broker(1)
    advance_round(cluster, clock), advance_round(cluster, clock), advance_round(cluster, clock)
    assert replica_log(cluster, "t", 1, ("offset", "leader_epoch", "value"), None) == replica_log(cluster, "t", 0, ("offset", "leader_epoch", "value"), None) == [(0, 0, "m0"), (1, 0, "m1"), (2, 3, "m3")]
    assert _leader(cluster) == (0, 3, [0, 1])


def test_kafka7128_a_follower_at_the_hw_but_below_the_epochs_start_stays_out_of_the_isr(spark, tmp_path):
    """KAFKA-7128: a new leader's HW can sit below records it took over (here: frozen by min ISR 3
    once the ISR shrank). A follower that catches up to that HW but not to the leader epoch's start
    offset must not join the ISR: were it in, the leader's crash would elect it without those
    records. It joins once it fetches from the epoch's start offset, and then it may lead with
    every record."""
    clock = ManualClock(start_ms=EPOCH_MS)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=3, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=3, config={"min.insync.replicas": 3})
    cluster.produce("t", [{"value": f"m{i}"} for i in range(3)], acks="all")
    advance_round(cluster, clock), advance_round(cluster, clock)
    cluster.pause_fetcher(2)
    cluster.produce("t", [{"value": "m3"}], acks=1)
    advance_round(cluster, clock)
    advance_round(cluster, clock, ms=31_000)  # past replica.lag.time.max.ms: broker 2 leaves the ISR
    assert _leader(cluster) == (0, 0, [0, 1])
    cluster.produce("t", [{"value": f"m{i}"} for i in range(4, 6)], acks=1)
    advance_round(cluster, clock)
    cluster.stop_broker(0)
    advance_round(cluster, clock, ms=9500)
    assert _leader(cluster) == (1, 1, [1])
    assert cluster.describe("t").first()["high_watermark"] == 3  # ISR below min ISR 3: frozen
    assert [r["start_offset"] for r in cluster.elections().collect()] == [6]

    # broker 2 comes back one record per round: its LEO passes the HW (3) well before 6
    cluster.resume_fetcher(2)
    cluster.throttle_fetcher(2, 1)
    seen = []
    for _ in range(4):
        advance_round(cluster, clock)
        seen.append((_replica(cluster, 2)["log_end_offset"], _leader(cluster)[2]))
    # it joins at the follow-up fetch of the round that takes it to 6 (Kafka's expansion at every fetch)
    assert seen == [(4, [1]), (5, [1]), (6, [1, 2]), (6, [1, 2])]
    # now it holds m3-m5, so the leader's crash may elect it
    cluster.stop_broker(1)
    advance_round(cluster, clock, ms=9500)
    assert _leader(cluster) == (2, 2, [2])
    assert [r[2] for r in replica_log(cluster, "t", 2, ("offset", "leader_epoch", "value"), None)] == [f"m{i}" for i in range(6)]
