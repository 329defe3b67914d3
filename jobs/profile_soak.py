"""Where a soak seed's time goes, and what the checker's snapshot costs read by read or at once.

    .venv/bin/python jobs/profile_soak.py [--seed 901] [--events 60] [--repeats 9]

Part 1 runs one seed of the fault-injection soak (tests/soak/, as `make soak` does) and splits its
wall time into the cluster's rounds (`Cluster.run_round`), the checker's snapshots after them
(`Checker.snapshot`) and the rest (produce requests, admin calls, the soak's own reads, the heal).
It splits the rounds again into those that ran the controller's wave (elections, epoch checks,
reassignments: pipeline/round/controller.py) and the others, with the wave's own time, and each
kind by the phases the round times itself (RoundReport.phases); the rest by event (each event's
own time, less the rounds and snapshots inside it), and the rounds' steps on the driver around
the round proper (the lease, the failed-location check, the controller's inputs). With
`--jobs` it also counts each round's Spark jobs by the pipeline/ call site that started them
(jobs/profile_failover.py's tagging; it slows every call into the JVM, so its seconds are not
comparable with a run without it).

Part 2, on the cluster the seed left, takes the checker's snapshot alternately with its reads one
after another (`Checker.reads_at_once = 1`) and from threads (the default), checks that both read
the same, and prints the medians and their ratio.

Writes benchmarks/profile_soak.json next to printing it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests.soak
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pipeline import Cluster, get_spark  # noqa: E402
from pipeline import brokers  # noqa: E402
from pipeline.core import ClusterCore  # noqa: E402
from pipeline.metadata_cache import MetadataCache  # noqa: E402
from pipeline.round import driver, run as round_run  # noqa: E402
from pipeline.storage.lease import Lease  # noqa: E402
from tests.soak.checker import Checker  # noqa: E402
from tests.soak.soak import Soak  # noqa: E402
from bench_round import save  # noqa: E402  (jobs/ is scripts, not a package)
from profile_failover import JobSites  # noqa: E402


# what pipeline/round/driver.py does around the round proper (run_active_round), each timed
DRIVER_STEPS = ((Lease, "hold"), (brokers, "halt_failed_brokers"), (ClusterCore, "reload_config"),
                (MetadataCache, "fetch_states"), (driver, "_controller_inputs"), (driver, "_inputs"),
                (driver, "run_active_round"), (driver, "idle_round"), (driver, "_after_controller"),
                (ClusterCore, "record_quota"))


class Stopwatch:
    """Wall seconds and calls spent in methods it wraps (on the class, so every instance)."""

    def __init__(self, spark=None):
        self.seconds, self.calls = defaultdict(float), defaultdict(int)
        self.spark = spark  # set: each round's Spark jobs are counted by call site
        self.jobs = defaultdict(list)  # round label -> jobs of each round
        self.sites = defaultdict(lambda: defaultdict(int))  # round label -> call site -> jobs
        self.phases = defaultdict(lambda: defaultdict(float))  # round label -> phase -> seconds (its reports')
        self.nested = 0.0  # seconds in the rounds and snapshots so far
        self.events = defaultdict(lambda: [0.0, 0])  # soak event -> [its own seconds, calls]
        self.driver = defaultdict(lambda: [0.0, 0])  # a round's driver step -> [seconds, calls]

    def wrap(self, owner, name: str, label: str, into: dict | None = None, own_time: bool = False) -> None:
        """Times `owner.name` (a class's method or a module's function) under `label`: in the
        split (rounds, snapshots), or in `into` (label -> [seconds, calls]); with `own_time`, less
        the rounds and snapshots inside the call."""
        function = getattr(owner, name)

        def timed(*args, **kwargs):
            started, nested = time.perf_counter(), self.nested
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                if into is None:
                    self._split(label, elapsed, nested)
                else:
                    into[label][0] += elapsed - (self.nested - nested if own_time else 0)
                    into[label][1] += 1
        setattr(owner, name, timed)

    def _split(self, label: str, elapsed: float, nested: float) -> None:
        """A call of `elapsed` seconds under `label` in the split, that began when `nested` seconds
        were in the split: inside it, what it called counts once (its own time includes theirs)."""
        self.seconds[label] += elapsed
        self.calls[label] += 1
        self.nested = nested + elapsed

    def split_rounds(self) -> None:
        """Rounds (Cluster.run_round) told apart by whether they ran the controller's wave, and the
        wave's own time (run.controller_wave, as the round calls it)."""
        wave, in_wave = round_run.controller_wave, []

        def timed_wave(*args, **kwargs):
            started = time.perf_counter()
            try:
                return wave(*args, **kwargs)
            finally:
                in_wave.append(time.perf_counter() - started)
        round_run.controller_wave = timed_wave
        run_round = Cluster.run_round

        def timed_round(*args, **kwargs):
            in_wave.clear()
            report, sites, started, nested = None, None, time.perf_counter(), self.nested
            try:
                with JobSites(self.spark) if self.spark is not None else contextlib.nullcontext() as sites:
                    report = run_round(*args, **kwargs)
                return report
            finally:
                label = "rounds_with_wave" if in_wave else "rounds_without_wave"
                if sites is not None:
                    jobs = sites.jobs()
                    self.jobs[label].append(len(jobs))
                    for site, _ in jobs:
                        self.sites[label][site] += 1
                self._split(label, time.perf_counter() - started, nested)
                for phase, seconds in (report.phases if report is not None else {}).items():
                    self.phases[label][phase] += seconds
                if in_wave:
                    self.seconds["waves"] += sum(in_wave)
                    self.calls["waves"] += 1
        Cluster.run_round = timed_round


def snapshot_seconds(checker: Checker, repeats: int) -> dict:
    """The snapshot read by read and at once, alternating; medians and their ratio."""
    default, times = checker.reads_at_once, {1: [], checker.reads_at_once: []}
    try:
        for _ in range(repeats):
            snaps = []
            for at_once in times:
                checker.reads_at_once = at_once
                started = time.perf_counter()
                snaps.append(checker.snapshot(fresh=True))
                times[at_once].append(time.perf_counter() - started)
            if snaps[0] != snaps[1]:
                raise AssertionError("the snapshot read at once differs from the one read by read")
    finally:
        checker.reads_at_once = default
    one_by_one, at_once = statistics.median(times[1]), statistics.median(times[default])
    return {"one_after_another_median_s": round(one_by_one, 3), "at_once_median_s": round(at_once, 3),
            "reads_at_once": default, "ratio": round(at_once / one_by_one, 2), "repeats": repeats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=901)
    parser.add_argument("--events", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--jobs", action="store_true", help="count each round's Spark jobs by call site")
    parser.add_argument("--out", default="benchmarks/profile_soak.json")
    args = parser.parse_args()
    spark = get_spark(extra={"spark.sql.shuffle.partitions": "1", "spark.sql.adaptive.enabled": "false",
                             "spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    watch = Stopwatch(spark if args.jobs else None)
    watch.split_rounds()
    watch.wrap(Checker, "snapshot", "snapshots")
    watch.wrap(Checker, "_read_snapshot", "snapshot_reads")  # (the snapshots that read the tables)
    for name in (n for n in dir(Soak) if n.startswith("do_")):  # the rest: each event's own time
        watch.wrap(Soak, name, name[3:], into=watch.events, own_time=True)
    for owner, name in DRIVER_STEPS:
        watch.wrap(owner, name, name.lstrip("_"), into=watch.driver)
    with tempfile.TemporaryDirectory(prefix="profile-soak-") as root:
        started = time.perf_counter()
        soak = Soak(spark, f"{root}/cluster", args.seed).run(args.events)
        total = time.perf_counter() - started
        split = {label: {"seconds": round(watch.seconds[label], 1), "calls": watch.calls[label],
                         "share": round(watch.seconds[label] / total, 3)}
                 for label in ("rounds_with_wave", "waves", "rounds_without_wave", "snapshots", "snapshot_reads")}
        rest = total - sum(s for label, s in watch.seconds.items() if label not in ("waves", "snapshot_reads"))
        split["rest"] = {"seconds": round(rest, 1), "share": round(rest / total, 3)}
        print(f"seed {args.seed}, {args.events} events: {soak.rounds} rounds, {total:.0f} s")
        for label, part in split.items():
            print(f"  {label:20s} {part['seconds']:7.1f} s  {100 * part['share']:5.1f}%"
                  + (f"  ({part['calls']} calls)" if "calls" in part else ""))
        phases = {label: {phase: round(seconds, 1) for phase, seconds in sorted(by.items(), key=lambda kv: -kv[1])}
                  for label, by in watch.phases.items()}
        for label, by in phases.items():
            print(f"{label} by phase (the rounds' own timers):")
            for phase, seconds in by.items():
                print(f"  {seconds:7.1f} s  {phase}")
        events, driver_steps = ({label: {"seconds": round(seconds, 1), "calls": calls}
                                 for label, (seconds, calls) in sorted(times.items(), key=lambda kv: -kv[1][0])}
                                for times in (watch.events, watch.driver))
        for title, times in (("the events' own time (less their rounds and snapshots)", events),
                             ("a round's steps on the driver (run_active_round is the round proper)", driver_steps)):
            print(f"{title}:")
            for label, part in times.items():
                print(f"  {part['seconds']:7.1f} s  {label} ({part['calls']} calls)")
        jobs = {label: {"rounds": len(counts), "median": statistics.median(counts), "max": max(counts),
                        "sites": dict(sorted(watch.sites[label].items(), key=lambda kv: -kv[1])[:25])}
                for label, counts in watch.jobs.items()}
        for label, part in jobs.items():
            print(f"{label}: {part['rounds']} rounds, jobs median {part['median']}, max {part['max']}")
            for site, count in list(part["sites"].items())[:12]:
                print(f"  {count:5d}  {site}")
        snapshot = snapshot_seconds(soak.checker, args.repeats)
        print(f"snapshot: one read after another {snapshot['one_after_another_median_s']:.2f} s, "
              f"{snapshot['reads_at_once']} at once {snapshot['at_once_median_s']:.2f} s "
              f"(ratio {snapshot['ratio']}, medians of {args.repeats})")
    save({"seed": args.seed, "events": args.events, "rounds": soak.rounds, "seconds": round(total, 1),
          "split": split, "phases": phases, "event_seconds": events, "driver": driver_steps, **({"jobs": jobs} if args.jobs else {}), "snapshot": snapshot,
          "machine": f"{platform.machine()}, {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d")}, args.out)


if __name__ == "__main__":
    main()
