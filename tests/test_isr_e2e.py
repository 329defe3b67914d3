"""A paused follower through rounds: lag expiry, shrink, HW advance with the smaller ISR, resume,
catch-up and re-expansion, checking describe() after every round (lag 1000 ms, rounds 500 ms apart)."""

import pytest

from pipeline import Cluster, ManualClock

COLS = ["leader", "isr", "partition_epoch", "high_watermark", "log_end_offset"]


def state(cluster):
    row = cluster.describe("t").first()
    return tuple(row[c] for c in COLS)


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    clock = ManualClock(start_ms=0)
    cluster = Cluster.create(spark, str(tmp_path_factory.mktemp("isr") / "c"), brokers=3, clock=clock)
    cluster.create_topic("t", partitions=1, replication_factor=3,
                         config={"min.insync.replicas": "2", "replica.lag.time.max.ms": "1000"})
    steps = []

    def round_():
        clock.advance(500)
        report = cluster.run_round()
        steps.append((clock.now_ms(), state(cluster), report, cluster.replicas("t").collect()))

    first = cluster.produce("t", [{"value": "a"}, {"value": "b"}], acks="all")
    round_()                              # t=500: appended, fetched, committed by the follow-up fetch
    round_()                              # t=1000: idle
    cluster.pause_fetcher(2)              # broker 2 stops fetching; its last fetch was at t=1000
    second = cluster.produce("t", [{"value": "c"}], acks="all")
    round_()                              # t=1500
    round_()                              # t=2000: 1000 ms since broker 2 caught up: still in sync
    round_()                              # t=2500: 1500 ms: shrink, HW jumps to 3
    cluster.resume_fetcher(2)
    round_()                              # t=3000: broker 2 fetches from 2, gets offset 2; its
    #                                       follow-up fetch at 3 >= HW 3: back in the ISR
    round_()                              # t=3500: idle
    clock.advance(99_500)
    round_()                              # t=103500: idle for 100 s, far beyond the lag
    third = cluster.produce("t", [{"value": "d"}], acks="all")
    round_()                              # t=104000: traffic again: nobody was out of sync while idle,
    #                                       committed with the full ISR
    round_()                              # t=104500: idle
    return {"steps": steps, "cluster": cluster, "first": first, "second": second, "third": third}


def test_describe_after_every_round(run):
    expected = [
        (500, (0, [0, 1, 2], 0, 2, 2)),
        (1000, (0, [0, 1, 2], 0, 2, 2)),
        (1500, (0, [0, 1, 2], 0, 2, 3)),   # broker 2 paused: HW waits for it while it is in the ISR
        (2000, (0, [0, 1, 2], 0, 2, 3)),   # exactly the lag since it last caught up: not yet out
        (2500, (0, [0, 1], 1, 3, 3)),      # shrink persisted (partition epoch 1), HW advances
        (3000, (0, [0, 1, 2], 2, 3, 3)),   # resumed: fetched offset 2, and its follow-up fetch's
        #                                    offset 3 >= HW 3 expands the ISR at once (Kafka's
        #                                    maybeExpandIsr at every fetch; partition epoch 2)
        (3500, (0, [0, 1, 2], 2, 3, 3)),
        (103500, (0, [0, 1, 2], 2, 3, 3)),  # caught-up followers are never dropped however long idle
        (104000, (0, [0, 1, 2], 2, 4, 4)),
        (104500, (0, [0, 1, 2], 2, 4, 4)),
    ]
    assert [(t, s) for t, s, _, _ in run["steps"]] == expected


def test_round_reports_count_the_isr_changes_and_health(run):
    reports = [r for _, _, r, _ in run["steps"]]
    assert [r.isr_shrinks for r in reports] == [0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert [r.isr_expands for r in reports] == [0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
    assert [r.under_replicated_partitions for r in reports] == [0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert [r.at_min_isr_partitions for r in reports] == [0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert (reports[7].records_replicated, reports[7].isr_shrinks) == (0, 0)  # idle 100 s: nothing moved


def test_paused_follower_replica_state(run):
    by_time = {t: {r["broker"]: r for r in rows} for t, _, _, rows in run["steps"]}
    assert by_time[2000][2]["last_caught_up_time_ms"] == 1000
    assert (by_time[2500][2]["in_isr"], by_time[2500][2]["lag"]) == (False, 1)
    assert (by_time[3000][2]["log_end_offset"], by_time[3500][2]["in_isr"]) == (3, True)


def test_acks_all_waits_for_the_isr_then_is_acked_after_the_shrink(run):
    statuses = {r["request_id"]: r["status"] for r in run["cluster"].produce_results().collect()}
    assert statuses == {run["first"]: "acked", run["second"]: "acked", run["third"]: "acked"}
    acked_at = [t for t, _, r, _ in run["steps"] if r.requests_acked]
    assert acked_at == [500, 2500, 104000]


def test_a_process_that_opens_the_cluster_restarts_its_brokers(new_cluster, spark, clock):
    # produced with acks=all while no process ran rounds for longer than replica.lag.time.max.ms:
    # the downtime is nobody's lag, so the followers stay in the ISR and the request is acked
    cluster = new_cluster(brokers=3)
    cluster.create_topic("t", partitions=1, replication_factor=3, config={"min.insync.replicas": "3"})
    request = cluster.produce("t", [{"value": "a"}, {"value": "b"}], acks="all")
    clock.advance(cluster.config["replica.lag.time.max.ms"] * 2)

    job = Cluster.open(spark, cluster.storage.root, clock=clock)
    reports = [job.run_round()]
    clock.advance(500)
    reports.append(job.run_round())
    assert [(r.isr_shrinks, r.requests_failed) for r in reports] == [(0, 0), (0, 0)]
    assert [r["isr"] for r in job.describe("t").collect()] == [[0, 1, 2]]
    assert {r["status"] for r in job.produce_results().filter(f"request_id = '{request}'").collect()} == {"acked"}


def test_a_clock_that_steps_back_runs_the_round_at_the_last_rounds_time(new_cluster, clock):
    # a wall clock stepped back 60 s (past replica.lag.time.max.ms and broker.session.timeout.ms):
    # the round runs at the last round's time, so nothing is measured backwards and no HW goes back
    cluster = new_cluster(brokers=3)
    cluster.create_topic("t", partitions=1, replication_factor=3, config={"min.insync.replicas": "2"})
    clock.advance(100_000)
    first = cluster.produce("t", [{"value": "a"}], acks="all")
    before = cluster.run_round()
    cluster.pause_fetcher(2)
    clock.rewind(60_000)
    second = cluster.produce("t", [{"value": "b"}], acks="all")
    after = cluster.run_round()
    assert (before.now_ms, after.now_ms) == (100_000, 100_000)
    row = cluster.describe("t").first()
    assert (row["isr"], row["high_watermark"], row["log_end_offset"]) == ([0, 1, 2], 1, 2)
    statuses = {r["request_id"]: r["status"] for r in cluster.produce_results().collect()}
    assert (statuses[first], statuses[second]) == ("acked", "pending")  # broker 2 holds "b" back
    # time goes on from the clock: 30,001 ms past the last round's time, broker 2 is shrunk
    clock.advance(60_000 + 30_001)
    cluster.run_round()
    row = cluster.describe("t").first()
    assert (row["isr"], row["high_watermark"]) == ([0, 1], 2)
    with pytest.raises(ValueError, match="ms must be an int from 0"):
        clock.rewind(clock.now_ms() + 1)
