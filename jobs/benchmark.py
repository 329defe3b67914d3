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
table (`--readme` also rewrites it in docs/benchmarks.md between its benchmark markers).

Scenario `throughput` (issue 7, target 1): N records of V-byte values over P partitions (3 brokers,
RF 3, acks=1), end to end: from `produce()` of one DataFrame into the inbox until every replica
holds every record (nothing pending, every partition settled). Side by side, in the same Spark
session and the same run: the raw write limit, the same rows appended once to one Delta table.
Rounds advance a manual cluster clock by the default trigger interval (500 ms), so the ISR rules
see rounds, not this machine's speed. Writes benchmarks/throughput.json.

    .venv/bin/python jobs/benchmark.py --scenario throughput --records 5000000 --partitions 100

Scenario `freshness` (issue 7, target 2): the streaming job (`spark-submit jobs/replicate.py`, its
default trigger) runs in its own process on a cluster of P partitions (3 brokers, RF 3) while this
process produces R records per second (one produce() per second, random partitions, acks=1) and
polls `SELECT ... FROM replog.committed` for them, back to back (or `--poll-pause` seconds apart:
the polls share the 2 cores with the job). Per produce: seconds from produce() returning to the end
of the first poll that sees all of its records (an upper bound; each poll's own time is in the
JSON). The producer starts once the job has run its first 3 rounds (the first reads every
partition's metadata and state), and runs in a thread of its own, on its one-second schedule; the
polls run in the main thread. When one produce() takes longer than a second the producer falls
behind the rate asked, and the table shows the rate sent. Writes benchmarks/freshness.json.

    .venv/bin/python jobs/benchmark.py --scenario freshness --partitions 10000 --rate 1000 --seconds 180

Scenario `maintenance` (issue 7, target 4: the job keeps its Delta tables healthy): a cluster of P
partitions (3 brokers, RF 3) runs N rounds of steady traffic (k records into k random partitions
each round); then one table maintenance pass (`Cluster.maintain`, pipeline/storage/maintenance.py) with the
job's defaults. Reported: the pass's seconds; the files in the snapshots of the logs and tables
and in their `_delta_log` directories before and after; the median seconds of `storage.version()`
(a `_delta_log` listing) of the results table over 20 calls, and of W rounds just before and just
after the pass. Writes benchmarks/maintenance.json.

    .venv/bin/python jobs/benchmark.py --scenario maintenance --partitions 100 --rounds 100 --changed 100

Scenario `produce` (issue 7, target 1: getting a bulk load into the inbox): produce() of a DataFrame
of N records (V-byte values, explicit partitions, as the throughput scenario's) writes the inbox
with compiled expressions when Spark estimates it at produce.BULK_BYTES_FOR_CODEGEN or more, where
the session interprets them for rounds. Side by side, repeated
R times (`--rounds`) and interleaved: the inbox write as produce() does it, the same write with
the session's interpreted expressions, and the raw append of the rows to one Delta table both
ways. Reported: medians and the ratio. Writes benchmarks/produce.json.

    .venv/bin/python jobs/benchmark.py --scenario produce --records 1000000 --rounds 3

Scenario `endurance` (issue 7, target 4): a cluster of P partitions (3 brokers, RF 3) runs N
rounds of steady traffic (k records into k random partitions before each round), each followed by
what the replication job does after a round: Delta table maintenance when log.maintenance.interval.ms
has passed, the log cleaner when log.cleaner.backoff.ms has. The cluster clock advances by each
round's own wall time (at least the 500 ms trigger), as the job's does with rounds back to back.
Reported: the median round of rounds 500-1000 and of the last 500 (a run under 1,500 rounds: 5-10%
and the last 5% of it), their ratio (target <= 1.2x), the maintenance passes, and every 100 rounds
the median of those 100, the driver JVM's RSS and the files in the tables' snapshots and
`_delta_log` directories. Writes benchmarks/endurance.json every 100 rounds.

    .venv/bin/python jobs/benchmark.py --scenario endurance --partitions 100 --rounds 10000 --changed 100

Scenario `cli` (the `replog` command line's start): each command is its own process, a JVM and a
Spark session of its own, as an operator types it. A root is made with the command line itself
(cluster --create, topics --create with P partitions, produce of 100 lines, run --until-committed,
each timed once); then each command below runs R times (`--rounds`), interleaved, with nothing
else running in this process (no Spark session here). Reported: the median, lowest and highest
wall seconds of each. Writes benchmarks/cli.json.

    .venv/bin/python jobs/benchmark.py --scenario cli --partitions 100 --rounds 5

Scenario `front-door` (issue 51): a stock Kafka client (confluent-kafka) through the front door
(`Cluster.serve(run_rounds=True)`) on a cluster of P partitions (3 brokers, RF 3): an idempotent
acks=all producer's records/s for N records of V bytes, then `--rounds` records one at a time,
each timed from the send to its acknowledgement and to a consumer's receipt (produce-to-visible).
Writes benchmarks/front_door.json (jobs/bench_front_door.py).

    .venv/bin/python jobs/benchmark.py --scenario front-door --records 20000 --partitions 4 --rounds 20
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (jobs/ is scripts: its siblings)

from pipeline import get_spark  # noqa: E402
from bench_job import (_job_rss_line, _waited_line, cli_run, cli_table, endurance_figures,  # noqa: E402
                       endurance_run, endurance_table, endurance_windows, freshness, freshness_table, maintenance_run,
                       maintenance_table, rounds_waited)
from bench_front_door import front_door_run, front_door_table  # noqa: E402
from bench_rounds import (fetch_sessions, job_jvm_peak_rss_mb, plot, produce_run, produce_table,  # noqa: E402
                          ratios, table, throughput, throughput_table)

# (the arithmetic tests/test_benchmark_figures.py checks, from the scenarios' modules)
__all__ = ["main", "rounds_waited", "endurance_figures", "endurance_windows", "job_jvm_peak_rss_mb", "cli_table",
           "_job_rss_line", "_waited_line"]


def update_readme(path: str, text: str, scenario: str) -> None:
    mark_begin, mark_end = f"<!-- benchmark:{scenario} -->", f"<!-- /benchmark:{scenario} -->"
    with open(path) as f:
        readme = f.read()
    begin, end = readme.index(mark_begin) + len(mark_begin), readme.index(mark_end)
    with open(path, "w") as f:
        f.write(readme[:begin] + "\n" + text + "\n" + readme[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="fetch-sessions", choices=[
        "fetch-sessions", "throughput", "freshness", "maintenance", "produce", "endurance", "cli", "front-door"])
    parser.add_argument("--rate", type=int, default=1000, help="freshness: records produced per second")
    parser.add_argument("--seconds", type=int, default=180, help="freshness: how long the producer runs")
    parser.add_argument("--poll-pause", type=float, default=0.0,
                        help="freshness: seconds between one poll's end and the next poll (0: back to back)")
    parser.add_argument("--records", type=int, default=5_000_000, help="throughput: records produced")
    parser.add_argument("--value-bytes", type=int, default=100, help="throughput: bytes per value")
    parser.add_argument("--max-rounds", type=int, default=500, help="throughput: give up after this many")
    parser.add_argument("--partitions", type=int, nargs="+",
                        help="fetch-sessions: P values (default 1000 10000 100000); throughput: one P (default 100)")
    parser.add_argument("--changed", type=int, default=100, help="partitions produced to per round (k)")
    parser.add_argument("--rounds", type=int, default=20, help="measured active rounds per P (maintenance: rounds "
                        "before the pass; produce: repeats; endurance: rounds)")
    parser.add_argument("--warm-up", type=int, default=3)
    parser.add_argument("--idle-rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=227)
    parser.add_argument("--out", help="default benchmarks/<scenario>.json")
    parser.add_argument("--readme", action="store_true", help="rewrite the README's table")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable)")
    parser.add_argument("--cluster-config", action="append", default=[], metavar="KEY=VALUE",
                        help="endurance, throughput, freshness: a cluster setting (repeatable), e.g. "
                        "num.replica.fetchers=2")
    args = parser.parse_args(argv)
    if args.scenario == "cli":  # subprocesses only: no session of its own beside them
        partitions = args.partitions[0] if args.partitions else 100
        data = {"scenario": "cli", "results": cli_run(partitions, args.rounds),
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
                "command": f"jobs/benchmark.py --scenario cli --partitions {partitions} --rounds {args.rounds}"}
        return _write(data, args.out or "benchmarks/cli.json", cli_table(data), args.readme, plotted=False)
    spark = get_spark(extra={"spark.ui.enabled": "false", **dict(c.split("=", 1) for c in args.conf)})
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
               f"Spark {spark.version}, local[*]")
    out = args.out or f"benchmarks/{args.scenario.replace('-', '_')}.json"
    config = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in (c.split("=", 1) for c in args.cluster_config)}
    configured = "".join(f" --cluster-config {c}" for c in args.cluster_config)
    if args.scenario == "throughput":
        partitions = args.partitions[0] if args.partitions else 100
        result = throughput(spark, args.records, partitions, args.value_bytes, args.max_rounds, config or None)
        data = {"scenario": args.scenario, "machine": machine, "results": result,
                "command": f"jobs/benchmark.py --scenario throughput --records {args.records} "
                           f"--partitions {partitions} --value-bytes {args.value_bytes}" + configured}
        return _write(data, out, throughput_table(data), args.readme, plotted=False)
    if args.scenario == "freshness":
        partitions = args.partitions[0] if args.partitions else 10000
        result = freshness(spark, partitions, args.rate, args.seconds, args.seed, args.poll_pause, config or None)
        data = {"scenario": args.scenario, "machine": machine, "results": result,
                "command": f"jobs/benchmark.py --scenario freshness --partitions {partitions} --rate {args.rate} "
                           f"--seconds {args.seconds}"
                           + (f" --poll-pause {args.poll_pause:g}" if args.poll_pause else "") + configured}
        return _write(data, out, freshness_table(data), args.readme, plotted=False)
    if args.scenario == "produce":
        partitions = args.partitions[0] if args.partitions else 100
        result = produce_run(spark, args.records, partitions, args.value_bytes, args.rounds)
        data = {"scenario": args.scenario, "machine": machine, "results": result,
                "command": f"jobs/benchmark.py --scenario produce --records {args.records} --partitions {partitions} "
                           f"--value-bytes {args.value_bytes} --rounds {args.rounds}"}
        return _write(data, out, produce_table(data), args.readme, plotted=False)
    if args.scenario == "maintenance":
        partitions = args.partitions[0] if args.partitions else 100
        window = 20
        result = maintenance_run(spark, partitions, args.rounds, args.changed, window, args.seed)
        data = {"scenario": args.scenario, "machine": machine, "results": result,
                "command": f"jobs/benchmark.py --scenario maintenance --partitions {partitions} --rounds {args.rounds} "
                           f"--changed {args.changed}"}
        return _write(data, out, maintenance_table(data), args.readme, plotted=False)
    if args.scenario == "front-door":
        partitions = args.partitions[0] if args.partitions else 4
        result = front_door_run(spark, args.records, partitions, args.value_bytes, args.rounds)
        data = {"scenario": args.scenario, "machine": machine, "results": result,
                "command": f"jobs/benchmark.py --scenario front-door --records {args.records} --partitions {partitions} "
                           f"--value-bytes {args.value_bytes} --rounds {args.rounds}"}
        return _write(data, out, front_door_table(data), args.readme, plotted=False)
    if args.scenario == "endurance":
        partitions = args.partitions[0] if args.partitions else 100
        command = (f"jobs/benchmark.py --scenario endurance --partitions {partitions} --rounds {args.rounds} "
                   f"--changed {args.changed}" + configured)
        result = endurance_run(spark, partitions, args.rounds, args.changed, args.seed, out, command, machine,
                               config or None)
        data = {"scenario": args.scenario, "machine": machine, "results": result, "command": command}
        return _write(data, out, endurance_table(data), args.readme, plotted=False)
    args.partitions = args.partitions or [1000, 10000, 100000]
    results = [fetch_sessions(spark, p, args.changed, args.rounds, args.warm_up, args.idle_rounds, args.seed)
               for p in sorted(args.partitions)]
    data = {
        "scenario": args.scenario,
        "machine": machine,
        "command": "jobs/benchmark.py " + " ".join(
            [f"--partitions {' '.join(map(str, sorted(args.partitions)))}", f"--changed {args.changed}",
             f"--rounds {args.rounds}", f"--warm-up {args.warm_up}", f"--idle-rounds {args.idle_rounds}"]),
        "results": results,
        "ratios": ratios(results),
    }
    return _write(data, out, table(data), args.readme, plotted=True)


def _write(data: dict, out: str, text: str, readme: bool, plotted: bool) -> int:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(data, f, indent=2)
    print(text)
    if plotted:
        plot(data, os.path.splitext(out)[0] + ".png")
    if readme:
        update_readme(os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks.md"), text, data["scenario"])
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
