"""KIP-227's per-partition rules over arrays of replicas (any shape; every argument broadcasts):
which partitions an incremental fetch request carries, which its response must carry, and the
leader's cached partition after responding (Kafka's FetchSessionHandler and CachedPartition).

The per-session half (ids, epochs, the cache's slots and evictions) is pipeline/control/session_cache.py's,
run by the driver before the round: the control job gets what the leader made of each request as
`RoundContext.fetch_contexts`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["NO_SESSION", "UNKNOWN", "CachedPartitions", "request_carries", "must_respond", "cache_after_response"]

NO_SESSION = 0  # INVALID_SESSION_ID: the partition is in no session of its leader
UNKNOWN = -1  # a cached value never sent (a partition new to the session), or reset by an error


@dataclass(frozen=True)
class CachedPartitions:
    """Each follower's entry in its leader's session cache (arrays of one shape): the session it is
    cached in, the max bytes the fetcher asked for, and the HW and log start offset last sent."""

    session_id: np.ndarray
    max_bytes: np.ndarray
    high_watermark: np.ndarray
    leader_log_start_offset: np.ndarray


def request_carries(cached: np.ndarray, fetch_offset: np.ndarray, cached_fetch_offset: np.ndarray,
                    max_bytes: np.ndarray, cached_max_bytes: np.ndarray) -> np.ndarray:
    """FetchSessionHandler.Builder.build: an incremental request carries a partition the session
    does not cache (added), or one whose fetch offset or max bytes differ from the cached ones
    (altered). The rest the leader serves from its cache."""
    return ~cached | (fetch_offset != cached_fetch_offset) | (max_bytes != cached_max_bytes)


def must_respond(records: np.ndarray, high_watermark: np.ndarray, cached_high_watermark: np.ndarray,
                 leader_log_start_offset: np.ndarray, cached_leader_log_start_offset: np.ndarray) -> np.ndarray:
    """CachedPartition.maybeUpdateResponseData: an incremental response carries a partition with
    records, or with a HW or log start offset other than the ones last sent (UNKNOWN for a
    partition new to the session, so it is always carried)."""
    return ((records > 0) | (high_watermark != cached_high_watermark)
            | (leader_log_start_offset != cached_leader_log_start_offset))


def cache_after_response(cache: CachedPartitions, fetched: np.ndarray, session_id: np.ndarray,
                         max_bytes: np.ndarray, responded: np.ndarray, high_watermark: np.ndarray,
                         leader_log_start_offset: np.ndarray) -> CachedPartitions:
    """The leader's cache after answering the `fetched` replicas' requests in session `session_id`
    (NO_SESSION: a sessionless request, or a full one the cache had no room for, which caches
    nothing): a partition the response carried caches the values it sent, one it left out keeps
    what it had; replicas that did not fetch keep their entries."""
    in_session = fetched & (session_id != NO_SESSION)
    was_here = cache.session_id == session_id
    sent_hw = np.where(was_here, cache.high_watermark, UNKNOWN)
    sent_lso = np.where(was_here, cache.leader_log_start_offset, UNKNOWN)
    return CachedPartitions(
        session_id=np.where(fetched, np.where(in_session, session_id, NO_SESSION), cache.session_id),
        max_bytes=np.where(fetched, np.where(in_session, max_bytes, 0), cache.max_bytes),
        high_watermark=np.where(fetched, np.where(in_session & responded, high_watermark,
                                                  np.where(in_session, sent_hw, UNKNOWN)), cache.high_watermark),
        leader_log_start_offset=np.where(fetched, np.where(in_session & responded, leader_log_start_offset,
                                                           np.where(in_session, sent_lso, UNKNOWN)),
                                         cache.leader_log_start_offset))

