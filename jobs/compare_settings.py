"""A round with some Spark SQL settings against the round without them, side by side in one process.

    .venv/bin/python jobs/compare_settings.py --set KEY=VALUE [--set ...] [--partitions 100]
        [--records 1000] [--rounds 22] [--out benchmarks/compare_settings.json]

Two clusters (3 brokers, one topic of P partitions, RF 3), rounds interleaved with the order
alternating and the same records produced to both before each round (jobs/profile_driver_calls.py's
`compare`). The settings hold during one cluster's rounds; the other's run with the session's own
values. Medians of the rounds after the first two, and their ratio. A setting that a round sets
itself (shuffle partitions and code generation, for a bulk round) is the round's starting value.

Tried with it (docs/benchmarks.md, "One round's phases"): Spark 4.2's single-pass analyzer, and two shuffle
partitions at P = 10,000.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

from pipeline import get_spark

try:
    from profile_driver_calls import compare  # run as a script: jobs/ is on the path
except ImportError:  # imported as jobs.compare_settings (the tests)
    from jobs.profile_driver_calls import compare


def _switch(spark, settings: dict[str, str]):
    """`use(True)` sets `settings` in the session, `use(False)` puts back the values it had."""
    before = {key: spark.conf.get(key, None) for key in settings}

    def use(on: bool) -> None:
        for key, value in settings.items():
            if on:
                spark.conf.set(key, value)
            elif before[key] is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, before[key])
    return use


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="settings", type=_setting, action="append", required=True,
                        metavar="KEY=VALUE", help="a Spark SQL setting for one cluster's rounds (repeatable)")
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=22)
    parser.add_argument("--out", default="benchmarks/compare_settings.json")
    args = parser.parse_args(argv)
    spark = get_spark()
    settings = dict(args.settings)
    use = _switch(spark, settings)
    result = compare(spark, args.partitions, args.records, args.rounds, use)
    use(False)
    medians = result["median_s"]
    print(f"round median with {settings}: {medians['new']:.2f} s, without: {medians['old']:.2f} s "
          f"({result['new_over_old']:.3f}x), {len(result['round_s']['new'])} rounds each")
    with open(args.out, "w") as f:
        json.dump({"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                              f"Spark {spark.version}",
                   "settings": settings, "partitions": args.partitions, "records": args.records,
                   "rounds": args.rounds, **result}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
