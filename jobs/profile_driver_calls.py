"""What a round costs the driver in calls to the JVM, and what pipeline/runtime/jvm_lookups.py's column,
literal and list handling and the rounds' one-projection `withColumns` save, side by side.

    .venv/bin/python jobs/profile_driver_calls.py [--partitions 100] [--records 1000] [--rounds 22]

Part 1 counts the Py4J commands of 4 rounds (after 3 warm-up rounds) by kind and method, with the
time spent waiting for each, with and without those changes (below). Part 2 runs two clusters in this one process, rounds interleaved and
the same records produced to both (random partitions): one as the pipeline runs, one with those
four changes undone for its rounds (Py4J's own column, literal and list conversion, and each
`withColumns` applied as a chain of `withColumn`). Medians of the rounds after the first two.

Writes benchmarks/driver_calls.json next to printing it.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import random
import statistics
import tempfile
import time
from typing import Callable

from py4j import clientserver
from py4j.java_collections import ListConverter
from pyspark.sql.classic import column as classic_column
from pyspark.sql.classic.dataframe import DataFrame
from pyspark.sql.functions import builtin

from pipeline import Cluster, ManualClock, get_spark
from pipeline.runtime import jvm_lookups

jvm_lookups.install()  # (get_spark does too; _OLD below reads what it wraps)

WARM_UP = 2


def _as_chain(df: DataFrame, columns: dict) -> DataFrame:
    for name, column in columns.items():
        df = df.withColumn(name, column)
    return df


_NEW = (classic_column._create_column_from_name, builtin._invoke_function, ListConverter.convert,
        DataFrame.withColumns)
_OLD = (classic_column._create_column_from_name._create, builtin._invoke_function.__wrapped__,
        ListConverter.convert.__wrapped__, _as_chain)


def _use(new: bool) -> None:
    (classic_column._create_column_from_name, builtin._invoke_function, ListConverter.convert,
     DataFrame.withColumns) = _NEW if new else _OLD


def _cluster(spark, partitions: int) -> tuple[Cluster, ManualClock]:
    clock = ManualClock(start_ms=0)
    cluster = Cluster.create(spark, tempfile.mkdtemp(prefix="replog-calls-"), brokers=3, clock=clock)
    cluster.create_topic("t", partitions=partitions, replication_factor=3)
    return cluster, clock


def _round(cluster: Cluster, clock: ManualClock, records: list[dict]) -> float:
    cluster.produce("t", records, acks="all")
    clock.advance(500)
    started = time.perf_counter()
    cluster.run_round()
    return time.perf_counter() - started


def count_calls(spark, partitions: int, records: int, new: bool, rounds: int = 4) -> dict:
    _use(new)
    cluster, clock = _cluster(spark, partitions)
    batch = [{"key": f"k{j}", "value": "v" * 100} for j in range(records)]
    for _ in range(3):
        _round(cluster, clock, batch)
    counts: collections.Counter = collections.Counter()
    waited: collections.Counter = collections.Counter()
    send = clientserver.ClientServerConnection.send_command

    def counting(self, command):
        started = time.perf_counter()
        try:
            return send(self, command)
        finally:
            lines = command.split("\n")
            key = f"{lines[0]}:{lines[2] if lines[0] == 'c' and len(lines) > 2 else lines[1] if len(lines) > 1 else ''}"
            counts[key] += 1
            waited[key] += time.perf_counter() - started

    clientserver.ClientServerConnection.send_command = counting
    try:
        for _ in range(rounds):
            _round(cluster, clock, batch)
    finally:
        clientserver.ClientServerConnection.send_command = send
        _use(True)
    return {"calls_per_round": sum(counts.values()) / rounds,
            "top": [{"command": k, "per_round": n / rounds, "ms_per_round": waited[k] / rounds * 1000}
                    for k, n in counts.most_common(20)]}


def compare(spark, partitions: int, records: int, rounds: int, use: Callable[[bool], None] = _use) -> dict:
    """Two clusters of `partitions` partitions in this process, rounds interleaved (which goes first
    alternates) and the same `records` random-partition records produced to both before each;
    `use(True)` is called before each of the "new" cluster's rounds, `use(False)` before the
    "old" one's. Medians of the rounds after WARM_UP."""
    clusters = {}
    for name in ("new", "old"):
        use(name == "new")
        clusters[name] = _cluster(spark, partitions)
    times: dict[str, list[float]] = {n: [] for n in clusters}
    rng = random.Random(7)
    try:
        for i in range(rounds):
            batch = [{"key": f"k{j}", "value": "v" * 100, "partition": rng.randrange(partitions)} for j in range(records)]
            for name in (("new", "old") if i % 2 == 0 else ("old", "new")):
                use(name == "new")
                seconds = _round(*clusters[name], batch)
                if i >= WARM_UP:
                    times[name].append(seconds)
    finally:
        use(True)
    medians = {n: statistics.median(v) for n, v in times.items()}
    return {"round_s": times, "median_s": medians, "new_over_old": medians["new"] / medians["old"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=22)
    parser.add_argument("--out", default="benchmarks/driver_calls.json")
    args = parser.parse_args()
    spark = get_spark()
    result = {
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores, Python {platform.python_version()}, "
                   f"Spark {spark.version}",
        "partitions": args.partitions, "records": args.records, "rounds": args.rounds,
        "calls": count_calls(spark, args.partitions, args.records, new=True),
        "calls_undone": count_calls(spark, args.partitions, args.records, new=False),
        "compare": compare(spark, args.partitions, args.records, args.rounds),
    }
    print(f"Py4J calls per round: {result['calls']['calls_per_round']:.0f} "
          f"({result['calls_undone']['calls_per_round']:.0f} with the four changes undone)")
    for row in result["calls"]["top"][:10]:
        print(f"  {row['per_round']:8.1f} {row['ms_per_round']:7.1f} ms  {row['command']}")
    medians = result["compare"]["median_s"]
    print(f"round median: {medians['new']:.2f} s as the pipeline runs, {medians['old']:.2f} s with the four "
          f"changes undone ({result['compare']['new_over_old']:.3f}x)")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
