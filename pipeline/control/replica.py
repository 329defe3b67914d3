"""A follower as its leader sees it (Kafka's Replica.scala): `is_caught_up` and the fetch-state
update a fetch makes, over arrays of replicas (any shape; every argument broadcasts)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FetchState", "is_caught_up", "update_fetch_state", "reset_replica_state", "effective_fetch_state"]


@dataclass(frozen=True)
class FetchState:
    """The leader's ReplicaState of each follower: its last fetch's time, the leader's LEO at that
    fetch, and the last time the follower was caught up (arrays of one shape)."""

    last_fetch_time_ms: np.ndarray
    last_fetch_leader_leo: np.ndarray
    last_caught_up_time_ms: np.ndarray


def is_caught_up(follower_leo: np.ndarray, leader_leo: np.ndarray, last_caught_up_time_ms: np.ndarray,
                 now_ms: int, lag_time_max_ms: np.ndarray) -> np.ndarray:
    """Kafka's Replica.isCaughtUp: at the leader's LEO, or caught up within `replica.lag.time.max.ms`."""
    return (follower_leo == leader_leo) | (now_ms - last_caught_up_time_ms <= lag_time_max_ms)


def update_fetch_state(state: FetchState, fetch_offset: np.ndarray, leader_leo: np.ndarray, now_ms: int,
                       fetched: np.ndarray) -> FetchState:
    """Kafka's Replica.updateFetchState for the replicas that `fetched` at `now_ms` with
    `fetch_offset`, the leader's LEO being `leader_leo`:

    - fetch offset >= the leader's LEO: caught up now;
    - else fetch offset >= the leader's LEO at the last fetch: caught up as of the last fetch;
    - then the last fetch is this one, at the leader's LEO now.

    Every new value is computed from the values before the fetch; replicas that did not fetch keep theirs.
    """
    last_caught_up = np.where(
        fetch_offset >= leader_leo, np.maximum(state.last_caught_up_time_ms, now_ms),
        np.where(fetch_offset >= state.last_fetch_leader_leo,
                 np.maximum(state.last_caught_up_time_ms, state.last_fetch_time_ms),
                 state.last_caught_up_time_ms))
    return FetchState(
        last_fetch_time_ms=np.where(fetched, now_ms, state.last_fetch_time_ms),
        last_fetch_leader_leo=np.where(fetched, leader_leo, state.last_fetch_leader_leo),
        last_caught_up_time_ms=np.where(fetched, last_caught_up, state.last_caught_up_time_ms),
    )


def reset_replica_state(state: FetchState, in_isr: np.ndarray, leader_leo: np.ndarray, now_ms: int,
                        reset: np.ndarray) -> FetchState:
    """Kafka's Replica.resetReplicaState for the `reset` replicas (a leader taking leadership
    again, here a process that starts replicating a cluster: no fetch could happen while it was
    down, and that time must not count against the followers): an ISR member caught up and last
    fetched at `now_ms`, any other replica never (0, so it returns by its LEO reaching the HW); the
    last fetch at the leader's LEO."""
    since = np.where(in_isr, now_ms, 0)
    return FetchState(
        last_fetch_time_ms=np.where(reset, since, state.last_fetch_time_ms),
        last_fetch_leader_leo=np.where(reset, leader_leo, state.last_fetch_leader_leo),
        last_caught_up_time_ms=np.where(reset, since, state.last_caught_up_time_ms),
    )


def effective_fetch_state(state: FetchState, quiescent: np.ndarray, broker_last_fetch_ms: np.ndarray,
                          leader_leo: np.ndarray) -> FetchState:
    """The fetch state of the `quiescent` followers (at the leader's LEO, their partition unchanged
    since their state was written): their broker kept fetching, at the leader's unchanged LEO, until
    its last fetch (`broker_last_fetch_ms`: the last round, or when its fetcher was paused), so
    Kafka's rule makes that fetch the last one and the follower caught up at it.

    A follower whose leader has no fetch of it on record (last fetch 0) keeps its state: a new
    leader resets a replica outside the ISR so (Replica.resetReplicaState: never caught up, "to
    ensure that the high watermark is not held back unnecessarily"), and a fetch its broker made
    before the election went to the old leader."""
    quiescent = quiescent & (state.last_fetch_time_ms > 0)
    later = np.maximum(state.last_fetch_time_ms, broker_last_fetch_ms)
    return FetchState(
        last_fetch_time_ms=np.where(quiescent, later, state.last_fetch_time_ms),
        last_fetch_leader_leo=np.where(quiescent, leader_leo, state.last_fetch_leader_leo),
        last_caught_up_time_ms=np.where(quiescent, np.maximum(state.last_caught_up_time_ms, later),
                                        state.last_caught_up_time_ms),
    )
