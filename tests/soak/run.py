"""make soak: `python -m tests.soak.run --seed 7 --events 300 [--seeds 5]` runs the soak (soak.py)
for seeds seed, seed+1, ... and prints one line per seed (rounds, requests, time). At the first
violation it prints the seed and the event history, then minimizes the history (shrink.py: each
candidate replayed on a fresh cluster, at most --max-replays of them), prints the minimal one,
saves its events as JSON (--out) and exits 1.

    python -m tests.soak.run --replay soak-7.json     replays a saved history (then heals)
    python -m tests.soak.run --seed 155 --seeds 20 --record docs/soak_seeds.json
                                                       appends each seed's result to the file
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

from pipeline import get_spark
from pipeline.runtime import forget_table_logs
from tests.fs_faults import scratch_dir
from tests.soak.checker import Violation
from tests.soak.shrink import shrink
from tests.soak.lockstep import Lockstep
from tests.soak.soak import Soak


def _save(path: str, seed: int, v: Violation, kind: type, events: list) -> None:
    with open(path, "w") as f:
        json.dump({"seed": seed, "check": v.check, "heal": v.during_heal, "model": kind is Lockstep,
                   "events": events}, f, indent=1)


def _report_failure(spark, seed: int, v: Violation, args, kind: type) -> None:
    print(f"seed {seed}: VIOLATION {v}", flush=True)
    out = args.out or f"soak-{seed}.json"
    if args.max_replays <= 0:  # the whole history, to replay
        _save(out, seed, v, kind, v.events)
        print(f"seed {seed}: saved its {len(v.events)} events to {out} (not minimized)", flush=True)
        _repeat_violation(seed, v)
        return
    print(f"seed {seed}: minimizing {len(v.events)} events (at most {args.max_replays} replays)...", flush=True)
    started = time.monotonic()

    def fresh_soak(root: str) -> Soak:
        forget_table_logs(spark)  # the last replay's tables are deleted
        return kind(spark, root, seed)

    shrunk = shrink(fresh_soak, v.events, v.check, v.during_heal, max_replays=args.max_replays)
    state = "1-minimal" if shrunk.minimal else "the smallest found before the budget ran out"
    print(f"seed {seed}: minimal history, {len(shrunk.events)} of {len(v.events)} events ({state}; "
          f"{shrunk.replays} replays, {time.monotonic() - started:.0f} s):\n{shrunk.violation}", flush=True)
    _save(out, seed, v, kind, shrunk.events)
    print(f"seed {seed}: saved to {out} (python -m tests.soak.run --replay {out})", flush=True)
    _repeat_violation(seed, v)


def _repeat_violation(seed: int, v: Violation) -> None:
    """The saved events as one JSON line, then the violation once more, last: a log cut to its
    tail (CI's) still says what failed and lets the history be replayed from it."""
    lines = str(v).split("\nhistory:\n")[0].splitlines()
    print(f"seed {seed}: events " + json.dumps(v.events, separators=(",", ":")), flush=True)
    print(f"seed {seed}: VIOLATION{' during heal' if v.during_heal else ''}: " + " / ".join(lines[:6]), flush=True)


def _entry(args, seed: int, result: str, rounds, requests, started: float, events: int | None = None) -> dict:
    entry = {"seed": seed, "events": args.events if events is None else events, "result": result, "rounds": rounds,
             "requests": requests, "seconds": round(time.monotonic() - started), "date": datetime.date.today().isoformat()}
    return {**entry, "lockstep": True} if args.model else entry


def _command(args) -> str:
    return f"make {'soak-model' if args.model else 'soak'} SEED={args.seed} SEEDS={args.seeds} EVENTS={args.events}"


def record_seed(path: str, entry: dict, command: str) -> None:
    """Appends one seed's result to the JSON file of seed results (created when missing), keeping
    the file valid JSON after every seed, so a run stopped half way has recorded what it ran."""
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
    else:
        data = {"command": command, "machine": f"{platform.machine()}, {os.cpu_count()} cores, local mode",
                "seeds": []}
    key = lambda s: (bool(s.get("lockstep")), s["events"], s["seed"])  # noqa: E731
    data["seeds"] = [s for s in data["seeds"] if key(s) != key(entry)]
    data["seeds"].append(entry)
    data["seeds"].sort(key=key)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --seed on")
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--max-replays", type=int, default=150,
                        help="replays the minimizer may spend on a failing history (0: do not minimize)")
    parser.add_argument("--out", help="where to save a minimal failing history (default soak-SEED.json)")
    parser.add_argument("--model", action="store_true",
                        help="the lockstep soak: the events the reference model covers, on the cluster and the "
                             "model at once, compared after every round (tests/soak/lockstep.py)")
    parser.add_argument("--record", metavar="FILE", help="append each seed's result (ok or the violated check) "
                                                          "to this JSON file, as docs/soak_seeds.json")
    parser.add_argument("--replay", metavar="FILE", help="replay a saved history instead of drawing events")
    parser.add_argument("--minutes", type=float, help="a time box: no event starts after it and no seed after "
                                                       "the one it ends in (each seed still heals and is checked)")
    args = parser.parse_args(argv)
    deadline = None if args.minutes is None else time.monotonic() + 60 * args.minutes
    spark = get_spark(extra={"spark.sql.shuffle.partitions": "1", "spark.sql.adaptive.enabled": "false",
                             "spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    if args.replay:
        with open(args.replay) as f:
            saved = json.load(f)
        with scratch_dir("soak-replay-") as root:
            try:
                (Lockstep if saved.get("model") else Soak)(spark, f"{root}/cluster", saved["seed"]).replay(
                    saved["events"])
            except Violation as v:
                print(f"replay {args.replay}: VIOLATION {v}", flush=True)
                return 1
        print(f"replay {args.replay}: ok, {len(saved['events'])} events", flush=True)
        return 0
    kind = Lockstep if args.model else Soak
    for seed in range(args.seed, args.seed + args.seeds):
        if deadline is not None and time.monotonic() >= deadline:
            last = args.seed + args.seeds - 1
            left = f"seeds {seed}-{last}" if last > seed else f"seed {seed}"
            print(f"the time box ({args.minutes:g} min) has closed: {left} not run", flush=True)
            break
        started = time.monotonic()
        with scratch_dir(f"soak-{seed}-") as root:
            try:
                soak = kind(spark, f"{root}/cluster", seed).run(args.events, deadline)
            except Violation as v:
                if args.record:
                    record_seed(args.record, _entry(args, seed, f"violation [{v.check}]", None, None, started),
                                _command(args))
                _report_failure(spark, seed, v, args, kind)
                return 1
        forget_table_logs(spark)
        ran = f"{soak.events_run} events" if soak.events_run == args.events else \
            f"the first {soak.events_run} of {args.events} events (the time box ran out)"
        print(f"seed {seed}: ok, {ran}, {soak.rounds} rounds, {len(soak.expected.requests)} "
              f"requests, {time.monotonic() - started:.0f} s", flush=True)
        if args.record:
            record_seed(args.record, _entry(args, seed, "ok", soak.rounds, len(soak.expected.requests), started,
                                            soak.events_run),
                        _command(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
