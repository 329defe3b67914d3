"""The README's round table from the benchmarks' JSON (jobs/round_table.py): no Spark."""

import pytest

from jobs.round_table import BEGIN, END, replace_between_markers, rows, share_of_target, table

FILES = {
    "round_v2_p100.json": {"today_round_median_s": 3.785, "today_jobs_median": 36.0, "v2_round_median_s": 1.11},
    "round_v2_p10000.json": {"today_round_median_s": 4.6796, "today_jobs_median": 36.5},
    "round_p100.json": {"round_median_s": 1.2778, "jobs_median": 8.0, "idle_round_median_s": 0.21},
    "round_p10000.json": {"round_median_s": 1.6416, "jobs_median": 8.0},
    "round_p100000.json": {"round_median_s": 9.5, "idle_round_median_s": 0.347},
    "freshness.json": {"scenario": "freshness", "results": {"p50_s": 26.839, "p99_s": 42.377}},
    "freshness_round.json": {"scenario": "freshness", "results": {"p50_s": 15.57, "p99_s": 25.57}},
    "throughput.json": {"results": {"ratio": 0.01117}},
    "round_throughput_5000000.json": {"share_of_raw": 0.0685},
}


def test_the_table_has_each_measure_with_the_round_before_v2_the_round_and_the_target():
    assert table(rows(FILES.get)).splitlines() == [
        "| measure | the round before v2 | the round | target |",
        "|---|---|---|---|",
        "| `Cluster.run_round`, P = 100 | 3.79 s, 36 Spark jobs | 1.28 s, 8 Spark jobs | <= 0.5 s, <= 6 jobs |",
        "| `Cluster.run_round`, P = 10,000 | 4.68 s, 36.5 Spark jobs | 1.64 s, 8 Spark jobs | <= 1 s |",
        "| idle round, P = 100,000 |  | 0.35 s | <= 0.2 s |",
        "| produce to visible, P = 10,000, 1,000 records/s (p50 / p99) | 26.8 / 42.4 s | 15.6 / 25.6 s | 1.5 / 3 s |",
        "| 5,000,000 records replicated, share of a raw Delta append | 1% | 7% | 25% |",
    ]


def test_a_benchmark_not_run_leaves_its_cell_empty():
    lines = rows({k: v for k, v in FILES.items() if k not in ("round_p100000.json", "freshness_round.json")}.get)
    assert [r.now.text for r in lines][2:4] == ["", ""]
    assert [r.now.value for r in lines][2:4] == [None, None]


def test_a_figure_as_a_share_of_its_target():
    p100, _, idle, _, throughput = rows(FILES.get)
    assert share_of_target(p100, p100.now) == pytest.approx(1.2778 / 0.5)
    assert share_of_target(idle, idle.before) is None
    assert share_of_target(throughput, throughput.now) == pytest.approx(0.25 / 0.0685)  # (higher is better)


def test_the_readme_text_between_the_markers_is_replaced_and_the_rest_kept():
    text = f"before\n{BEGIN}\nold table\n{END}\nafter\n"
    assert replace_between_markers(text, "new") == f"before\n{BEGIN}\nnew\n{END}\nafter\n"
    with pytest.raises(ValueError, match="markers"):
        replace_between_markers("no markers here", "new")
