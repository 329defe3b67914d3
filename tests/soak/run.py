"""make soak: `python -m tests.soak.run --seed 7 --events 300 [--seeds 5]` runs the soak (soak.py)
for seeds seed, seed+1, ... and prints one line per seed (rounds, requests, time); exit 1 at the
first violation, which is printed with its seed and event history."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

from pipeline import get_spark
from tests.soak.checker import Violation
from tests.soak.soak import Soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --seed on")
    parser.add_argument("--events", type=int, default=300)
    args = parser.parse_args(argv)
    spark = get_spark(extra={"spark.sql.shuffle.partitions": "1", "spark.sql.adaptive.enabled": "false",
                             "spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    for seed in range(args.seed, args.seed + args.seeds):
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"soak-{seed}-") as root:
            try:
                soak = Soak(spark, f"{root}/cluster", seed).run(args.events)
            except Violation as v:
                print(f"seed {seed}: VIOLATION {v}", flush=True)
                return 1
        print(f"seed {seed}: ok, {args.events} events, {soak.rounds} rounds, {len(soak.expected.requests)} "
              f"requests, {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
