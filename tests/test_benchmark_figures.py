"""The benchmark's own arithmetic (jobs/benchmark.py), where a figure in the README depends on it:
how many of the job's rounds a produce waited for (issue 7, target 2)."""

import os

from jobs.benchmark import (_job_rss_line, _waited_line, cli_table, endurance_figures, endurance_windows,
                            job_jvm_peak_rss_mb, rounds_waited)

# four rounds of the job, back to back: they end at 1,500, 3,600, 5,700 and 7,800 ms
ROUNDS = [{"now_ms": 0, "duration_ms": 1500}, {"now_ms": 1600, "duration_ms": 2000},
          {"now_ms": 3700, "duration_ms": 2000}, {"now_ms": 5800, "duration_ms": 2000}]


def test_a_produce_waits_for_the_rounds_that_end_after_it_returns_and_before_it_is_seen():
    produced = {0: 1000, 1: 2000, 2: 3600, 3: 7000}
    seen = {0: 3700, 1: 9000, 2: 5700}  # produce 3 was never seen: not counted
    # 0: the round in progress (ends 1,500) and the next (3,600); 1: three rounds ended meanwhile;
    # 2: returned as a round ended (that round did not take it), seen as the next ended
    assert rounds_waited(produced, seen, ROUNDS) == [2, 3, 1]


def test_the_readme_line_gives_produces_per_count_and_nothing_without_figures():
    assert _waited_line({"rounds_waited": {"1": 3, "2": 5}}) == [
        "", "Rounds that ended while a produce waited to be seen (produce() returning to the poll that saw it), "
            "produces per count: 1: 3, 2: 5."]
    assert _waited_line({}) == []


def test_idle_rounds_are_not_counted_as_rounds_a_produce_waited_for():
    # the job's first round takes produce 0; then a quiet job runs idle rounds (nothing fetched,
    # appended or changed) while the poll that sees it runs
    rounds = [{"now_ms": 0, "duration_ms": 1500, "fetch_request_partitions": 3, "records_appended": 1,
               "isr_shrinks": 0, "isr_expands": 0}] + [
        {"now_ms": 1500 + 500 * i, "duration_ms": 0, "fetch_request_partitions": 0, "records_appended": 0,
         "isr_shrinks": 0, "isr_expands": 0} for i in range(1, 6)] + [
        {"now_ms": 5000, "duration_ms": 100, "fetch_request_partitions": 0, "records_appended": 0,
         "isr_shrinks": 1, "isr_expands": 0}]
    assert rounds_waited({0: 1000}, {0: 4000}, rounds) == [1]
    assert rounds_waited({0: 1000}, {0: 6000}, rounds) == [2]  # an ISR change can move the HW


def test_the_jobs_peak_rss_is_read_only_from_a_jvm_and_printed_when_there_is_one():
    assert job_jvm_peak_rss_mb(os.getpid()) is None  # this process is Python, not the job's JVM
    assert _job_rss_line({"job_driver_jvm_peak_rss_mb": 2345.6}) == [
        "", "The replication job's driver JVM peak RSS: 2,346 MB."]
    assert _job_rss_line({}) == []


def test_the_endurance_windows_are_the_targets_and_shrink_with_a_short_run():
    assert endurance_windows(10_000) == ((501, 1000), (9501, 10_000))
    assert endurance_windows(1500) == ((501, 1000), (1001, 1500))
    assert endurance_windows(200) == ((11, 20), (191, 200))


def test_the_endurance_ratio_is_the_last_windows_median_over_the_early_ones():
    round_s = [1.0] * 10 + [2.0, 2.0, 3.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 9.0] + [5.0] * 170 + [3.0] * 10
    figures = endurance_figures(round_s, 200)
    assert figures == {"early_window": [11, 20], "last_window": [191, 200], "early_median_s": 2.0,
                       "last_median_s": 3.0, "ratio": 1.5}
    # part way through a run: the last window has no rounds yet
    assert endurance_figures(round_s[:50], 200)["last_median_s"] is None
    assert endurance_figures(round_s[:50], 200)["ratio"] is None


def test_the_cli_table_gives_each_commands_median_lowest_and_highest():
    data = {"machine": "m", "command": "c", "results": {
        "partitions": 100, "repeats": 3, "setup_s": {"cluster --create": 20.04},
        "seconds": {"topics --list": [9.5, 12.0, 9.0], "run --rounds 1": [30.0, 40.0, 35.0]}}}
    assert cli_table(data).splitlines() == [
        "Machine: m. Command: `c`.", "",
        "| command (100 partitions, 3 runs each) | median s | lowest | highest |", "|---|---|---|---|",
        "| `replog topics --list` | 9.5 | 9.0 | 12.0 |", "| `replog run --rounds 1` | 35.0 | 30.0 | 40.0 |",
        "", "Making the root, once each: `cluster --create` 20.0 s."]
