"""acks=all against min.insync.replicas through rounds, a throttled (slow) follower, and the metrics
views. 1 partition, RF 3, min ISR 2, lag 1000 ms, rounds 500 ms apart."""

import pytest

from pipeline import Cluster, ManualClock

CONFIG = {"min.insync.replicas": "2", "replica.lag.time.max.ms": "1000"}


def status(cluster, request_id):
    rows = cluster.produce_results().filter(f"request_id = '{request_id}'").collect()
    assert len(rows) == 1
    return rows[0]["status"], rows[0]["error_code"], rows[0]["base_offset"]


@pytest.fixture(scope="module")
def stuck(spark, tmp_path_factory):
    clock = ManualClock(start_ms=0)
    cluster = Cluster.create(spark, str(tmp_path_factory.mktemp("acks") / "c"), brokers=3, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=3, config=CONFIG)
    cluster.pause_fetcher(1)
    cluster.pause_fetcher(2)
    out = {"cluster": cluster, "clock": clock}

    def round_(name):
        clock.advance(500)
        out[name] = (cluster.run_round(), cluster.describe("t").first().asDict(),
                     {r["name"]: r["value"] for r in cluster.metrics().collect()})

    out["a"] = cluster.produce("t", [{"value": "a"}], acks="all")
    round_("r500")     # appended on the leader; both followers stuck, still in the ISR
    round_("r1000")    # exactly the lag: still in the ISR
    round_("r1500")    # both leave: ISR [0] < min ISR 2, so the HW is frozen and A fails
    out["b"] = cluster.produce("t", [{"value": "b"}], acks="all")
    out["c"] = cluster.produce("t", [{"value": "c"}], acks=1)
    round_("r2000")    # B refused (nothing appended), C appended and acked
    cluster.resume_fetcher(1)
    cluster.resume_fetcher(2)
    round_("r2500")    # followers fetch from 0 (at the HW 0): back in the ISR, receive a, c; their
    #                    follow-up fetch at offset 2 moves the HW to 2
    round_("r3000")    # nothing left to do
    out["laggiest"] = cluster.laggiest_replicas(2).collect()
    return out


def test_isr_and_hw_while_both_followers_are_stuck(stuck):
    seen = [(stuck[r][1]["isr"], stuck[r][1]["high_watermark"], stuck[r][1]["log_end_offset"])
            for r in ("r500", "r1000", "r1500", "r2000", "r2500", "r3000")]
    assert seen == [([0, 1, 2], 0, 1), ([0, 1, 2], 0, 1), ([0], 0, 1), ([0], 0, 2), ([0, 1, 2], 2, 2),
                    ([0, 1, 2], 2, 2)]


def test_acks_all_after_append_fails_when_the_isr_falls_below_min(stuck):
    assert status(stuck["cluster"], stuck["a"]) == ("error", "NOT_ENOUGH_REPLICAS_AFTER_APPEND", 0)


def test_acks_all_refused_below_min_isr_and_nothing_appended(stuck):
    assert status(stuck["cluster"], stuck["b"])[:2] == ("error", "NOT_ENOUGH_REPLICAS")
    values = [bytes(r["value"]) for r in stuck["cluster"].read("t").orderBy("offset").collect()]
    assert values == [b"a", b"c"]


def test_acks_one_is_acked_on_leader_append(stuck):
    assert status(stuck["cluster"], stuck["c"]) == ("acked", None, 1)


def test_metrics_by_kafka_names(stuck):
    m = stuck["r1500"][2]
    assert (m["UnderReplicatedPartitions"], m["UnderMinIsrPartitionCount"], m["AtMinIsrPartitionCount"],
            m["OfflinePartitionsCount"]) == (1, 1, 0, 0)
    assert m["IsrShrinksPerSec"] == pytest.approx(2 / 60)
    assert stuck["r2000"][2]["MaxLag"] == 2
    m = stuck["r2500"][2]
    assert (m["UnderReplicatedPartitions"], m["UnderMinIsrPartitionCount"], m["IsrExpandsPerSec"]) == \
        (0, 0, pytest.approx(2 / 60))
    assert stuck["r500"][2]["MaxLag"] == 1


def test_laggiest_replicas_view(stuck):
    assert [(r["broker"], r["lag_records"], r["lag_ms"]) for r in stuck["laggiest"]] == [(1, 0, 0), (2, 0, 0)]


def test_throttled_follower_falls_behind_and_leaves_the_isr_after_the_lag(spark, tmp_path):
    clock = ManualClock(start_ms=0)
    cluster = Cluster.create(spark, str(tmp_path / "slow"), brokers=3, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=3, config=CONFIG)
    cluster.throttle_fetcher(2, max_bytes_per_round=1)  # one record per round
    seen = []
    for _ in range(4):
        # two requests, two record batches: a fetch takes whole batches, at least one (KIP-74)
        cluster.produce("t", [{"value": "x"}], acks=1)
        cluster.produce("t", [{"value": "y"}], acks=1)
        clock.advance(500)
        cluster.run_round()
        seen.append({r["broker"]: (r["log_end_offset"], r["in_isr"]) for r in cluster.replicas("t").collect()})
    # broker 2 gains one record a round while the leader gains two; it was last caught up when the
    # topic was created (t=0), so it leaves the ISR once 1000 ms have passed, at t=1500
    assert [s[2] for s in seen] == [(1, True), (2, True), (3, False), (4, False)]
    assert [s[1] for s in seen] == [(2, True), (4, True), (6, True), (8, True)]
    lag = cluster.laggiest_replicas(1).first()
    assert (lag["broker"], lag["lag_records"], lag["lag_ms"]) == (2, 4, 2000)
