"""The README's table of the round's figures against issue "Round v2"'s targets, from the JSON the
benchmarks saved, and the same figures as a chart.

    .venv/bin/python jobs/round_table.py [--readme] [--png benchmarks/round_targets.png]

Reads (under benchmarks/):
- round_v2_p100.json, round_v2_p10000.json: the round before v2 beside v2, in one process, before
  the old round was deleted (its column "the round before v2");
- round_p100.json, round_p10000.json: `make bench-round` (`jobs/bench_round.py`);
- round_p100000.json: `jobs/bench_round.py --partitions 100000` (its idle rounds);
- freshness.json (the round before v2) and freshness_round.json (`jobs/benchmark.py --scenario
  freshness --partitions 10000 --out benchmarks/freshness_round.json`);
- throughput.json (the round before v2) and round_throughput_5000000.json
  (`jobs/bench_round.py --throughput 5000000`).
A file that is missing leaves its cell empty. Prints the table; `--readme` rewrites it in
README.md between its round-table markers; `--png` draws each figure as a share of its target.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = os.path.join(HERE, "..", "benchmarks")
README = os.path.join(HERE, "..", "README.md")
BEGIN, END = "<!-- round-table -->", "<!-- /round-table -->"


@dataclass(frozen=True)
class Figure:
    """One measured value (None: not measured) and how it is written in the table."""

    value: float | None
    text: str = ""


@dataclass(frozen=True)
class Row:
    """A line of the table: what is measured, the round before v2's figure, the round's, the
    target's text, and the target as a number (the figure as a share of it is charted)."""

    measure: str
    before: Figure
    now: Figure
    target: str
    target_value: float
    higher_is_better: bool = False


def _get(data: dict | None, *path: str):
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _seconds_and_jobs(seconds, jobs) -> Figure:
    if seconds is None:
        return Figure(None)
    return Figure(seconds, f"{seconds:.2f} s" + (f", {jobs:g} Spark jobs" if jobs is not None else ""))


def _p50_p99(p50, p99) -> Figure:
    return Figure(None) if p50 is None else Figure(p50, f"{p50:.1f} / {p99:.1f} s")


def _share(share, records) -> Figure:
    if share is None:
        return Figure(None)
    return Figure(share, f"{share * 100:.0f}%" + (f" ({records:,} records)" if records else ""))


def rows(load: Callable[[str], dict | None]) -> list[Row]:
    """The table's rows from the benchmark files `load` returns (None: missing)."""
    v2_100, v2_10k = load("round_v2_p100.json"), load("round_v2_p10000.json")
    p100, p10k, p100k = load("round_p100.json"), load("round_p10000.json"), load("round_p100000.json")
    fresh_before, fresh = load("freshness.json"), load("freshness_round.json")
    tp_before, tp = load("throughput.json"), load("round_throughput_5000000.json")
    idle = _get(p100k, "idle_round_median_s")
    return [
        Row("`Cluster.run_round`, P = 100",
            _seconds_and_jobs(_get(v2_100, "today_round_median_s"), _get(v2_100, "today_jobs_median")),
            _seconds_and_jobs(_get(p100, "round_median_s"), _get(p100, "jobs_median")), "<= 0.5 s, <= 6 jobs", 0.5),
        Row("`Cluster.run_round`, P = 10,000",
            _seconds_and_jobs(_get(v2_10k, "today_round_median_s"), _get(v2_10k, "today_jobs_median")),
            _seconds_and_jobs(_get(p10k, "round_median_s"), _get(p10k, "jobs_median")), "<= 1 s", 1.0),
        Row("idle round, P = 100,000", Figure(None),
            Figure(idle, "" if idle is None else f"{idle:.2f} s"), "<= 0.2 s", 0.2),
        Row("produce to visible, P = 10,000, 1,000 records/s (p50 / p99)",
            _p50_p99(_get(fresh_before, "results", "p50_s"), _get(fresh_before, "results", "p99_s")),
            _p50_p99(_get(fresh, "results", "p50_s"), _get(fresh, "results", "p99_s")), "1.5 / 3 s", 1.5),
        Row("5,000,000 records replicated, share of a raw Delta append",
            _share(_get(tp_before, "results", "ratio"), None),
            _share(_get(tp, "share_of_raw"), None), "25%", 0.25, higher_is_better=True),
    ]


def table(lines: list[Row]) -> str:
    out = ["| measure | the round before v2 | the round | target |", "|---|---|---|---|"]
    out += [f"| {r.measure} | {r.before.text} | {r.now.text} | {r.target} |" for r in lines]
    return "\n".join(out)


def share_of_target(row: Row, figure: Figure) -> float | None:
    """How far a figure is from its target: 1 meets it exactly, above 1 misses it by that factor."""
    if figure.value is None or figure.value <= 0:
        return None
    return row.target_value / figure.value if row.higher_is_better else figure.value / row.target_value


def replace_between_markers(text: str, body: str) -> str:
    """`text` with what lies between the round-table markers replaced by `body`."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"README.md has no {BEGIN} ... {END} markers")
    begin, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:begin] + "\n" + body + "\n" + text[end:]


def plot(lines: list[Row], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    names = [r.measure.replace("`", "") for r in lines]
    for offset, (label, pick) in enumerate((("the round before v2", lambda r: r.before),
                                            ("the round", lambda r: r.now))):
        values = [share_of_target(r, pick(r)) or 0 for r in lines]
        ax.barh([i + 0.4 * offset for i in range(len(lines))], values, height=0.4, label=label)
    ax.axvline(1, color="black", linewidth=1, label="target")
    ax.set_xscale("log")
    ax.set_yticks([i + 0.2 for i in range(len(lines))], [n[:45] for n in names], fontsize=7)
    ax.set_xlabel("times the target (lower is better; throughput: target / share)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _load(name: str) -> dict | None:
    path = os.path.join(BENCHMARKS, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readme", action="store_true", help="rewrite the table in README.md")
    parser.add_argument("--png", help="draw the figures against their targets to this file")
    args = parser.parse_args()
    lines = rows(_load)
    text = table(lines)
    print(text)
    if args.readme:
        with open(README) as f:
            readme = f.read()
        with open(README, "w") as f:
            f.write(replace_between_markers(readme, text))
        print("rewrote README.md's round table")
    if args.png:
        plot(lines, args.png)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
