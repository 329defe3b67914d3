"""Round v2's control plane beside today's round, in one process (issue "Round v2": measure side
by side early).

    .venv/bin/python jobs/bench_round_v2.py [--partitions 100] [--records 1000] [--rounds 8] [--fetchers 2]
    .venv/bin/python jobs/bench_round_v2.py --clusters [--partitions 100] [--rounds 8]  # Cluster.run_round, v1 and v2
    .venv/bin/python jobs/bench_round_v2.py --failover [--partitions 100] [--rounds 3]  # elections, v1 and v2

One cluster (3 brokers, RF 3, one topic of `--partitions`). Before every round one acks=all
produce request of `--records` 100-byte records in random partitions; then, interleaved on the same
records:
- today's round (`Cluster.run_round`: reads, rules, every commit);
- round v2's active round (pipeline/round_v2.py): the new inbox rows (by Delta version)
  summarised, the partition state cogrouped with the summary by bucket and Kafka's rules run over
  each bucket in one task (pinned), the records numbered and written once per broker (three log
  commits at once), then the changed partition rows with the results they answer (one commit). Its
  tables are its own, beside the cluster's. Not in it yet: the rules docs/design.md lists as not
  carried (controller, sessions, quotas, ...), which today's round runs every round.
Medians over the rounds after the first two, Spark jobs per round counted from the status tracker.
Writes benchmarks/round_v2_p<partitions>.json.
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

from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock, get_spark
from pipeline.control.fetch_round import RoundContext
from pipeline.control_job import partition_state_from_tables, produce_results
from pipeline.round_v2 import RoundTables, run_active_round

WARM_UP = 2
MAX_BULK_ROUNDS = 60
PHASES: list[dict[str, float]] = []


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


def v2_round(spark, storage, carried, versions: tuple[int, int], ctx: RoundContext, root: str, fetchers: int):
    spark.conf.set("spark.sql.shuffle.partitions", str(fetchers))  # a task per bucket
    if versions[1] > versions[0]:
        inbox = storage.read_changes("inbox", versions[0], versions[1]).drop("_change_type", "_commit_timestamp")
    else:  # no new inbox rows
        inbox = storage.read("inbox").limit(0).withColumn("_commit_version", F.lit(0).cast("long"))
    tables = RoundTables({b: os.path.join(root, "v2", f"log{b}") for b in range(3)},
                         os.path.join(root, "v2", "partition_state"))
    state, pending, lagging = carried
    out = run_active_round(state, inbox, pending, ctx, fetchers, tables,
                           lambda appends: storage.append_all(appends, ctx.round_id), lagging_leaders=lagging)
    PHASES.append(out.phases)
    return out.state, out.pending, out.figures["lagging_leaders"]


def new_cluster(spark, root: str, topic: str, partitions: int, fetchers: int):
    """A cluster of 3 brokers with one topic (RF 3) after its first round, and the v2 round's carry:
    the partition state of its tables, no pending requests."""
    clock = ManualClock(start_ms=0)
    cluster = Cluster.create(spark, root, brokers=3, clock=clock)
    cluster.create_topic(topic, partitions=partitions, replication_factor=3)
    cluster.run_round()
    storage = cluster.storage
    state = partition_state_from_tables(storage.read("partitions"), storage.read("replica_state"), fetchers,
                                        min_isr=1, lag_time_max_ms=30_000)
    return clock, cluster, (state.localCheckpoint(), None, set())


def bench(spark, root: str, partitions: int, records: int, rounds: int, fetchers: int) -> dict:
    clock, cluster, carried = new_cluster(spark, root, "bench", partitions, fetchers)
    storage = cluster.storage
    rng = random.Random(7)
    old, new, old_jobs, new_jobs = [], [], [], []
    for i in range(rounds):
        before = storage.version("inbox")
        cluster.produce("bench", [{"value": "v" * 100, "partition": rng.randrange(partitions)}
                                  for _ in range(records)], acks="all")
        after = storage.version("inbox")
        clock.advance(100)
        with JobCounter(spark) as jobs:
            started = time.perf_counter()
            cluster.run_round()
            old_time = time.perf_counter() - started
        old_count = jobs.jobs
        ctx = RoundContext(round_id=1000 + i, now_ms=clock.now_ms(), fetching_brokers=(0, 1, 2))
        with JobCounter(spark) as jobs:
            started = time.perf_counter()
            carried = v2_round(spark, storage, carried, (before, after), ctx, root, fetchers)
            took = time.perf_counter() - started
        if i >= WARM_UP:
            old.append(old_time)
            old_jobs.append(old_count)
            new.append(took)
            new_jobs.append(jobs.jobs)
    committed = produce_results(spark.read.format("delta").load(os.path.join(root, "v2", "partition_state"))) \
        .filter(F.col("status") == "acked").count()
    o, n = statistics.median(old), statistics.median(new)
    logs = [spark.read.format("delta").load(os.path.join(root, "v2", f"log{b}")).count() for b in range(3)]
    return {"today_round_median_s": o, "v2_round_median_s": n, "ratio_v2_over_today": n / o,
            "v2_log_rows_per_broker": logs,
            "v2_phase_median_s": {name: statistics.median(p.get(name, 0.0) for p in PHASES[WARM_UP:])
                                  for name in PHASES[-1]},
            "today_jobs_median": statistics.median(old_jobs), "v2_jobs_median": statistics.median(new_jobs),
            "today_rounds_s": old, "v2_rounds_s": new, "v2_requests_acked": committed}


def throughput(spark, root: str, partitions: int, records: int, fetchers: int) -> dict:
    """One bulk produce of `records` 100-byte values into `partitions` partitions, replicated by v2
    rounds (RF 3) until every partition's HW is at its end (Kafka's fetch limits: 1 MB a partition,
    10 MB a response, two fetches a round), against one raw Delta append of the same rows, run
    before and after them."""
    clock, cluster, carried = new_cluster(spark, root, "bulk", partitions, fetchers)
    storage = cluster.storage
    before = storage.version("inbox")
    cluster.produce("bulk", spark.range(records).select(F.expr("repeat('v', 100)").alias("value")), acks="all")
    after = storage.version("inbox")
    rows = storage.read_changes("inbox", before, after).select("topic", "partition", "record_index", "timestamp",
                                                                 "key", "value")

    def raw_append(n: int) -> float:
        started = time.perf_counter()
        rows.write.format("delta").mode("append").save(os.path.join(root, f"raw{n}"))
        return time.perf_counter() - started

    raw = [raw_append(0)]
    rounds, committed = 0, 0
    with JobCounter(spark) as jobs:
        started = time.perf_counter()
        while committed < records and rounds < MAX_BULK_ROUNDS:  # until committed on every replica
            clock.advance(100)
            rounds += 1
            ctx = RoundContext(round_id=rounds, now_ms=clock.now_ms(), fetching_brokers=(0, 1, 2))
            carried = v2_round(spark, storage, carried, (before, after) if rounds == 1 else (after, after), ctx,
                               root, fetchers)
            committed = carried[0].agg(F.sum("high_watermark")).first()[0]
        took = time.perf_counter() - started
    state = carried[0]
    raw.append(raw_append(1))
    logs = [spark.read.format("delta").load(os.path.join(root, "v2", f"log{b}")).count() for b in range(3)]
    megabytes = records * 100 / 1e6
    raw_s = statistics.median(raw)
    return {"records": records, "partitions": partitions, "v2_s": took, "v2_rounds": rounds, "v2_jobs": jobs.jobs,
            "v2_phase_s": PHASES, "raw_append_s": raw, "v2_records_per_s": records / took,
            "v2_mb_per_s": megabytes / took, "raw_records_per_s": records / raw_s, "raw_mb_per_s": megabytes / raw_s,
            "v2_share_of_raw": raw_s / took, "v2_log_rows_per_broker": logs,
            "hw_sum": state.agg(F.sum("high_watermark")).first()[0]}


def _v1_and_v2(spark, root: str, partitions: int) -> dict:
    """version -> (its clock, a cluster of 3 brokers with replication.round that version, a topic
    "bench" of `partitions` partitions at RF 3, after its first round)."""
    made = {}
    for version in ("v1", "v2"):
        clock = ManualClock(start_ms=0)
        cluster = Cluster.create(spark, os.path.join(root, version), brokers=3, clock=clock,
                                 config={"replication.round": version})
        cluster.create_topic("bench", partitions=partitions, replication_factor=3)
        cluster.run_round()
        made[version] = (clock, cluster)
    return made


def clusters(spark, root: str, partitions: int, records: int, rounds: int) -> dict:
    """Two clusters, replication.round v1 and v2, the same records produced to both before each
    round, their `Cluster.run_round` interleaved (the first of each pair alternating): the whole
    round as users run it, the rounds row and the sessions' figures included."""
    made = _v1_and_v2(spark, root, partitions)
    rng = random.Random(7)
    seconds = {"v1": [], "v2": []}
    jobs_of = {"v1": [], "v2": []}
    for i in range(rounds):
        batch = [{"value": "v" * 100, "partition": rng.randrange(partitions)} for _ in range(records)]
        order = ("v1", "v2") if i % 2 == 0 else ("v2", "v1")
        for version in order:
            clock, cluster = made[version]
            cluster.produce("bench", batch, acks="all")
            clock.advance(100)
            with JobCounter(spark) as jobs:
                started = time.perf_counter()
                cluster.run_round()
                took = time.perf_counter() - started
            if i >= WARM_UP:
                seconds[version].append(took)
                jobs_of[version].append(jobs.jobs)
    committed = {version: cluster.replicas("bench").agg(F.sum("high_watermark")).first()[0]
                 for version, (_, cluster) in made.items()}
    acked = {version: cluster.produce_results().filter(F.col("status") == "acked").count()
             for version, (_, cluster) in made.items()}
    v1, v2 = statistics.median(seconds["v1"]), statistics.median(seconds["v2"])
    return {"v1_round_median_s": v1, "v2_round_median_s": v2, "ratio_v2_over_v1": v2 / v1,
            "v1_jobs_median": statistics.median(jobs_of["v1"]), "v2_jobs_median": statistics.median(jobs_of["v2"]),
            "v1_rounds_s": seconds["v1"], "v2_rounds_s": seconds["v2"], "hw_sum": committed, "results_acked": acked}


def failover(spark, root: str, partitions: int, records: int, rounds: int) -> dict:
    """Two clusters, replication.round v1 and v2, the same steps on both, each step's round
    interleaved (the first of each pair alternating), `rounds` times over: a leader stopped with
    records only it holds (its followers paused), the round that fences it and elects (the
    controller's elections), the followers' next round, its restart (unfenced), and the round in
    which it checks its log against the new leader epoch and truncates what diverged. The seconds
    of each kind of round, and the Spark jobs."""
    made = _v1_and_v2(spark, root, partitions)
    rng = random.Random(7)
    kinds = ("election", "after election", "restart and truncation")
    seconds = {v: {k: [] for k in kinds} for v in made}
    jobs_of = {v: {k: [] for k in kinds} for v in made}

    def step(i: int, kind: str, before, advance_ms: int) -> None:
        for version in (("v1", "v2") if i % 2 == 0 else ("v2", "v1")):
            clock, cluster = made[version]
            before(cluster)
            clock.advance(advance_ms)
            with JobCounter(spark) as jobs:
                started = time.perf_counter()
                cluster.run_round()
                seconds[version][kind].append(time.perf_counter() - started)
            jobs_of[version][kind].append(jobs.jobs)

    for i in range(rounds):
        leader = made["v1"][1].describe("bench").filter(F.col("partition") == 0).first()["leader"]
        others = [b for b in range(3) if b != leader]
        batch = [{"value": "v" * 100, "partition": rng.randrange(partitions)} for _ in range(records)]
        for version, (clock, cluster) in made.items():
            for b in others:
                cluster.pause_fetcher(b)
            cluster.produce("bench", batch, acks=1)  # only the leaders of broker `leader` keep theirs
            clock.advance(100)
            cluster.run_round()
            cluster.stop_broker(leader)
            for b in others:
                cluster.resume_fetcher(b)
        step(i, "election", lambda c: None, 9500)
        step(i, "after election", lambda c: c.produce("bench", batch, acks="all"), 100)
        step(i, "restart and truncation", lambda c: c.start_broker(leader), 100)
        for _, cluster in made.values():
            cluster.run_round()
    logs = {version: sorted(cluster.read("bench", replica=b, isolation="read_uncommitted").count() for b in range(3))
            for version, (_, cluster) in made.items()}
    return {"kinds": kinds,
            "median_s": {v: {k: statistics.median(xs) for k, xs in by.items()} for v, by in seconds.items()},
            "jobs_median": {v: {k: statistics.median(xs) for k, xs in by.items()} for v, by in jobs_of.items()},
            "rounds_s": seconds, "log_rows": logs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--fetchers", type=int, default=2, help="v2's buckets (num.replica.fetchers)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--throughput", type=int, default=0, metavar="RECORDS",
                        help="instead: one bulk produce of RECORDS replicated by one v2 round against a raw append")
    parser.add_argument("--clusters", action="store_true",
                        help="instead: two clusters, replication.round v1 and v2, rounds interleaved")
    parser.add_argument("--failover", action="store_true",
                        help="instead: two clusters, v1 and v2, a leader's crash, election, restart and truncation")
    args = parser.parse_args()
    spark = get_spark(app_name="replog-bench-control", extra={"spark.sql.shuffle.partitions": "2"})
    scratch = tempfile.mkdtemp(prefix="replog-bench-round-v2-")
    try:
        if args.failover:
            result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Spark {spark.version}",
                      "args": vars(args), **failover(spark, scratch, args.partitions, args.records, args.rounds)}
        elif args.clusters:
            result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Spark {spark.version}",
                      "args": vars(args), **clusters(spark, scratch, args.partitions, args.records, args.rounds)}
        elif args.throughput:
            result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Spark {spark.version}",
                      "args": vars(args),
                      **throughput(spark, os.path.join(scratch, "cluster"), args.partitions, args.throughput,
                                   args.fetchers)}
        else:
            result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Spark {spark.version}",
                      "args": vars(args),
                      **bench(spark, os.path.join(scratch, "cluster"), args.partitions, args.records, args.rounds,
                              args.fetchers)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.failover:
        for kind in result["kinds"]:
            v1, v2 = result["median_s"]["v1"][kind], result["median_s"]["v2"][kind]
            print(f"P = {args.partitions}, {kind} round: v1 {v1:.2f} s ({result['jobs_median']['v1'][kind]:.0f} jobs), "
                  f"v2 {v2:.2f} s ({result['jobs_median']['v2'][kind]:.0f} jobs), {v2 / v1:.2f}x")
        print(f"log rows per replica: {result['log_rows']}")
        out = args.out or f"benchmarks/round_v2_failover_p{args.partitions}.json"
    elif args.clusters:
        print(f"P = {args.partitions}, {args.records} records a round, Cluster.run_round: v1 "
              f"{result['v1_round_median_s']:.2f} s ({result['v1_jobs_median']:.0f} jobs), v2 "
              f"{result['v2_round_median_s']:.2f} s ({result['v2_jobs_median']:.0f} jobs), "
              f"{result['ratio_v2_over_v1']:.2f}x; HW sums {result['hw_sum']}, acked {result['results_acked']}")
        out = args.out or f"benchmarks/round_v2_clusters_p{args.partitions}.json"
    elif args.throughput:
        print(f"{args.throughput} records into {args.partitions} partitions: v2 {result['v2_s']:.2f} s "
              f"in {result['v2_rounds']} rounds "
              f"({result['v2_records_per_s']:.0f} records/s, {result['v2_mb_per_s']:.1f} MB/s), raw append "
              f"{statistics.median(result['raw_append_s']):.2f} s ({result['raw_records_per_s']:.0f} records/s), "
              f"v2 at {100 * result['v2_share_of_raw']:.0f}% of raw")
        out = args.out or f"benchmarks/round_v2_throughput_{args.throughput}.json"
    else:
        print(f"P = {args.partitions}, {args.records} records a round: today's round "
              f"{result['today_round_median_s']:.2f} s ({result['today_jobs_median']:.0f} jobs), v2 round "
              f"{result['v2_round_median_s']:.2f} s ({result['v2_jobs_median']:.0f} jobs), "
              f"{result['ratio_v2_over_today']:.2f}x")
        out = args.out or f"benchmarks/round_v2_p{args.partitions}.json"
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
