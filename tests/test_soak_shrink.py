"""Minimizing a failing soak history (tests/soak/shrink.py): ddmin itself on plain predicates,
then a real cluster with a planted loss, minimized by replays, and the saved-history replay of
`python -m tests.soak.run --replay`."""

import json
import os
import subprocess
import sys

import pytest

from tests.soak.checker import Violation
from tests.soak.shrink import ddmin, shrink
from tests.soak.soak import Soak

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ddmin_keeps_only_what_the_failure_needs_in_order():
    calls = []

    def fails(xs):
        calls.append(xs)
        return 3 in xs and 7 in xs and xs.index(3) < xs.index(7)

    found, tests, proven = ddmin(list(range(10)), fails)
    assert (found, proven) == ([3, 7], True)
    assert tests == len(calls) == len({tuple(c) for c in calls})  # each candidate tested once
    assert tests < 45  # fewer than one test per pair of the ten


def test_ddmin_returns_the_smallest_failure_found_when_the_budget_runs_out():
    found, tests, proven = ddmin(list(range(40)), lambda xs: {5, 17, 33} <= set(xs), max_tests=9)
    assert tests == 9 and not proven
    assert found == list(range(20)) + list(range(30, 40))  # a quarter removed, then the budget ran out


def test_ddmin_of_a_single_failing_event_is_that_event():
    assert ddmin(["a", "b", "c", "d"], lambda xs: "c" in xs) == (["c"], 3, True)  # [a b] [c d] [c]


def test_a_history_with_an_unknown_event_is_refused(spark, tmp_path):
    soak = Soak(spark, str(tmp_path / "c"), seed=1)
    with pytest.raises(ValueError, match="unknown soak event 'explode'"):
        soak.replay([["explode", {}]], heal=False)


class Crashing(Soak):
    """The soak plus an event that fails with a real error of Spark's: a Delta table that is not there."""

    def do_crash(self) -> None:
        self.spark.read.format("delta").load(f"{self.cluster.storage.root}-missing").count()


def test_an_exception_is_a_violation_with_the_history_so_a_seed_is_recorded_and_minimized(spark, tmp_path):
    # (soak seed 9 ended in a round's exception, which stopped the run with no history and no record)
    soak = Crashing(spark, str(tmp_path / "c"), seed=1)
    with pytest.raises(Violation) as caught:
        soak.replay([["pause", {"broker": 2}], ["crash", {}], ["round", {}]], heal=False)
    v = caught.value
    assert v.check == "exception AnalysisException" and not v.during_heal
    assert v.events == [["pause", {"broker": 2}], ["crash", {}]]
    assert "-missing" in str(v) and "\nhistory:\n" in str(v) and "pause" in str(v).split("history:")[1]


class PlantedLoss(Soak):
    """The soak plus one event the generator never draws: offset 0 of clean-0 deleted from every
    replica's log (a loss planted in the tables, so the checker has something real to catch)."""

    def do_tamper(self) -> None:
        for broker in range(3):
            path = self.cluster.storage.log_path(broker)
            self.spark.sql(f"DELETE FROM delta.`{path}` WHERE topic = 'clean' AND partition = 0 AND offset = 0")
        self._note("tamper: offset 0 of clean-0 deleted from every replica")
        self.checker.check()


# one event the loss does not need (each replay is a fresh cluster: ddmin's 9 replays here are
# minutes; with two more such events it took 20)
HISTORY = [
    ["pause", {"broker": 2}],
    ["produce", {"topic": "clean", "acks": "all", "records": [[0, "v1"], [1, "v2"]]}],
    ["round", {}],
    ["tamper", {}],
]


@pytest.mark.integration
def test_a_planted_loss_is_minimized_to_the_events_that_cause_it(spark, tmp_path):
    with pytest.raises(Violation) as caught:
        PlantedLoss(spark, str(tmp_path / "full"), seed=1).replay(HISTORY)
    v = caught.value
    assert v.check == "gap" and not v.during_heal and v.events == HISTORY

    shrunk = shrink(lambda root: PlantedLoss(spark, root, seed=1), v.events, v.check, v.during_heal)
    assert shrunk.minimal and shrunk.replays <= 10
    assert shrunk.events == HISTORY[1:]  # produce, round, tamper
    assert shrunk.violation.check == "gap" and "tamper: offset 0 of clean-0" in str(shrunk.violation)


@pytest.mark.integration
def test_a_saved_history_replays_from_the_command_line(tmp_path):
    saved = tmp_path / "soak-5.json"
    saved.write_text(json.dumps({"seed": 5, "check": "gap", "heal": False, "events": [
        ["produce", {"topic": "clean", "acks": "all", "records": [[2, "x"]]}], ["stop", {"broker": 0}],
        ["round", {}], ["start", {"broker": 1}], ["start", {"broker": 0}]]}))
    run = subprocess.run([sys.executable, "-m", "tests.soak.run", "--replay", str(saved)], cwd=ROOT_DIR,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"replay {saved}: ok, 5 events" in run.stdout
