"""What the replication job's `replog-rounds` query (the rounds' figures in Structured Streaming's
progress) costs the streaming job: the same cluster streamed with it and without it
(`--figures-interval off`), in turns in one process, each turn idle rounds after one that
replicates a produce request; the replication query's micro-batch times (its progress's
triggerExecution) compared.

    .venv/bin/python jobs/bench_round_figures.py [--turns 4] [--seconds 30] [--interval-ms 500]

Medians per way, the first two micro-batches of each turn left out (a first round reads every
table). Writes benchmarks/round_figures.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_round import machine, save  # noqa: E402  (jobs/ is scripts, not a package)
from pipeline import Cluster, get_spark  # noqa: E402
from pipeline.jobs.replicate import run_streaming  # noqa: E402


def turn(spark, cluster, checkpoint: str, seconds: float, interval_ms: int, figures: bool) -> list[float]:
    """The replication query's micro-batch milliseconds over one streamed turn."""
    stopping = threading.Event()
    cluster.produce("bench", [{"value": f"v{i}"} for i in range(100)], acks="all")
    job = threading.Thread(target=run_streaming,
                           args=(spark, cluster, interval_ms, checkpoint, stopping, None if figures else 0))
    job.start()
    started, progress = time.monotonic(), []
    while time.monotonic() - started < seconds:
        time.sleep(0.5)
        query = next((q for q in spark.streams.active if q.name == "replog-replicate"), None)
        if query is not None:
            progress = query.recentProgress
    stopping.set()
    job.join()
    return [float(p.durationMs["triggerExecution"]) for p in progress][2:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=4, help="turns of each way, alternating")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval-ms", type=int, default=500)
    parser.add_argument("--out", default="benchmarks/round_figures.json")
    args = parser.parse_args()
    spark = get_spark(app_name="replog-bench-round-figures")
    scratch = tempfile.mkdtemp(prefix="replog-figures-")
    cluster = Cluster.create(spark, os.path.join(scratch, "cluster"), brokers=3)
    cluster.create_topic("bench", partitions=4, replication_factor=3)
    ways = {"with replog-rounds": True, "without (--figures-interval off)": False}
    batches: dict[str, list[float]] = {way: [] for way in ways}
    for i in range(args.turns):
        for way, figures in ways.items():
            times = turn(spark, cluster, os.path.join(scratch, f"cp{i}-{figures}"), args.seconds, args.interval_ms,
                         figures)
            batches[way] += times
            print(f"turn {i + 1}, {way}: {len(times)} micro-batches, median {statistics.median(times):.0f} ms")
    result = {"machine": machine(spark), "interval_ms": args.interval_ms, "seconds_per_turn": args.seconds,
              "turns": args.turns,
              "ways": {way: {"micro_batches": len(t), "median_ms": statistics.median(t)} for way, t in batches.items()}}
    with_ms, without_ms = (result["ways"][w]["median_ms"] for w in ways)
    result["ratio"] = with_ms / without_ms
    print(f"median micro-batch: {with_ms:.0f} ms with replog-rounds, {without_ms:.0f} ms without "
          f"({result['ratio']:.2f}x)")
    save(result, args.out)


if __name__ == "__main__":
    main()
