"""Where a failover round's Spark jobs come from: each job named by the code in pipeline/ that
started it.

    .venv/bin/python jobs/profile_failover.py [--partitions 100] [--rounds 1]

Runs jobs/bench_round.py's failover scenario (a leader stopped with records only it holds, the
round that fences it and elects, the next round, the round after its restart in which its replicas
check their logs against the new leader epoch and truncate), and a steady round beside them (one
acks=all request of the same records, nothing failing). While a round runs, every call from Python
into the JVM first sets the calling thread's Spark job description to the innermost frames of
pipeline/ on the Python stack, so each job the call starts carries the call site that started it,
also the jobs of the round's commit threads and of Delta's own threads (they inherit it). After
the round the scheduler's status store gives each job's description and wall seconds.

Prints, per kind of round, its seconds, its jobs and the call sites by job count, and writes
benchmarks/profile_failover_p<P>.json. Job counts do not depend on the machine's load; seconds do
(a job's seconds overlap other jobs' when commits run from threads).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections import defaultdict

import py4j.java_gateway

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pipeline import get_spark  # noqa: E402
from bench_round import FAILOVER_KINDS, failover, machine, save  # noqa: E402  (jobs/ is scripts, not a package)

PIPELINE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pipeline") + os.sep
FRAMES = 3  # the innermost frames of pipeline/ a call site names


def call_site() -> str:
    """The innermost FRAMES frames of pipeline/ on this thread's stack, innermost first."""
    frames = [f for f in traceback.extract_stack() if f.filename.startswith(PIPELINE)]
    if not frames:
        return "(outside pipeline/)"
    return " < ".join(f"{os.path.relpath(f.filename, PIPELINE)}:{f.lineno}" for f in reversed(frames[-FRAMES:]))


class JobSites:
    """Tags the Spark jobs started inside a `with` block with their Python call sites."""

    def __init__(self, spark) -> None:
        self.jsc = spark.sparkContext._jsc
        self.sc = self.jsc.sc()
        self.original = py4j.java_gateway.JavaMember.__call__
        self.inside = threading.local()

    def _next_job(self) -> int:
        return int(str(self.original(self.sc.dagScheduler().nextJobId)))

    def __enter__(self):
        original, describe, inside = self.original, self.jsc.setJobDescription, self.inside

        def tagged(member, *args):
            if getattr(inside, "busy", False):
                return original(member, *args)
            inside.busy = True
            try:
                original(describe, call_site())
                return original(member, *args)
            finally:
                original(describe, None)
                inside.busy = False

        self.first = self._next_job()
        py4j.java_gateway.JavaMember.__call__ = tagged
        return self

    def __exit__(self, *exc) -> None:
        py4j.java_gateway.JavaMember.__call__ = self.original
        self.end = self._next_job()

    def jobs(self) -> list[tuple[str, float]]:
        """(call site, wall seconds) of each job the block started, once they have ended."""
        store, out = self.sc.statusStore(), []
        for job in range(self.first, self.end):
            for _ in range(100):  # (a job's end reaches the store shortly after its action returns)
                data = store.job(job)
                if data.completionTime().isDefined():
                    break
                time.sleep(0.05)
            description = data.description()
            seconds = ((data.completionTime().get().getTime() - data.submissionTime().get().getTime()) / 1000
                       if data.completionTime().isDefined() and data.submissionTime().isDefined() else 0.0)
            out.append((description.get() if description.isDefined() else "(untagged)", seconds))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1, help="times the failover scenario runs")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    spark = get_spark(app_name="replog-profile-failover")
    scratch = tempfile.mkdtemp(prefix="replog-profile-failover-")
    kinds = ("steady", *FAILOVER_KINDS)
    seen = {k: {"seconds": [], "jobs": [], "sites": defaultdict(lambda: [0, 0.0])} for k in kinds}

    def measure(kind: str, cluster) -> tuple[float, int]:
        with JobSites(spark) as sites:
            started = time.perf_counter()
            cluster.run_round()
            took = time.perf_counter() - started
        jobs = sites.jobs()
        seen[kind]["seconds"].append(took)
        seen[kind]["jobs"].append(len(jobs))
        for site, seconds in jobs:
            seen[kind]["sites"][site][0] += 1
            seen[kind]["sites"][site][1] += seconds
        return took, len(jobs)

    def with_steady(kind: str, cluster) -> tuple[float, int]:
        result = measure(kind, cluster)
        if kind == FAILOVER_KINDS[-1]:  # back to a steady cluster: one round more, then one measured
            cluster.clock.advance(100)
            cluster.run_round()
            cluster.produce("bench", [{"value": "v" * 100, "partition": p % args.partitions}
                                      for p in range(args.records)], acks="all")
            cluster.clock.advance(100)
            measure("steady", cluster)
        return result

    try:
        failover(spark, os.path.join(scratch, "cluster"), args.partitions, args.records, args.rounds, with_steady)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = {"command": " ".join(["jobs/profile_failover.py", *sys.argv[1:]]), "machine": machine(spark),
              "args": vars(args), "kinds": {}}
    for kind in kinds:
        rounds = len(seen[kind]["jobs"])
        sites = sorted(seen[kind]["sites"].items(), key=lambda kv: (-kv[1][0], -kv[1][1]))
        result["kinds"][kind] = {
            "seconds": seen[kind]["seconds"], "jobs": seen[kind]["jobs"],
            "sites": [{"site": site, "jobs_per_round": n / rounds, "job_seconds_per_round": s / rounds}
                      for site, (n, s) in sites]}
        print(f"\n{kind}: {max(seen[kind]['jobs'])} jobs at most, {min(seen[kind]['seconds']):.2f} s at least "
              f"({rounds} rounds)")
        for site, (n, s) in sites:
            print(f"  {n / rounds:5.1f} jobs {s / rounds:6.2f} s  {site}")
    save(result, args.out or f"benchmarks/profile_failover_p{args.partitions}.json")


if __name__ == "__main__":
    main()
