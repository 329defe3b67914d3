"""The driver's inputs to one bucket's round rules (RoundContext) and what a bucket's round
reports beyond its partition rows (SessionFigures)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RoundContext", "SessionFigures"]


@dataclass(frozen=True)
class RoundContext:
    """The driver's O(brokers) inputs to the rules: the round, its time, the brokers whose fetchers
    run (live, not paused) and those that may not be in an ISR (stopped or fenced), the fetch limits;
    `restarted`: the first round of a process over an existing cluster, whose leaders reset their
    followers' fetch state first (except those of `paused_brokers`: a paused fetcher stays paused
    across the restart)."""

    round_id: int
    now_ms: int
    fetching_brokers: tuple[int, ...]
    ineligible_brokers: tuple[int, ...] = ()
    partition_max_bytes: int = 1_048_576  # replica.fetch.max.bytes
    # (broker, its fetcher's partition limit) where it is lower: a slow follower
    # (Cluster.throttle_fetcher: at most that many bytes of a partition a fetch, one record at least)
    fetcher_max_bytes: tuple[tuple[int, int], ...] = ()
    response_max_bytes: int = 10_485_760  # replica.fetch.response.max.bytes
    restarted: bool = False
    paused_brokers: tuple[int, ...] = ()
    # (broker, its fetcher's last fetch before this round: the last round, or when it was paused);
    # a follower at its leader's LEO was caught up then (replica.effective_fetch_state)
    broker_last_fetch_ms: tuple[tuple[int, int], ...] = ()
    # what each leader made of each follower's fetch request this round (KIP-227, decided by the
    # driver: fetch_session.round_contexts): (follower, leader, kind, session id), kind 'full',
    # 'sessionless', 'incremental' or 'error' (the request is answered with an error and carries
    # nothing). Empty: every follower fetches in full without a session.
    fetch_contexts: tuple[tuple[int, int, str, int], ...] = ()
    # replication quotas (KIP-73): (broker, the bytes it may move this round) of each leader and
    # follower broker with a throttled rate (round/driver.py's _throttle_budgets; absent: unlimited). The
    # state then lists each replica's throttle (bool arrays `leader_throttle_listed` and
    # `follower_throttle_listed`: its topic's throttled-replicas lists name it), and a broker's
    # budget is shared by all its partitions: the control job runs them in one task
    leader_budgets: tuple[tuple[int, int], ...] = ()
    follower_budgets: tuple[tuple[int, int], ...] = ()

    @property
    def throttled(self) -> bool:
        return bool(self.leader_budgets or self.follower_budgets)



@dataclass(frozen=True)
class SessionFigures:
    """What a bucket's round did beyond its partition rows: to the leaders' fetch sessions (the
    sessions whose fetcher sent a follow-up fetch, each moving to its next epoch, and the
    partitions each incremental request added to its session), and the brokers whose replicas'
    log start offsets moved (their logs drop the records below)."""

    followed_up: frozenset = frozenset()
    added: dict = field(default_factory=dict)  # session id -> partitions added
    log_start_brokers: frozenset = frozenset()
    throttled_bytes: dict = field(default_factory=dict)  # ("leader" | "follower", broker) -> bytes drawn

