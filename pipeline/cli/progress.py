"""Progress of rounds on stderr: one line rewritten in place on a terminal (a bar, what is left,
the rate and an ETA), a plain line per round when stderr is a file or a pipe (a log)."""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, TextIO

__all__ = ["RoundProgress", "CatchUpProgress"]

WIDTH = 20


class RoundProgress:
    """`update(report)` after each round. The bar fills with the rounds done when their number is
    known (`total`), else with the requests answered against those still pending. The rate is the
    records appended and replicated per second of wall time; the ETA follows from the rounds left
    (`total`) at the mean round's time, else from the pending requests at the rate they were
    answered."""

    def __init__(self, total: int | None = None, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.stream, self.clock = total, stream or sys.stderr, clock
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = clock()
        self.rounds = self.records = self.answered = 0
        self.closed = False

    def update(self, report: Any) -> str:
        self.rounds += 1
        self.records += (report.records_appended or 0) + (report.records_replicated or 0)
        self.answered += (report.requests_acked or 0) + (report.requests_failed or 0)
        line = self.line(report, self.clock() - self.started)
        if self.live:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        return line

    def line(self, report: Any, elapsed: float) -> str:
        pending = (report.pending_requests or 0) + (report.throttled_requests or 0)
        if self.total:
            share = self.rounds / self.total
            eta = (self.total - self.rounds) * elapsed / self.rounds
        else:
            share = self.answered / (self.answered + pending) if self.answered + pending else 1.0
            eta = pending * elapsed / self.answered if self.answered and pending else (0.0 if not pending else None)
        filled = min(WIDTH, int(WIDTH * share))
        rate = self.records / elapsed if elapsed > 0 else 0.0
        of = f"/{self.total}" if self.total else ""
        return (f"[{'#' * filled}{'.' * (WIDTH - filled)}] round {report.round_id} ({self.rounds}{of}): "
                f"{pending} requests and {report.active_partitions} partitions left, {self.answered} answered, "
                f"{rate:,.0f} records/s, ETA {'?' if eta is None else f'{eta:.0f} s'}")

    def close(self) -> None:
        """Ends the live line (once)."""
        if self.live and self.rounds and not self.closed:
            self.stream.write("\n")
            self.stream.flush()
        self.closed = True


class CatchUpProgress(RoundProgress):
    """Progress of a catch-up measured in records left (a reassignment's adding replicas): the bar
    fills with the records fetched out of those left at the start, the rate is records fetched
    per second, the ETA the records left at that rate."""

    def __init__(self, initial: int, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        super().__init__(stream=stream, clock=clock)
        self.initial = max(initial, 0)

    def left(self, round_id: int, left: int) -> str:
        self.rounds += 1
        elapsed = self.clock() - self.started
        done = max(self.initial - left, 0)
        share = done / self.initial if self.initial else 1.0
        filled = min(WIDTH, int(WIDTH * share))
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = "0 s" if not left else (f"{left / rate:.0f} s" if rate else "?")
        line = (f"[{'#' * filled}{'.' * (WIDTH - filled)}] round {round_id}: {left:,} of {self.initial:,} records "
                f"left, {rate:,.0f} records/s, ETA {eta}")
        self.stream.write(("\r\033[K" + line) if self.live else line + "\n")
        self.stream.flush()
        return line
