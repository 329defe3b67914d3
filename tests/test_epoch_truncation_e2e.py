"""KIP-101's two failure scenarios end to end (2 brokers, RF 2, min ISR 1): truncating to the high
watermark on restart would lose a committed record in the first and let two replicas diverge in
the second; truncating by leader epoch does neither."""

from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock

EPOCH_MS = 1_700_000_000_000


def _setup(spark, tmp_path):
    clock = ManualClock(start_ms=EPOCH_MS)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=2, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=2)
    first = cluster.produce("t", [{"value": "m0"}], acks="all")
    _round(cluster, clock), _round(cluster, clock)
    assert _status(cluster, first) == ("acked", 0)
    return cluster, clock


def _round(cluster, clock, ms=500):
    clock.advance(ms)
    return cluster.run_round()


def _status(cluster, request_id):
    r = cluster.produce_results().filter(F.col("request_id") == request_id).first()
    return r["status"], r["base_offset"]


def _replica(cluster, broker):
    return cluster.storage.read("replica_state").filter(F.col("broker") == broker).first()


def _log(cluster, broker):
    return [(r["offset"], r["leader_epoch"], r["value"].decode()) for r in
            cluster.read("t", replica=broker, isolation="read_uncommitted").orderBy("offset").collect()]


def _leader(cluster):
    p = cluster.describe("t").first()
    return p["leader"], p["leader_epoch"], p["isr"]


def test_kip101_a_follower_restarting_below_its_hw_keeps_the_committed_record(spark, tmp_path):
    cluster, clock = _setup(spark, tmp_path)
    # m1 reaches the follower, which crashes before it learns the HW that commits it
    second = cluster.produce("t", [{"value": "m1"}], acks="all")
    _round(cluster, clock)
    cluster.stop_broker(1)
    # fenced, it leaves the ISR; the leader alone commits m1 (min ISR 1)
    _round(cluster, clock, ms=9500)
    _round(cluster, clock)
    assert _leader(cluster) == (0, 0, [0])
    assert _status(cluster, second) == ("acked", 1)
    follower = _replica(cluster, 1)
    # its stored HW is 1: truncating to it on restart would drop the committed m1 at offset 1
    assert (follower["log_end_offset"], follower["high_watermark"]) == (2, 1)

    cluster.start_broker(1)
    _round(cluster, clock), _round(cluster, clock)
    assert _leader(cluster) == (0, 0, [0, 1])
    # now the leader crashes: the restarted follower leads, and m1 is still committed at offset 1
    cluster.stop_broker(0)
    _round(cluster, clock, ms=9500)
    assert _leader(cluster) == (1, 1, [1])
    third = cluster.produce("t", [{"value": "m2"}], acks="all")
    _round(cluster, clock)
    assert _status(cluster, third) == ("acked", 2)
    assert _log(cluster, 1) == [(0, 0, "m0"), (1, 0, "m1"), (2, 1, "m2")]
    assert cluster.read("t").count() == 3


def test_kip101_both_crash_the_follower_returns_first_and_the_replicas_do_not_diverge(spark, tmp_path):
    cluster, clock = _setup(spark, tmp_path)
    # the leader appends m1 that the (stalled) follower never gets, then both crash
    cluster.pause_fetcher(1)
    cluster.produce("t", [{"value": "m1"}], acks=1)
    _round(cluster, clock)
    cluster.stop_broker(0), cluster.stop_broker(1)
    cluster.resume_fetcher(1)
    _round(cluster, clock, ms=9500)
    assert _leader(cluster) == (-1, 1, [0, 1])  # offline, both still in the ISR

    # broker 1 returns first and leads (epoch 2) from its LEO 1; it takes m2 at offset 1
    cluster.start_broker(1)
    _round(cluster, clock)
    assert _leader(cluster) == (1, 2, [1])
    assert [(r["election"], r["leader"], r["leader_epoch"]) for r in
            cluster.elections().orderBy("round_id", "leader_epoch").collect()] == [("offline", -1, 1), ("clean", 1, 2)]
    other = cluster.produce("t", [{"value": "m2"}], acks=1)
    _round(cluster, clock)
    assert _status(cluster, other) == ("acked", 1)

    # broker 0 returns with m1 (epoch 0) at offset 1: the leader's epoch 0 ends at 1, so it truncates
    # m1 there and fetches m2: both logs are the same, offset by offset
    cluster.start_broker(0)
    _round(cluster, clock), _round(cluster, clock)
    assert _log(cluster, 0) == _log(cluster, 1) == [(0, 0, "m0"), (1, 2, "m2")]
    assert _leader(cluster) == (1, 2, [0, 1])  # the ISR in replica order
