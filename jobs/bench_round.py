"""The round as users run it (`Cluster.run_round`): seconds and Spark jobs per round.

    .venv/bin/python jobs/bench_round.py [--partitions 100] [--records 1000] [--rounds 8] [--idle 5]
    .venv/bin/python jobs/bench_round.py --throughput 1000000 [--partitions 100]
    .venv/bin/python jobs/bench_round.py --failover [--partitions 100] [--rounds 3]

One cluster of 3 brokers and one topic of `--partitions` partitions at RF 3 (issue "Round v2"'s
targets: 2 cores, local mode).
- Default: before every round one acks=all produce request of `--records` 100-byte records in
  random partitions; the medians over the rounds after the first two (warm-up) of the round's
  seconds, its Spark jobs (the scheduler's job ids, every thread) and the driver-side seconds of
  each phase (RoundReport.phases); then `--idle` rounds with nothing to do.
- --throughput RECORDS: one bulk produce of RECORDS 100-byte values, rounds until every record is
  committed on all 3 replicas, against one raw Delta append of the same rows in the same session,
  before and after the rounds (records/s and MB/s of both).
- --failover: a leader stopped with records only it holds (its followers paused), the round that
  fences it and elects, the next round, and the round after its restart in which its replicas
  check their logs against the new leader epoch and truncate: the seconds and jobs of each kind.
Writes benchmarks/round_p<P>.json, round_throughput_<RECORDS>.json or round_failover_p<P>.json.
The figures of the round before v2 beside v2's, in one process, are benchmarks/round_v2_*.json
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
from typing import Callable

from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock, get_spark

WARM_UP = 2
MAX_BULK_ROUNDS = 200


class JobCounter:
    """Spark jobs run inside a `with` block, by any thread (a round commits from threads of its
    own): the difference of the scheduler's next job id."""

    def __init__(self, spark) -> None:
        self.scheduler, self.jobs = spark.sparkContext._jsc.sc().dagScheduler(), 0

    def _next(self) -> int:
        return int(str(self.scheduler.nextJobId()))

    def __enter__(self):
        self.start = self._next()
        return self

    def __exit__(self, *exc):
        self.jobs = self._next() - self.start


def timed_round(spark, cluster: Cluster) -> tuple[float, int, dict]:
    """One round: its seconds, its Spark jobs and its report's phases."""
    with JobCounter(spark) as jobs:
        started = time.perf_counter()
        report = cluster.run_round()
        took = time.perf_counter() - started
    return took, jobs.jobs, report.phases


def new_cluster(spark, root: str, partitions: int) -> tuple[ManualClock, Cluster]:
    """3 brokers, a topic "bench" of `partitions` partitions at RF 3, after its first round."""
    clock = ManualClock(start_ms=0)
    cluster = Cluster.create(spark, root, brokers=3, clock=clock)
    cluster.create_topic("bench", partitions=partitions, replication_factor=3)
    cluster.run_round()
    return clock, cluster


def machine(spark) -> str:
    """The machine a benchmark ran on, as its JSON records it."""
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, Spark {spark.version}"


def save(data: dict, out: str) -> None:
    """Writes a benchmark's figures to `out` (JSON) and says where."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(data, f, indent=2)
    print(f"wrote {out}")


def medians(rows: list[dict]) -> dict[str, float]:
    names = sorted({name for row in rows for name in row})
    return {name: statistics.median(row.get(name, 0.0) for row in rows) for name in names}


def rounds(spark, root: str, partitions: int, records: int, count: int, idle: int) -> dict:
    clock, cluster = new_cluster(spark, root, partitions)
    rng = random.Random(7)
    seconds, jobs, phases = [], [], []
    for i in range(count):
        cluster.produce("bench", [{"value": "v" * 100, "partition": rng.randrange(partitions)}
                                  for _ in range(records)], acks="all")
        clock.advance(100)
        took, n, laps = timed_round(spark, cluster)
        if i >= WARM_UP:
            seconds.append(took)
            jobs.append(n)
            phases.append(laps)
    cluster.run_round()  # (the last acks=all requests answered: the rounds after it are idle)
    idle_s, idle_jobs = [], []
    for _ in range(idle):
        clock.advance(100)
        took, n, _ = timed_round(spark, cluster)
        idle_s.append(took)
        idle_jobs.append(n)
    acked = cluster.produce_results().filter(F.col("status") == "acked").count()
    return {"round_median_s": statistics.median(seconds), "jobs_median": statistics.median(jobs),
            "phase_median_s": medians(phases), "rounds_s": seconds, "jobs": jobs,
            "idle_round_median_s": statistics.median(idle_s) if idle_s else None, "idle_jobs": idle_jobs,
            "requests_acked": acked}


def throughput(spark, root: str, partitions: int, records: int) -> dict:
    clock, cluster = new_cluster(spark, root, partitions)
    storage = cluster.storage
    before = storage.version("inbox")
    started = time.perf_counter()
    cluster.produce("bench", spark.range(records).select(F.expr("repeat('v', 100)").alias("value")), acks="all")
    produced = time.perf_counter() - started
    rows = storage.read_changes("inbox", before, storage.version("inbox")).select(
        "topic", "partition", "record_index", "timestamp", "key", "value")

    def raw_append(n: int) -> float:
        started = time.perf_counter()
        rows.write.format("delta").mode("append").save(os.path.join(root, f"raw{n}"))
        return time.perf_counter() - started

    raw = [raw_append(0)]
    count, committed, per_round = 0, 0, []
    with JobCounter(spark) as jobs:
        started = time.perf_counter()
        while committed < records and count < MAX_BULK_ROUNDS:  # until committed on every replica
            clock.advance(100)
            count += 1
            per_round.append(cluster.run_round().phases)
            committed = cluster.describe("bench").agg(F.sum("high_watermark")).first()[0]
        took = time.perf_counter() - started
    raw.append(raw_append(1))
    megabytes = records * 100 / 1e6
    raw_s = statistics.median(raw)
    logs = [cluster.read("bench", replica=b, isolation="read_uncommitted").count() for b in range(3)]
    return {"records": records, "partitions": partitions, "produce_s": produced, "rounds_s": took, "rounds": count,
            "jobs": jobs.jobs, "phases_s": per_round, "raw_append_s": raw, "records_per_s": records / took,
            "mb_per_s": megabytes / took, "raw_records_per_s": records / raw_s, "raw_mb_per_s": megabytes / raw_s,
            "share_of_raw": raw_s / took, "log_rows_per_broker": logs, "hw_sum": committed}


FAILOVER_KINDS = ("election", "after election", "restart and truncation")


def failover(spark, root: str, partitions: int, records: int, count: int,
             measure: Callable[[str, Cluster], tuple[float, int]] | None = None) -> dict:
    """`count` times: a leader stopped with records only it holds, then the three rounds of
    FAILOVER_KINDS, each run by `measure(kind, cluster)` (default: timed_round's seconds and
    jobs)."""
    clock, cluster = new_cluster(spark, root, partitions)
    rng = random.Random(7)
    kinds = FAILOVER_KINDS
    seconds = {k: [] for k in kinds}
    jobs = {k: [] for k in kinds}
    measure = measure or (lambda kind, on: timed_round(spark, on)[:2])

    def step(kind: str, before, advance_ms: int) -> None:
        before()
        clock.advance(advance_ms)
        took, n = measure(kind, cluster)
        seconds[kind].append(took)
        jobs[kind].append(n)

    for _ in range(count):
        leader = cluster.describe("bench").filter(F.col("partition") == 0).first()["leader"]
        others = [b for b in range(3) if b != leader]
        batch = [{"value": "v" * 100, "partition": rng.randrange(partitions)} for _ in range(records)]
        for b in others:
            cluster.pause_fetcher(b)
        cluster.produce("bench", batch, acks=1)  # only the leaders on broker `leader` hold these
        clock.advance(100)
        cluster.run_round()
        cluster.stop_broker(leader)
        for b in others:
            cluster.resume_fetcher(b)
        step("election", lambda: None, 9500)
        step("after election", lambda: cluster.produce("bench", batch, acks="all"), 100)
        step("restart and truncation", lambda: cluster.start_broker(leader), 100)
        cluster.run_round()
    logs = sorted(cluster.read("bench", replica=b, isolation="read_uncommitted").count() for b in range(3))
    return {"kinds": kinds, "median_s": {k: statistics.median(xs) for k, xs in seconds.items()},
            "jobs_median": {k: statistics.median(xs) for k, xs in jobs.items()}, "rounds_s": seconds,
            "log_rows": logs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--idle", type=int, default=5, help="idle rounds measured after the active ones")
    parser.add_argument("--out", default=None)
    parser.add_argument("--throughput", type=int, default=0, metavar="RECORDS",
                        help="instead: one bulk produce of RECORDS, rounds until committed, against a raw append")
    parser.add_argument("--failover", action="store_true",
                        help="instead: a leader's crash, the election, its restart and truncation")
    args = parser.parse_args()
    spark = get_spark(app_name="replog-bench-round")
    scratch = tempfile.mkdtemp(prefix="replog-bench-round-")
    root = os.path.join(scratch, "cluster")
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Spark {spark.version}", "args": vars(args)}
    try:
        if args.failover:
            result.update(failover(spark, root, args.partitions, args.records, args.rounds))
        elif args.throughput:
            result.update(throughput(spark, root, args.partitions, args.throughput))
        else:
            result.update(rounds(spark, root, args.partitions, args.records, args.rounds, args.idle))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.failover:
        for kind in result["kinds"]:
            print(f"P = {args.partitions}, {kind} round: {result['median_s'][kind]:.2f} s "
                  f"({result['jobs_median'][kind]:.0f} jobs)")
        print(f"log rows per replica: {result['log_rows']}")
        out = args.out or f"benchmarks/round_failover_p{args.partitions}.json"
    elif args.throughput:
        print(f"{args.throughput} records into {args.partitions} partitions: {result['rounds_s']:.2f} s in "
              f"{result['rounds']} rounds ({result['records_per_s']:.0f} records/s, {result['mb_per_s']:.1f} MB/s), "
              f"raw append {statistics.median(result['raw_append_s']):.2f} s "
              f"({result['raw_records_per_s']:.0f} records/s), {100 * result['share_of_raw']:.0f}% of raw")
        out = args.out or f"benchmarks/round_throughput_{args.throughput}.json"
    else:
        idle = result["idle_round_median_s"]
        print(f"P = {args.partitions}, {args.records} records a round: {result['round_median_s']:.2f} s, "
              f"{result['jobs_median']:.0f} Spark jobs (median); idle round "
              + (f"{idle:.2f} s" if idle is not None else "not measured"))
        for name, s in sorted(result["phase_median_s"].items(), key=lambda kv: -kv[1]):
            print(f"  {name:45s} {s:6.3f} s")
        out = args.out or f"benchmarks/round_p{args.partitions}.json"
    save(result, out)


if __name__ == "__main__":
    main()
