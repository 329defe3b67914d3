"""KIP-227 incremental fetch sessions: the leader's session cache and the fetcher's session handle
(Kafka's FetchSession.scala / FetchSessionHandler.java), as pure rules.

Two halves, by what they cost:
- Per session (O(fetchers x leaders), driver-side values): epochs, the session cache with its slots
  and eviction order, and the context a leader gives each fetch request (`new_context`). These are
  plain Python over small immutable values, like Kafka's own cache.
- Per partition (a Column expression, for consumers' sessions): which partitions a response must
  carry (`must_respond`); the round's followers use pipeline/control/fetch_session.py's arrays.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, replace
from typing import Iterable

from pyspark.sql import Column

from pipeline.errors import ErrorCode

__all__ = [
    "INITIAL_EPOCH", "FINAL_EPOCH", "INVALID_SESSION_ID", "EVICTION_MS", "Session", "Handle", "Context",
    "next_epoch", "is_evictable_by_privileged", "is_evictable_by_all", "try_evict", "new_session_id",
    "new_context", "follow_up", "must_respond", "sessions_to_json",
    "sessions_from_json", "REPLICA_FETCHER_PREFIX", "replica_fetcher",
    "round_contexts",
]

INITIAL_EPOCH = 0  # a full request that opens a session
FINAL_EPOCH = -1  # a full request with no session (and that closes the one named)
INVALID_SESSION_ID = 0
MAX_EPOCH = 2_147_483_647
# Kafka's FetchSessionCache evictionMs: a session unused this long may be evicted by anyone; one
# that has existed this long (at its last use) may be evicted for a larger one
EVICTION_MS = 120_000
REPLICA_FETCHER_PREFIX = "replica-"


def replica_fetcher(broker: int) -> str:
    """The fetcher name of a follower broker's replica fetcher (privileged)."""
    return f"{REPLICA_FETCHER_PREFIX}{broker}"


def next_epoch(epoch: int) -> int:
    """FetchMetadata.nextEpoch: 0 -> 1, ..., 2147483647 -> 1; a sessionless epoch stays -1."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == MAX_EPOCH else epoch + 1


@dataclass(frozen=True)
class Session:
    """A session in one leader's cache: `epoch` is the epoch it expects next."""

    leader: int
    fetcher: str
    privileged: bool
    session_id: int
    epoch: int
    created_ms: int
    last_used_ms: int
    size: int  # partitions cached


@dataclass(frozen=True)
class Handle:
    """The fetcher's side (FetchSessionHandler): the session id and the epoch of its next request.
    Epoch 0 with id 0 asks for a new session; epoch 0 with an id closes that one and asks anew."""

    fetcher: str
    leader: int
    session_id: int = INVALID_SESSION_ID
    epoch: int = INITIAL_EPOCH


@dataclass(frozen=True)
class Context:
    """What the leader made of one fetch request: `kind` is 'incremental', 'full' (a full
    response; `session_id` is the new session, or 0 when the cache had no room), 'sessionless'
    (epoch -1), or 'error' with `error_code`. `response_partitions`: how many partitions the
    response carried, where known (consumers' fetches)."""

    fetcher: str
    leader: int
    kind: str
    session_id: int
    error_code: str | None = None
    response_partitions: int | None = None


def is_evictable_by_privileged(s: Session) -> bool:
    """FetchSessionCache.touch: a privileged newcomer may evict an unprivileged session, or any
    session that had existed for more than EVICTION_MS when it was last used."""
    return (not s.privileged) or s.last_used_ms - s.created_ms > EVICTION_MS


def is_evictable_by_all(s: Session) -> bool:
    return s.last_used_ms - s.created_ms > EVICTION_MS


def _evictable_key(s: Session) -> tuple[bool, int, int]:
    return (s.privileged, s.size, s.session_id)


def try_evict(cache: list[Session], privileged: bool, size: int, now_ms: int,
              slots: int) -> tuple[bool, Session | None]:
    """FetchSessionCache.tryEvict: (may a new session of `size` partitions be cached, the session
    evicted for it). Free slot: yes. Else the least recently used session if it is stale (unused
    for more than EVICTION_MS); else the smallest evictable session by (privileged, size, id) if the
    newcomer's key (privileged, size, 0) is not smaller."""
    if len(cache) < slots:
        return True, None
    if cache:
        oldest = min(cache, key=lambda s: (s.last_used_ms, s.session_id))
        if oldest.last_used_ms + EVICTION_MS < now_ms:
            return True, oldest
    pool = [s for s in cache if (is_evictable_by_privileged(s) if privileged else is_evictable_by_all(s))]
    if not pool:
        return False, None
    victim = min(pool, key=_evictable_key)
    if (privileged, size, 0) < _evictable_key(victim):
        return False, None
    return True, victim


def new_session_id(rng: random.Random, taken: Iterable[int]) -> int:
    """A random 32-bit id, never 0, not in use (unique across the cluster: ids key the cache table)."""
    used = set(taken)
    while True:
        candidate = rng.randint(-2**31, 2**31 - 1)
        if candidate != INVALID_SESSION_ID and candidate not in used:
            return candidate


def new_context(cache: list[Session], handle: Handle, privileged: bool, size: int, now_ms: int, slots: int,
                rng: random.Random, taken: Iterable[int], sessionless: bool = False
                ) -> tuple[Context, list[Session], Handle, int]:
    """FetchManager.newContext plus the fetcher's FetchSessionHandler.handleResponse, for one request
    from `handle` to its leader, whose cache is `cache` (that leader's sessions only).

    `size`: partitions in a full request. Returns (context, the leader's cache after it, the
    fetcher's handle for its next request, sessions evicted). A successful incremental request
    touches its session (epoch + 1, last used now); its size is set after the round knows the
    partitions added and removed (run_round adds them up)."""
    by_id = {s.session_id: s for s in cache}
    leader, fetcher = handle.leader, handle.fetcher
    if sessionless:  # epoch -1: close any session named, answer without one
        rest = [s for s in cache if s.session_id != handle.session_id]
        return (Context(fetcher, leader, "sessionless", INVALID_SESSION_ID), rest,
                Handle(fetcher, leader, INVALID_SESSION_ID, FINAL_EPOCH), 0)
    if handle.epoch == INITIAL_EPOCH:  # full request: drop the session it names, open a new one
        rest = [s for s in cache if s.session_id != handle.session_id]
        admitted, victim = try_evict(rest, privileged, size, now_ms, slots)
        if not admitted:  # no room: a full response without a session; the fetcher asks again
            return (Context(fetcher, leader, "full", INVALID_SESSION_ID), rest,
                    Handle(fetcher, leader, INVALID_SESSION_ID, INITIAL_EPOCH), 0)
        rest = [s for s in rest if victim is None or s.session_id != victim.session_id]
        sid = new_session_id(rng, taken)
        session = Session(leader, fetcher, privileged, sid, next_epoch(INITIAL_EPOCH), now_ms, now_ms, size)
        return (Context(fetcher, leader, "full", sid), rest + [session],
                Handle(fetcher, leader, sid, next_epoch(INITIAL_EPOCH)), 0 if victim is None else 1)
    session = by_id.get(handle.session_id)
    if session is None:  # evicted (or never here): start over with a full request
        return (Context(fetcher, leader, "error", handle.session_id, ErrorCode.FETCH_SESSION_ID_NOT_FOUND),
                cache, Handle(fetcher, leader, INVALID_SESSION_ID, INITIAL_EPOCH), 0)
    if session.epoch != handle.epoch:  # a replayed or skipped request: close it, fetch in full
        return (Context(fetcher, leader, "error", handle.session_id, ErrorCode.INVALID_FETCH_SESSION_EPOCH),
                cache, Handle(fetcher, leader, handle.session_id, INITIAL_EPOCH), 0)
    touched = replace(session, epoch=next_epoch(session.epoch), last_used_ms=now_ms)
    rest = [s for s in cache if s.session_id != session.session_id]
    return (Context(fetcher, leader, "incremental", session.session_id), rest + [touched],
            Handle(fetcher, leader, session.session_id, next_epoch(handle.epoch)), 0)


def sessions_to_json(sessions: list[Session], handles: list[Handle], contexts: list[Context] = ()) -> str:
    """The cache and the handles as they stand after a round, and what the leaders made of the
    round's requests (kept in the round's metrics row)."""
    return json.dumps({"sessions": [asdict(s) for s in sorted(sessions, key=lambda s: (s.leader, s.fetcher))],
                       "handles": [asdict(h) for h in sorted(handles, key=lambda h: (h.leader, h.fetcher))],
                       "requests": [asdict(c) for c in contexts]})


def sessions_from_json(text: str | None) -> tuple[list[Session], list[Handle]]:
    if not text:
        return [], []
    data = json.loads(text)
    return [Session(**s) for s in data["sessions"]], [Handle(**h) for h in data["handles"]]


# -- per partition ----------------------------------------------------------------------------


def must_respond(records: Column, high_watermark: Column, cached_high_watermark: Column,
                 leader_log_start_offset: Column, cached_leader_log_start_offset: Column,
                 error_code: Column) -> Column:
    """CachedPartition.maybeUpdateResponseData: an incremental response carries a partition with
    records, a high watermark or log start offset other than the cached one, or an error."""
    return ((records > 0) | (high_watermark != cached_high_watermark)
            | (leader_log_start_offset != cached_leader_log_start_offset) | error_code.isNotNull())


def follow_up(sessions: list[Session], handles: list[Handle], session_ids: set[int]
              ) -> tuple[list[Session], list[Handle]]:
    """The follow-up fetch of a round (a fetcher's next request, sent as soon as it appended a
    response with records) in each session of `session_ids`: an incremental request at the epoch
    the session expects, so both sides move to the next epoch (it is used at the same time)."""
    if not session_ids:
        return sessions, handles
    return ([replace(s, epoch=next_epoch(s.epoch)) if s.session_id in session_ids else s for s in sessions],
            [replace(h, epoch=next_epoch(h.epoch)) if h.session_id in session_ids and h.epoch > 0 else h
             for h in handles])


def round_contexts(sessions: list[Session], handles: list[Handle], pairs: dict[tuple[int, int], int],
                   idle_fetchers: set[int], now_ms: int, slots: int, rng: random.Random, sessionless: bool
                   ) -> tuple[list[Context], list[Session], list[Handle], int]:
    """The fetch requests of one round, in Kafka's order of arrival here: per leader, its
    followers' replica fetchers by name. `pairs`: (follower, leader) -> partitions the follower
    fetches from that leader; followers in `idle_fetchers` send nothing. Returns the contexts, every
    leader's cache after them, every fetcher's handle, and the evictions."""
    by_pair = {(h.fetcher, h.leader): h for h in handles}
    contexts, evictions = [], 0
    cache = list(sessions)
    next_handles = dict(by_pair)
    for (follower, leader), size in sorted(pairs.items(), key=lambda kv: (kv[0][1], replica_fetcher(kv[0][0]))):
        if follower in idle_fetchers:
            continue
        fetcher = replica_fetcher(follower)
        handle = by_pair.get((fetcher, leader), Handle(fetcher, leader))
        mine = [s for s in cache if s.leader == leader]
        others = [s for s in cache if s.leader != leader]
        context, mine, handle, evicted = new_context(
            mine, handle, privileged=True, size=size, now_ms=now_ms, slots=slots, rng=rng,
            taken=[s.session_id for s in cache], sessionless=sessionless)
        cache = others + mine
        next_handles[(fetcher, leader)] = handle
        contexts.append(context)
        evictions += evicted
    return contexts, cache, list(next_handles.values()), evictions
