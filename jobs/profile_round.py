"""Where an active round spends its time, and what one idempotent Delta commit costs.

    .venv/bin/python jobs/profile_round.py [--partitions 100] [--records 1000] [--rounds 10]
    spark-submit jobs/profile_round.py ...

Part 1 runs rounds on a fresh cluster (3 brokers, RF 3, one topic of `--partitions`, one acks=all
produce request of `--records` 100-byte records before every round: by default issue 7's "1,000
records into 100 partitions") and prints the median seconds of each driver-side phase (the
round's report, `RoundReport.phases`) and the median Spark jobs of a round, over the rounds after
the first two (warm-up).

Part 2 appends the same 300 rows to one Delta table, alternating two ways of making the commit
recognisable on replay: Delta's txnAppId/txnVersion writer options (Delta then rebuilds the
table's whole snapshot state to look the transaction up) and a userMetadata tag (what
`pipeline.storage` does). Same session, interleaved, medians and their ratio.

Part 3 is what a pass over the partition state the round carries (pinned, one row per partition)
costs at this size: a filtered count of it, and pinning a copy of it, medians of 3. A working set
(the control job over only the partitions that can change, the others' rows kept) pays at least
one of them a round.

Also each Spark job's wall seconds, in the order a round runs them (the scheduler's status store;
medians by place over the rounds after the warm-up).

Writes benchmarks/profile_round.json next to printing it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import sys
import time

from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock, get_spark

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_round import JobCounter, medians, save  # noqa: E402  (jobs/ is scripts, not a package)

WARM_UP = 2


def job_seconds(spark, first: int, end: int) -> list[float]:
    """The wall seconds of Spark jobs first..end-1 (the scheduler's status store, which keeps them
    with the UI off too)."""
    store, seconds = spark.sparkContext._jsc.sc().statusStore(), []
    for job in range(first, end):
        data = store.job(job)
        if data.submissionTime().isDefined() and data.completionTime().isDefined():
            seconds.append((data.completionTime().get().getTime() - data.submissionTime().get().getTime()) / 1000)
    return seconds


def state_passes(spark, state, repeats: int = 3) -> dict:
    """A filtered count of the pinned partition state, and a pinned copy of it: medians."""
    scans, pins = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        state.filter(F.col("leader") < -1).count()
        scans.append(time.perf_counter() - started)
        started = time.perf_counter()
        state.localCheckpoint().count()
        pins.append(time.perf_counter() - started)
    return {"rows": state.count(), "filtered_count_median_s": statistics.median(scans),
            "pinned_copy_median_s": statistics.median(pins)}


def profile_rounds(spark, root: str, partitions: int, records: int, rounds: int) -> dict:
    clock = ManualClock(start_ms=0)
    cluster = Cluster.create(spark, root, brokers=3, clock=clock)
    cluster.create_topic("profile", partitions=partitions, replication_factor=3)
    totals, phases, jobs, seconds = [], [], [], []
    for i in range(rounds):
        cluster.produce("profile", [{"key": f"k{j}", "value": "v" * 100} for j in range(records)], acks="all")
        clock.advance(100)
        with JobCounter(spark) as counted:
            started = time.perf_counter()
            report = cluster.run_round()
            took = time.perf_counter() - started
        if i >= WARM_UP:
            totals.append(took)
            phases.append(report.phases)
            jobs.append(counted.jobs)
            seconds.append(job_seconds(spark, counted.start, counted.start + counted.jobs))
    by_place = [statistics.median(s[k] for s in seconds if len(s) > k) for k in range(max(map(len, seconds)))]
    return {"round_median_s": statistics.median(totals), "phase_median_s": medians(phases),
            "jobs_median": statistics.median(jobs), "job_median_s": by_place,
            # (the round's carry: the state the next round starts from; a profiler may look inside)
            "state_passes": state_passes(spark, cluster.core.carry.state)}


def compare_commits(spark, path: str, repeats: int = 10) -> dict:
    rows = spark.range(300).selectExpr("id", "repeat('v', 100) AS value")
    rows.write.format("delta").save(path)
    txn, tagged = [], []
    for i in range(1, repeats + 1):
        started = time.perf_counter()
        rows.write.format("delta").mode("append").option("txnAppId", "profile").option("txnVersion", i).save(path)
        txn.append(time.perf_counter() - started)
        started = time.perf_counter()
        rows.write.format("delta").mode("append").option("userMetadata", f"replog-round={i};step=main").save(path)
        tagged.append(time.perf_counter() - started)
    t, u = statistics.median(txn), statistics.median(tagged)
    return {"txn_append_median_s": t, "tagged_append_median_s": u, "ratio_txn_over_tagged": t / u}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/profile_round.json")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable)")
    args = parser.parse_args()

    extra = {"spark.sql.shuffle.partitions": "1", **dict(c.split("=", 1) for c in args.conf)}
    spark = get_spark(app_name="replog-profile", extra=extra)
    scratch = tempfile.mkdtemp(prefix="replog-profile-")
    try:
        result = {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, "
                       f"Spark {spark.version}",
            "args": vars(args),
            "rounds": profile_rounds(spark, os.path.join(scratch, "cluster"), args.partitions, args.records,
                                     args.rounds),
            "commits": compare_commits(spark, os.path.join(scratch, "commits")),
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"active round median {result['rounds']['round_median_s']:.2f} s, "
          f"{result['rounds']['jobs_median']:.0f} Spark jobs "
          f"({args.partitions} partitions, {args.records} records per round, RF 3)")
    for name, seconds in result["rounds"]["phase_median_s"].items():
        print(f"  {seconds:6.2f} s  {name}")
    print("  Spark jobs in order: " + ", ".join(f"{s:.2f}" for s in result["rounds"]["job_median_s"]) + " s")
    p = result["rounds"]["state_passes"]
    print(f"a pass over the pinned state ({p['rows']:,} rows): filtered count {p['filtered_count_median_s']:.2f} s, "
          f"pinned copy {p['pinned_copy_median_s']:.2f} s")
    c = result["commits"]
    print(f"append with txnAppId {c['txn_append_median_s']:.2f} s, tagged {c['tagged_append_median_s']:.2f} s "
          f"(ratio {c['ratio_txn_over_tagged']:.1f}x)")
    save(result, args.out)


if __name__ == "__main__":
    main()
