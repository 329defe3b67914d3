"""Minimizing a failing soak history: delta debugging (Zeller and Hildebrandt's ddmin) over the
recorded events, each candidate replayed on a fresh cluster. A candidate fails when its replay
raises a Violation of the same check as the original; the result is 1-minimal (removing any one
of its events makes the violation go away) unless the replay budget ran out first.

Events are recorded with their parameters (soak.py's draw_/do_), so any subset replays; an event
that no longer applies in a subset (starting a broker that is not stopped) is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from tests.fs_faults import scratch_dir
from tests.soak.checker import Violation


@dataclass
class Shrunk:
    events: list  # the minimal failing history, [name, params] each
    violation: Violation  # what its replay raised (its message holds the replay's history)
    replays: int  # candidates replayed
    minimal: bool  # False when the budget ran out before 1-minimality was proven


def ddmin(items: Sequence, fails: Callable[[list], bool], max_tests: int | None = None) -> tuple[list, int, bool]:
    """The smallest failing sub-sequence ddmin finds of `items` (which must fail), keeping order.
    Returns (subsequence, tests run, 1-minimal proven). Each distinct candidate is tested once."""
    seen: dict[tuple, bool] = {}

    def test(indices: list[int]) -> bool:
        key = tuple(indices)
        if key not in seen:
            if max_tests is not None and len(seen) >= max_tests:
                raise _Budget
            seen[key] = fails([items[i] for i in indices])
        return seen[key]

    current, n = list(range(len(items))), 2
    try:
        while len(current) >= 2:
            chunks = [current[len(current) * i // n:len(current) * (i + 1) // n] for i in range(n)]
            chunks = [c for c in chunks if c]
            smaller = next((c for c in chunks if test(c)), None)
            if smaller is not None:
                current, n = smaller, 2
                continue
            complement = next((rest for c in chunks if (rest := [i for i in current if i not in c]) and test(rest)), None)
            if complement is not None:
                current, n = complement, max(n - 1, 2)
                continue
            if n >= len(current):
                break  # every single event removed in turn passes: 1-minimal
            n = min(2 * n, len(current))
        proven = True
    except _Budget:
        proven = False
    return [items[i] for i in current], len(seen), proven


class _Budget(Exception):
    pass


def shrink(make_soak: Callable[[str], object], events: list, check: str, during_heal: bool,
           max_replays: int = 200) -> Shrunk:
    """Minimize `events` (a failing run's recorded history) for a Violation named `check`.
    `make_soak(root)` builds a fresh Soak at `root`; a replay heals at the end only when the
    original failed while healing (otherwise a candidate that got through its events passed)."""
    last: list = [None, None]  # the last failing candidate and its Violation: ddmin keeps every one it finds

    def fails(candidate: list) -> bool:
        with scratch_dir("soak-shrink-") as root:
            try:
                make_soak(f"{root}/cluster").replay(candidate, heal=during_heal)
                return False
            except Violation as v:
                if v.check == check:
                    last[:] = [candidate, v]
                return v.check == check

    minimal, replays, proven = ddmin(events, fails, max_tests=max_replays)
    if last[0] != minimal:  # nothing smaller failed: the whole history, replayed once for its message
        replays += 1
        if not fails(minimal):
            raise ValueError(f"the history does not fail with [{check}] when replayed")
    return Shrunk(minimal, last[1], replays, proven)
