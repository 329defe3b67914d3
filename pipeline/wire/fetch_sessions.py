"""KIP-227 fetch sessions for the consumers at the front door (Kafka's FetchSession.scala:
FetchManager.newContext, FetchSession.update, CachedPartition, the contexts' responses).

A consumer on Fetch v7+ sends a full request at epoch 0; the door opens a session (its id in the
response) and caches each partition's fetch offset, max bytes and leader epoch, and the HW and log
start offset it last sent. Later requests are incremental (the session's id and the epoch it
expects next): they carry only partitions added or changed, and `forgotten_topics_data` for those
removed; the door fetches every partition of the session and its response carries only those with
records, a new HW or log start offset, or an error. A partition that sent records moves to the end
of the session, so the next response's byte budget starts with the others (Kafka 3's rotation).

The session-level rules (epochs, ids, the slots and the eviction order) are
pipeline/control/session_cache.py's, the ones the rounds' followers and the Python API's consumers
use; this module adds the partitions a session caches (pure functions over frozen values) and the
door's cache, `DoorSessions`, which holds them in memory as a Kafka broker does: a restarted door
has no sessions, and a consumer that names one gets FETCH_SESSION_ID_NOT_FOUND and starts again
with a full request.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from pipeline.control import session_cache as rules

__all__ = ["UNKNOWN", "Wanted", "Answer", "Opened", "request_metadata", "requested", "forgotten",
           "update_session", "respond", "DoorSessions"]

UNKNOWN = -1  # a HW or log start offset never sent in the session (CachedPartition's -1)
FIRST_SESSION_VERSION = 7  # Fetch v7 brought sessions (KIP-227); older requests are sessionless


@dataclass(frozen=True)
class Wanted:
    """A partition as a fetch request asks for it, or as a session caches it (CachedPartition):
    the fetch offset, the bytes asked (partition_max_bytes), the leader epoch the consumer knows,
    and the HW and log start offset the session last sent."""

    topic: str
    partition: int
    fetch_offset: int
    max_bytes: int
    leader_epoch: int = -1
    high_watermark: int = UNKNOWN
    log_start_offset: int = UNKNOWN

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)


@dataclass(frozen=True)
class Answer:
    """What a partition's response holds: its HW and log start offset (-1 with an error), the bytes
    of records it carries, and its error's name (None: none)."""

    high_watermark: int
    log_start_offset: int
    record_bytes: int = 0
    error: str | None = None


def request_metadata(version: int, body: Any) -> tuple[int, int]:
    """(session id, session epoch) of a fetch request; before v7, a sessionless one (0, -1)."""
    if version < FIRST_SESSION_VERSION:
        return rules.INVALID_SESSION_ID, rules.FINAL_EPOCH
    return int(body.session_id), int(body.session_epoch)


def requested(body: Any) -> list[Wanted]:
    """The partitions the request names, in its order."""
    return [Wanted(t.topic, int(p.partition), int(p.fetch_offset), int(p.partition_max_bytes),
                   int(getattr(p, "current_leader_epoch", -1)))
            for t in body.topics for p in t.partitions]


def forgotten(version: int, body: Any) -> list[tuple[str, int]]:
    """The partitions an incremental request removes from its session (v7+)."""
    if version < FIRST_SESSION_VERSION:
        return []
    return [(t.topic, int(p)) for t in body.forgotten_topics_data for p in t.partitions]


def update_session(parts: tuple[Wanted, ...], asked: Iterable[Wanted], forget: Iterable[tuple[str, int]]
                   ) -> tuple[tuple[Wanted, ...], list, list, list]:
    """FetchSession.update: (the session's partitions after an incremental request, added,
    updated, removed). A partition asked that the session has keeps its place and its last sent
    HW and log start offset and takes the request's offset, bytes and epoch; a new one goes last;
    a forgotten one leaves."""
    by_key = {p.key: p for p in parts}
    order = [p.key for p in parts]
    added, updated, removed = [], [], []
    for w in asked:
        if w.key in by_key:
            old = by_key[w.key]
            by_key[w.key] = replace(w, high_watermark=old.high_watermark, log_start_offset=old.log_start_offset)
            updated.append(w.key)
        else:
            by_key[w.key] = replace(w, high_watermark=UNKNOWN, log_start_offset=UNKNOWN)
            order.append(w.key)
            added.append(w.key)
    for key in forget:
        if key in by_key:
            del by_key[key]
            order.remove(key)
            removed.append(key)
    return tuple(by_key[k] for k in order), added, updated, removed


def respond(kind: str, parts: tuple[Wanted, ...], answers: dict[tuple[str, int], Answer]
            ) -> tuple[list[tuple[str, int]], tuple[Wanted, ...]]:
    """(the partitions the response carries, in order; the session's partitions after it).

    A full response carries every partition and the session caches what it sent.
    An incremental one carries a partition with records, an error, or a HW or log start offset
    other than the one last sent (CachedPartition.maybeUpdateResponseData); it caches what it
    sent, except that an error caches HW -1 so the partition is sent again once the error is
    gone; a partition that carried records moves to the end of the session."""
    if kind != "incremental":
        return [p.key for p in parts], tuple(
            replace(p, high_watermark=answers[p.key].high_watermark, log_start_offset=answers[p.key].log_start_offset)
            for p in parts)
    carried, stay, last = [], [], []
    for p in parts:
        a = answers[p.key]
        must = (a.record_bytes > 0 or a.error is not None or a.high_watermark != p.high_watermark
                or a.log_start_offset != p.log_start_offset)
        if not must:
            stay.append(p)
            continue
        carried.append(p.key)
        sent = replace(p, high_watermark=UNKNOWN if a.error is not None else a.high_watermark,
                       log_start_offset=a.log_start_offset)
        (last if a.record_bytes > 0 else stay).append(sent)
    return carried, tuple(stay + last)


@dataclass(frozen=True)
class Opened:
    """What the door made of a fetch request: `kind` ('full', 'incremental', 'sessionless' or
    'error'), the session id the response names (0 for none), the top-level error's name, and the
    partitions to read, in the order the response takes them."""

    kind: str
    session_id: int
    error: str | None = None
    fetch: tuple[Wanted, ...] = ()
    epoch: int = 0  # the epoch the session expects after this request (incremental)


@dataclass
class DoorSessions:
    """The door's fetch session cache: sessions (session_cache.Session values, unprivileged) with
    the partitions each caches. Thread-safe: each call
    takes the cache's lock, as Kafka's FetchSessionCache and FetchSession synchronize."""

    rng: random.Random = field(default_factory=random.Random)
    sessions: dict[int, rules.Session] = field(default_factory=dict)
    partitions: dict[int, tuple[Wanted, ...]] = field(default_factory=dict)
    evictions: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def open(self, version: int, body: Any, now_ms: int, fetcher: str, leader: int = -1, slots: int = 0) -> Opened:
        """FetchManager.newContext for one request. For a full request at epoch 0, `leader` is the
        broker it is for and `slots` the slots that leader's cache has for the door's sessions
        (max.incremental.fetch.session.cache.slots less the sessions the rounds' followers and the
        API's consumers hold there, which the door's never evict)."""
        session_id, epoch = request_metadata(version, body)
        asked = requested(body)
        with self.lock:
            if epoch in (rules.INITIAL_EPOCH, rules.FINAL_EPOCH):  # full: any session it names is closed
                self._drop(session_id)
                if epoch == rules.FINAL_EPOCH:
                    return Opened("sessionless", rules.INVALID_SESSION_ID, fetch=tuple(asked))
                mine = [s for s in self.sessions.values() if s.leader == leader]
                context, after, _, evicted = rules.new_context(
                    mine, rules.Handle(fetcher, leader), privileged=False, size=len(asked), now_ms=now_ms,
                    slots=max(0, slots), rng=self.rng, taken=self.sessions)
                for gone in {s.session_id for s in mine} - {s.session_id for s in after}:
                    self._drop(gone)
                self.evictions += evicted
                if context.session_id != rules.INVALID_SESSION_ID:
                    self.sessions[context.session_id] = next(s for s in after if s.session_id == context.session_id)
                    self.partitions[context.session_id] = tuple(asked)
                return Opened("full", context.session_id, fetch=tuple(asked))
            session = self.sessions.get(session_id)
            handle = rules.Handle(fetcher, session.leader if session else -1, session_id, epoch)
            context, after, _, _ = rules.new_context(
                [session] if session else [], handle, privileged=False, size=0, now_ms=now_ms, slots=0,
                rng=self.rng, taken=())
            if context.kind == "error":
                return Opened("error", rules.INVALID_SESSION_ID, context.error_code)
            parts, _, _, _ = update_session(self.partitions[session_id], asked, forgotten(version, body))
            if not parts:  # the request removed every partition: the session closes
                self._drop(session_id)
                return Opened("sessionless", rules.INVALID_SESSION_ID, fetch=tuple(asked))
            touched = replace(after[0], size=len(parts))
            self.sessions[session_id], self.partitions[session_id] = touched, parts
            return Opened("incremental", session_id, fetch=parts, epoch=touched.epoch)

    def close(self, opened: Opened, answers: dict[tuple[str, int], Answer]) -> tuple[list[tuple[str, int]], str | None]:
        """The partitions the response carries and its top-level error, caching what it sends.
        An incremental session whose epoch moved while the request waited (a duplicate request)
        is answered INVALID_FETCH_SESSION_EPOCH, as Kafka's IncrementalFetchContext does."""
        with self.lock:
            if opened.kind == "incremental":
                session = self.sessions.get(opened.session_id)
                if session is None or session.epoch != opened.epoch:
                    return [], "INVALID_FETCH_SESSION_EPOCH"
                carried, parts = respond("incremental", self.partitions[opened.session_id], answers)
                self.partitions[opened.session_id] = parts
                return carried, None
            carried, parts = respond("full", opened.fetch, answers)
            if opened.kind == "full" and opened.session_id in self.partitions:
                self.partitions[opened.session_id] = parts
            return carried, None

    def _drop(self, session_id: int) -> None:
        self.sessions.pop(session_id, None)
        self.partitions.pop(session_id, None)

    def snapshot(self) -> list[tuple[rules.Session, tuple[Wanted, ...]]]:
        """The sessions and their partitions as they stand, by session id."""
        with self.lock:
            return [(self.sessions[k], self.partitions[k]) for k in sorted(self.sessions)]
