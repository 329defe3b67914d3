"""Replication quotas (KIP-73): how much of a fetch response's throttled partitions fits the
brokers' budgets this round.

A replica listed in its topic's `leader.replication.throttled.replicas` (as `partition:broker` of
the leader, or `*`) is throttled on its leader's side; one listed in
`follower.replication.throttled.replicas` (the follower's) on its follower's side; a replica in the
ISR is never throttled. Each throttled broker has a budget of bytes for the round (the rate times
the time since the last round plus what it left unused, at most the quota window's worth:
round/driver.py's _throttle_budgets); a leader's is shared by every response it sends, a follower's by every
response it receives. A throttled partition's records go while the throttled bytes before it (in
the leader's order of requests, or the follower's) and its own stay within the budget, with no
first-record exception: over its quota, Kafka's leader leaves throttled partitions out of its
response (ReplicaManager.readFromLog, `shouldLeaderThrottle`), and its follower leaves them out of
its request (ReplicaFetcherThread, `shouldFollowerThrottle`).

Arrays: per partition fetch `f` (sorted by request, then the request's order), `leader[f]`,
`broker[f]` (the follower), whether it is throttled on each side and that side's budget left
(`UNLIMITED` where a broker has none); per unit `u` (a batch, or a record a lagging follower
read; sorted by fetch, then offset), `unit_fetch[u]`, `unit_bytes[u]` and `taken[u]` (what the
response limits let through: fetch_response.batches_taken)."""

from __future__ import annotations

import numpy as np

from pipeline.control.state import lookup

__all__ = ["UNLIMITED", "within_replication_quotas", "bytes_drawn", "ReplicationBudgets"]

UNLIMITED = np.iinfo(np.int64).max


def within_replication_quotas(taken: np.ndarray, unit_fetch: np.ndarray, unit_bytes: np.ndarray,
                              leader: np.ndarray, broker: np.ndarray, throttled: tuple[np.ndarray, np.ndarray],
                              budget: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per unit, whether the response carries it: `taken` and, on each side a fetch is throttled
    on, within that side's budget. `throttled` and `budget`: (leader side, follower side), per
    fetch."""
    n = len(leader)
    if len(unit_fetch) == 0 or n == 0:
        return taken
    carried = np.where(taken, unit_bytes, 0).astype(np.int64)
    # each unit's bytes counted from its fetch's first (the units of a fetch are consecutive)
    cumulative = np.cumsum(carried)
    starts = np.r_[True, unit_fetch[1:] != unit_fetch[:-1]]
    within_fetch = cumulative - np.maximum.accumulate(np.where(starts, cumulative - carried, 0))
    fetch_bytes = np.bincount(unit_fetch, weights=carried, minlength=n).astype(np.int64)
    allowed = taken.copy()
    # the leader's budget in its order of answering: by follower, then each request's order; the
    # follower's in its order of asking: by leader, then its request's order (the fetch order)
    fetch = np.arange(n)
    for flags, limit, owner, then in ((throttled[0], budget[0], leader, broker),
                                      (throttled[1], budget[1], broker, leader)):
        order = np.lexsort((fetch, then, owner))
        group = owner[order]
        drawn = np.where(flags, fetch_bytes, 0)[order]
        running = np.cumsum(drawn)
        group_start = np.r_[True, group[1:] != group[:-1]]
        before = np.empty(n, dtype=np.int64)
        before[order] = running - drawn - np.maximum.accumulate(np.where(group_start, running - drawn, 0))
        f = unit_fetch
        allowed &= ~flags[f] | (within_fetch + before[f] <= limit[f])
    return allowed


def bytes_drawn(carried: np.ndarray, unit_fetch: np.ndarray, unit_bytes: np.ndarray, by: np.ndarray,
                throttled: np.ndarray) -> dict[int, int]:
    """The bytes each broker `by` (per fetch: its leader, or its follower) drew on its budget: the
    `carried` units of the fetches `throttled` on that side."""
    drawn = carried & throttled[unit_fetch]
    if not drawn.any():
        return {}
    owners, at = np.unique(by[unit_fetch[drawn]], return_inverse=True)
    totals = np.bincount(at, weights=unit_bytes[drawn]).astype(np.int64)
    return dict(zip(owners.tolist(), totals.tolist()))


class ReplicationBudgets:
    """A round's replication budgets left (KIP-73: (broker, bytes) per side, a broker without one
    unlimited), drawn on response by response, and the bytes each throttled broker drew."""

    def __init__(self, leader_budgets: tuple[tuple[int, int], ...], follower_budgets: tuple[tuple[int, int], ...]
                 ) -> None:
        self.left = {"leader": dict(leader_budgets), "follower": dict(follower_budgets)}
        self.drawn: dict[tuple[str, int], int] = {}

    def _budget(self, side: str, brokers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether each of `brokers` has a budget on `side`, and what it has left."""
        none = np.iinfo(np.int64).min
        keys = np.array(list(self.left[side]), dtype=np.int64)
        left = lookup(keys, np.array(list(self.left[side].values()), dtype=np.int64), brokers, none)
        return left != none, np.where(left != none, left, UNLIMITED)

    def carried(self, taken: np.ndarray, unit_fetch: np.ndarray, unit_bytes: np.ndarray, leader: np.ndarray,
                broker: np.ndarray, out_of_sync: np.ndarray, listed: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Which `taken` units the budgets let through, drawn on them. Per fetch: its `leader` and
        follower `broker`, whether the replica is out of the ISR, and whether its topic's throttled
        replica lists name it (leader side, follower side)."""
        (leader_has, leader_left), (follower_has, follower_left) = self._budget("leader", leader), \
            self._budget("follower", broker)
        throttled = (listed[0] & out_of_sync & leader_has, listed[1] & out_of_sync & follower_has)
        carried = within_replication_quotas(taken, unit_fetch, unit_bytes, leader, broker, throttled,
                                            (leader_left, follower_left))
        for side, by, flags in (("leader", leader, throttled[0]), ("follower", broker, throttled[1])):
            for owner, n in bytes_drawn(carried, unit_fetch, unit_bytes, by, flags).items():
                self.left[side][owner] -= n
                self.drawn[(side, owner)] = self.drawn.get((side, owner), 0) + n
        return carried
