"""make soak: `python -m tests.soak.run --seed 7 --events 300 [--seeds 5]` runs the soak (soak.py)
for seeds seed, seed+1, ... and prints one line per seed (rounds, requests, time). At the first
violation it prints the seed and the event history, then minimizes the history (shrink.py: each
candidate replayed on a fresh cluster, at most --max-replays of them), prints the minimal one,
saves its events as JSON (--out) and exits 1.

    python -m tests.soak.run --replay soak-7.json     replays a saved history (then heals)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

from pipeline import get_spark
from pipeline.spark import forget_table_logs
from tests.soak.checker import Violation
from tests.soak.shrink import shrink
from tests.soak.soak import Soak


def _report_failure(spark, seed: int, v: Violation, args) -> None:
    print(f"seed {seed}: VIOLATION {v}", flush=True)
    if args.max_replays <= 0:
        return
    print(f"seed {seed}: minimizing {len(v.events)} events (at most {args.max_replays} replays)...", flush=True)
    started = time.monotonic()

    def fresh_soak(root: str) -> Soak:
        forget_table_logs(spark)  # the last replay's tables are deleted
        return Soak(spark, root, seed)

    shrunk = shrink(fresh_soak, v.events, v.check, v.during_heal, max_replays=args.max_replays)
    state = "1-minimal" if shrunk.minimal else "the smallest found before the budget ran out"
    print(f"seed {seed}: minimal history, {len(shrunk.events)} of {len(v.events)} events ({state}; "
          f"{shrunk.replays} replays, {time.monotonic() - started:.0f} s):\n{shrunk.violation}", flush=True)
    out = args.out or f"soak-{seed}.json"
    with open(out, "w") as f:
        json.dump({"seed": seed, "check": v.check, "heal": v.during_heal, "events": shrunk.events}, f, indent=1)
    print(f"seed {seed}: saved to {out} (python -m tests.soak.run --replay {out})", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --seed on")
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--max-replays", type=int, default=150,
                        help="replays the minimizer may spend on a failing history (0: do not minimize)")
    parser.add_argument("--out", help="where to save a minimal failing history (default soak-SEED.json)")
    parser.add_argument("--replay", metavar="FILE", help="replay a saved history instead of drawing events")
    args = parser.parse_args(argv)
    spark = get_spark(extra={"spark.sql.shuffle.partitions": "1", "spark.sql.adaptive.enabled": "false",
                             "spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    if args.replay:
        with open(args.replay) as f:
            saved = json.load(f)
        with tempfile.TemporaryDirectory(prefix="soak-replay-") as root:
            try:
                Soak(spark, f"{root}/cluster", saved["seed"]).replay(saved["events"])
            except Violation as v:
                print(f"replay {args.replay}: VIOLATION {v}", flush=True)
                return 1
        print(f"replay {args.replay}: ok, {len(saved['events'])} events", flush=True)
        return 0
    for seed in range(args.seed, args.seed + args.seeds):
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"soak-{seed}-") as root:
            try:
                soak = Soak(spark, f"{root}/cluster", seed).run(args.events)
            except Violation as v:
                _report_failure(spark, seed, v, args)
                return 1
        forget_table_logs(spark)
        print(f"seed {seed}: ok, {args.events} events, {soak.rounds} rounds, {len(soak.expected.requests)} "
              f"requests, {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
