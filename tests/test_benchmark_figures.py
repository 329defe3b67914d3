"""The benchmark's own arithmetic (jobs/benchmark.py), where a figure in the README depends on it:
how many of the job's rounds a produce waited for (issue 7, target 2)."""

from jobs.benchmark import _waited_line, rounds_waited

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
