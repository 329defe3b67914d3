"""The cluster's clock: every rule takes time from here, never from the wall directly."""

from __future__ import annotations

import time

__all__ = ["Clock", "SystemClock", "ManualClock"]


class Clock:
    """Milliseconds since the epoch, as the cluster sees them."""

    def now_ms(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError


class SystemClock(Clock):
    """Wall-clock time; the default clock of a cluster."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock(Clock):
    """A clock that moves only when told to, so lag and timeout tests are exact and instant.

    >>> clock = ManualClock(start_ms=0)
    >>> clock.advance(100)
    100
    >>> clock.now_ms()
    100
    """

    def __init__(self, start_ms: int = 0):
        if not isinstance(start_ms, int) or start_ms < 0:
            raise ValueError(f"start_ms must be a non-negative int, got {start_ms!r}")
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> int:
        if not isinstance(ms, int) or ms < 0:
            raise ValueError(f"ms must be a non-negative int, got {ms!r}")
        self._now += ms
        return self._now

    def rewind(self, ms: int) -> int:
        """Moves the clock back, as a wall clock can step back (an NTP correction, a job moved to
        a machine whose clock is behind): rounds never run earlier than the round before them."""
        if not isinstance(ms, int) or ms < 0 or ms > self._now:
            raise ValueError(f"ms must be an int from 0 to {self._now}, got {ms!r}")
        self._now -= ms
        return self._now
