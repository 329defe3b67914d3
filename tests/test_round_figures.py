"""The rounds' figures in Structured Streaming's progress (pipeline/round/figures.py, the job's
`replog-rounds` query): the HW moves the control job counts, the aggregates observed over rows of
the rounds table, and the replication job reporting each round in its progress."""

import json
import threading
import time

import pyarrow as pa
from pyspark.sql import Observation

from pipeline.jobs.replicate import FIGURES_QUERY, run_streaming
from pipeline.round.control_job import hw_advances
from pipeline.round.figures import ROUND_FIGURES, broker_gauges_json, moved, observe_round_figures
from pipeline.round.inputs import RoundReport
from pipeline.schemas import ROUNDS_SCHEMA


def test_hw_advances_counts_the_partitions_whose_leader_hw_moved_up():
    before = pa.table({"topic": ["t", "t", "t", "u"], "partition": pa.array([0, 1, 2, 0], pa.int32()),
                       "high_watermark": pa.array([5, 5, 5, 0], pa.int64())})
    # t-0 up, t-1 the same, t-2 down (an unclean leader's), u-0 up; and a row of an unknown topic
    after = pa.table({"topic": ["u", "t", "t", "t", "nope"], "partition": pa.array([0, 2, 1, 0, None], pa.int32()),
                      "high_watermark": pa.array([3, 4, 5, 9, 7], pa.int64()),
                      "is_known": [True, True, True, True, False]})
    assert hw_advances(before, after) == 2
    assert hw_advances(before.slice(0, 0), after) == 0
    assert hw_advances(before, after.filter(pa.array([False] * 4 + [True]))) == 0


def test_broker_gauges_name_every_broker_with_every_gauge():
    counts = {("PartitionCount", 0): 2, ("PartitionCount", 2): 1, ("LeaderCount", 0): 2,
              ("UnderReplicatedPartitions", 0): 1}
    assert json.loads(broker_gauges_json(counts, {2: 6}, [0, 1, 2])) == [
        {"broker": 0, "PartitionCount": 2, "LeaderCount": 2, "UnderReplicatedPartitions": 1,
         "UnderMinIsrPartitionCount": 0, "AtMinIsrPartitionCount": 0, "MaxLag": 0},
        {"broker": 1, "PartitionCount": 0, "LeaderCount": 0, "UnderReplicatedPartitions": 0,
         "UnderMinIsrPartitionCount": 0, "AtMinIsrPartitionCount": 0, "MaxLag": 0},
        {"broker": 2, "PartitionCount": 1, "LeaderCount": 0, "UnderReplicatedPartitions": 0,
         "UnderMinIsrPartitionCount": 0, "AtMinIsrPartitionCount": 0, "MaxLag": 6}]


def _report(round_id, **figures):
    zero = {f.name: 0 for f in ROUNDS_SCHEMA.fields if f.dataType.simpleString() == "bigint"}
    return RoundReport(**{**zero, "round_id": round_id, "batch_id": None, "fetch_sessions": None, **figures})


def test_round_figures_sum_the_counts_and_keep_the_newest_rounds_gauges(spark):
    rows = [_report(7, records_appended=10, records_replicated=20, hw_advances=2, requests_acked=2, duration_ms=40,
                    under_replicated_partitions=1, active_partitions=2, pending_requests=1, max_lag=5),
            _report(8, records_replicated=5, hw_advances=None, isr_shrinks=1, requests_failed=1, duration_ms=90,
                    under_replicated_partitions=0, offline_partitions=1, active_partitions=1, max_lag=3)]
    rounds = spark.createDataFrame([tuple(r.as_dict().values()) for r in reversed(rows)], ROUNDS_SCHEMA)
    seen = Observation(ROUND_FIGURES)
    observe_round_figures(rounds, seen).collect()
    assert seen.get == {"rounds": 2, "round_id": 8, "records_appended": 10, "records_replicated": 25,
                        "hw_advances": 2, "isr_shrinks": 1, "isr_expands": 0, "requests_acked": 2,
                        "requests_failed": 1, "under_replicated_partitions": 0, "under_min_isr_partitions": 0,
                        "offline_partitions": 1, "active_partitions": 1, "pending_requests": 0, "max_lag": 3,
                        "max_duration_ms": 90}
    assert moved(seen.get) and not moved({**seen.get, **{k: 0 for k in ("records_appended", "records_replicated",
                                                                        "hw_advances", "isr_shrinks",
                                                                        "requests_acked", "requests_failed")}})


def _queries(spark):
    return {q.name: q for q in spark.streams.active}


def test_the_job_reports_each_rounds_figures_in_structured_streamings_progress(spark, new_cluster, tmp_path):
    cluster = new_cluster(brokers=3)
    cluster.create_topic("live", partitions=2, replication_factor=3)
    cluster.produce("live", [{"value": f"v{i}", "partition": i % 2} for i in range(10)], acks="all")
    stopping = threading.Event()
    job = threading.Thread(target=run_streaming, args=(spark, cluster, 200, str(tmp_path / "cp"), stopping))
    job.start()
    try:
        deadline, observed = time.monotonic() + 240, []
        while not any(o["records_appended"] for o in observed):
            assert job.is_alive() and time.monotonic() < deadline, "no round's figures in 240 s"
            time.sleep(0.5)
            query = _queries(spark).get(FIGURES_QUERY)
            observed = [p.observedMetrics[ROUND_FIGURES].asDict() for p in (query.recentProgress if query else [])
                        if ROUND_FIGURES in p.observedMetrics]
        assert set(_queries(spark)) == {"replog-replicate", FIGURES_QUERY}
    finally:
        stopping.set()
        job.join(timeout=120)
    assert not job.is_alive() and _queries(spark) == {}

    first = next(o for o in observed if o["records_appended"])
    row = cluster.rounds().filter(f"round_id = {first['round_id']}").first()
    assert first["rounds"] == 1 and row["records_appended"] == 10
    assert {k: first[k] for k in ("records_appended", "records_replicated", "hw_advances", "isr_shrinks",
                                  "isr_expands", "requests_acked", "requests_failed")} == {
        "records_appended": 10, "records_replicated": 20, "hw_advances": 2, "isr_shrinks": 0, "isr_expands": 0,
        "requests_acked": 2, "requests_failed": 0}  # (a request's result per partition)
    assert row["hw_advances"] == 2

    # --figures-interval off: the replication query alone
    stopping = threading.Event()
    job = threading.Thread(target=run_streaming, args=(spark, cluster, 200, str(tmp_path / "cp2"), stopping, 0))
    job.start()
    try:
        deadline = time.monotonic() + 120
        while "replog-replicate" not in _queries(spark):
            assert job.is_alive() and time.monotonic() < deadline
            time.sleep(0.2)
        assert set(_queries(spark)) == {"replog-replicate"}
    finally:
        stopping.set()
        job.join(timeout=120)
