"""What the round's check of the brokers' storage locations costs (locations.log_problem for each
running broker before a round, from its Delta snapshot): rounds with the check and without it, in
turn in one process, on one cluster of three brokers each on a location of its own; idle rounds
(nothing to do: the round's floor) and rounds appending `--records` records.

    .venv/bin/python jobs/bench_log_check.py [--rounds 20] [--records 1000]

Medians after the first pair. Writes benchmarks/log_check.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_round import machine, save  # noqa: E402  (jobs/ is scripts, not a package)
from pipeline import Cluster, ManualClock, get_spark  # noqa: E402
from pipeline import brokers as broker_ops  # noqa: E402
from pipeline.storage.locations import log_problem  # noqa: E402

BROKERS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--out", default="benchmarks/log_check.json")
    args = parser.parse_args()
    spark = get_spark(app_name="replog-bench-log-check")
    scratch = tempfile.mkdtemp(prefix="replog-log-check-")
    try:
        clock = ManualClock(start_ms=0)
        cluster = Cluster.create(spark, os.path.join(scratch, "meta"), brokers=BROKERS, clock=clock,
                                 broker_dirs={b: os.path.join(scratch, f"disk{b}") for b in range(BROKERS)})
        cluster.create_topic("bench", partitions=8, replication_factor=3)
        checked = broker_ops.halt_failed_brokers
        seconds: dict[str, list[float]] = {f"{kind} {way}": [] for kind in ("idle", "append")
                                           for way in ("with the check", "without")}
        check_s = []
        for i in range(args.rounds + 1):
            for way in ("with the check", "without"):
                broker_ops.halt_failed_brokers = checked if way == "with the check" else (lambda core, failed=None: [])
                for kind in ("append", "idle"):
                    if kind == "append":
                        cluster.produce("bench", [{"value": "v" * 100, "partition": n % 8}
                                                  for n in range(args.records)], acks="all")
                    clock.advance(100)
                    started = time.perf_counter()
                    cluster.run_round()
                    seconds[f"{kind} {way}"].append(time.perf_counter() - started)
                    for _ in range(3):  # let the followers settle: the idle round after has nothing to do
                        clock.advance(100)
                        cluster.run_round()
            started = time.perf_counter()
            assert all(log_problem(cluster.storage, b) is None for b in range(BROKERS))
            check_s.append(time.perf_counter() - started)
        broker_ops.halt_failed_brokers = checked
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    medians = {name: statistics.median(s[1:]) for name, s in seconds.items()}
    data = {"machine": machine(spark),
            "command": f"jobs/bench_log_check.py --rounds {args.rounds} --records {args.records}",
            "results": {"round_median_s": medians, "check_median_s": statistics.median(check_s[1:]),
                        "idle_ratio": medians["idle with the check"] / medians["idle without"],
                        "append_ratio": medians["append with the check"] / medians["append without"],
                        "round_s": seconds, "check_s": check_s}}
    for name, m in medians.items():
        print(f"{name}: {m * 1000:.0f} ms")
    r = data["results"]
    print(f"the check of {BROKERS} logs: {r['check_median_s'] * 1000:.1f} ms; with/without: idle "
          f"{r['idle_ratio']:.2f}, append {r['append_ratio']:.2f}")
    save(data, args.out)


if __name__ == "__main__":
    main()
