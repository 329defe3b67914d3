"""Benchmarks: figures come from here, never from timed tests.

    make bench                                   # the fetch-sessions scenario with its defaults
    .venv/bin/python jobs/benchmark.py --scenario fetch-sessions --partitions 1000 10000 --rounds 20
    spark-submit --properties-file conf/spark-defaults.conf jobs/benchmark.py --scenario fetch-sessions

Scenario `fetch-sessions` (issue 4, KIP-227): 3 brokers, RF 3, one topic of P partitions. For each
P, an incremental-mode and a full-mode cluster run side by side, round for round (interleaved, so
a noisy neighbour hits both alike). Each measured round first produces one record to each of k
random partitions (the same partitions for both modes), then runs the round; after the active
rounds, the producers stop, the clusters settle, and idle rounds are measured. Reported: medians
of round seconds, the fetch request / response partitions per round, and the driver JVM's peak
RSS (VmHWM) after each P. Writes benchmarks/fetch_sessions.json and .png and prints the README
table (`--readme` also rewrites it in README.md between its benchmark markers).
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

from pipeline import Cluster, ManualClock, get_spark

MARK_BEGIN = "<!-- benchmark:fetch-sessions -->"
MARK_END = "<!-- /benchmark:fetch-sessions -->"
MODES = ("incremental", "full")
STEP_MS = 500  # the default trigger interval: replica.fetch.wait.max.ms


def jvm_peak_rss_mb(spark) -> float | None:
    """The driver JVM's peak resident set (Linux /proc), MB."""
    try:
        pid = spark._jvm.java.lang.ProcessHandle.current().pid()
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, AttributeError):
        return None
    return None


def timed_round(cluster: Cluster) -> tuple[float, object]:
    started = time.perf_counter()
    report = cluster.run_round()
    return time.perf_counter() - started, report


def fetch_sessions(spark, partitions: int, changed: int, rounds: int, warm_up: int, idle_rounds: int,
                   seed: int) -> dict:
    rng = random.Random(seed)
    workdir = tempfile.mkdtemp(prefix=f"bench-{partitions}-")
    clock = ManualClock(start_ms=0)
    clusters = {}
    try:
        for mode in MODES:
            cluster = Cluster.create(spark, os.path.join(workdir, mode), brokers=3, clock=clock,
                                     config={"replication.fetch.mode": mode})
            cluster.create_topic("bench", partitions=partitions, replication_factor=3)
            clusters[mode] = cluster
        samples = {mode: {"active": [], "idle": [], "request": [], "response": []} for mode in MODES}
        for i in range(warm_up + rounds):
            chosen = rng.sample(range(partitions), min(changed, partitions))
            clock.advance(STEP_MS)
            for mode in MODES:
                clusters[mode].produce("bench", [{"value": "v" * 100, "partition": p} for p in chosen], acks=1)
                seconds, report = timed_round(clusters[mode])
                if i >= warm_up:
                    samples[mode]["active"].append(seconds)
                    samples[mode]["request"].append(report.fetch_request_partitions)
                    samples[mode]["response"].append(report.fetch_response_partitions)
            print(f"P={partitions} round {i + 1}/{warm_up + rounds}: "
                  + ", ".join(f"{m} {samples[m]['active'][-1]:.2f} s" for m in MODES if samples[m]["active"]),
                  flush=True)
        for _ in range(5):  # let the last changes settle
            clock.advance(STEP_MS)
            for mode in MODES:
                clusters[mode].run_round()
        for _ in range(idle_rounds):
            clock.advance(STEP_MS)
            for mode in MODES:
                seconds, _ = timed_round(clusters[mode])
                samples[mode]["idle"].append(seconds)
        out = {"partitions": partitions, "changed_per_round": changed, "rounds": rounds, "idle_rounds": idle_rounds}
        for mode in MODES:
            s = samples[mode]
            out[mode] = {
                "active_median_s": statistics.median(s["active"]),
                "idle_median_s": statistics.median(s["idle"]),
                "request_partitions_median": statistics.median(s["request"]),
                "response_partitions_median": statistics.median(s["response"]),
                "active_s": s["active"], "idle_s": s["idle"],
            }
        out["driver_jvm_peak_rss_mb"] = jvm_peak_rss_mb(spark)
        return out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def ratios(results: list[dict]) -> dict:
    small, large = results[0], results[-1]
    inc, full = "incremental", "full"
    return {
        "incremental_large_over_small": large[inc]["active_median_s"] / small[inc]["active_median_s"],
        "full_over_incremental_at_largest": large[full]["active_median_s"] / large[inc]["active_median_s"],
        "idle_large_over_small": large[inc]["idle_median_s"] / small[inc]["idle_median_s"],
        "small_partitions": small["partitions"], "large_partitions": large["partitions"],
    }


def table(data: dict) -> str:
    lines = [f"Machine: {data['machine']}. Command: `{data['command']}`.", "",
             "| P | incremental round (s) | full round (s) | idle round (s) | request partitions inc / full "
             "| response partitions inc / full | driver JVM peak RSS (MB) |",
             "|---|---|---|---|---|---|---|"]
    for r in data["results"]:
        inc, full = r["incremental"], r["full"]
        rss = f"{r['driver_jvm_peak_rss_mb']:.0f}" if r["driver_jvm_peak_rss_mb"] else "-"
        lines.append(f"| {r['partitions']:,} | {inc['active_median_s']:.2f} | {full['active_median_s']:.2f} "
                     f"| {inc['idle_median_s']:.2f} | {inc['request_partitions_median']:.0f} / "
                     f"{full['request_partitions_median']:.0f} | {inc['response_partitions_median']:.0f} / "
                     f"{full['response_partitions_median']:.0f} | {rss} |")
    q = data["ratios"]
    lines += ["", f"Incremental at P={q['large_partitions']:,} / at P={q['small_partitions']:,}: "
                  f"{q['incremental_large_over_small']:.2f}x (target <= 1.5x); full / incremental at "
                  f"P={q['large_partitions']:,}: {q['full_over_incremental_at_largest']:.2f}x (target >= 10x); idle at "
                  f"P={q['large_partitions']:,} / at P={q['small_partitions']:,}: {q['idle_large_over_small']:.2f}x "
                  f"(target <= 1.2x)."]
    return "\n".join(lines)


def plot(data: dict, path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (make bench installs it): no plot")
        return False
    ps = [r["partitions"] for r in data["results"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ps, [r["incremental"]["active_median_s"] for r in data["results"]], "o-", label="incremental, active")
    ax.plot(ps, [r["full"]["active_median_s"] for r in data["results"]], "s-", label="full, active")
    ax.plot(ps, [r["incremental"]["idle_median_s"] for r in data["results"]], "^--", label="incremental, idle")
    ax.set_xscale("log")
    ax.set_xlabel("partitions (P)")
    ax.set_ylabel("round median (s)")
    ax.set_title(f"KIP-227 rounds, k={data['results'][0]['changed_per_round']} changed partitions per round")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def update_readme(path: str, text: str) -> None:
    with open(path) as f:
        readme = f.read()
    begin, end = readme.index(MARK_BEGIN) + len(MARK_BEGIN), readme.index(MARK_END)
    with open(path, "w") as f:
        f.write(readme[:begin] + "\n" + text + "\n" + readme[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=["fetch-sessions"], default="fetch-sessions")
    parser.add_argument("--partitions", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--changed", type=int, default=100, help="partitions produced to per round (k)")
    parser.add_argument("--rounds", type=int, default=20, help="measured active rounds per P")
    parser.add_argument("--warm-up", type=int, default=3)
    parser.add_argument("--idle-rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=227)
    parser.add_argument("--out", default="benchmarks/fetch_sessions.json")
    parser.add_argument("--readme", action="store_true", help="rewrite the README's table")
    args = parser.parse_args(argv)
    spark = get_spark(extra={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"})
    results = [fetch_sessions(spark, p, args.changed, args.rounds, args.warm_up, args.idle_rounds, args.seed)
               for p in sorted(args.partitions)]
    data = {
        "scenario": args.scenario,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                   f"Spark {spark.version}, local[*]",
        "command": "jobs/benchmark.py " + " ".join(
            [f"--partitions {' '.join(map(str, sorted(args.partitions)))}", f"--changed {args.changed}",
             f"--rounds {args.rounds}", f"--warm-up {args.warm_up}", f"--idle-rounds {args.idle_rounds}"]),
        "results": results,
        "ratios": ratios(results),
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(data, f, indent=2)
    text = table(data)
    print(text)
    plot(data, os.path.splitext(args.out)[0] + ".png")
    if args.readme:
        update_readme(os.path.join(os.path.dirname(__file__), "..", "README.md"), text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
