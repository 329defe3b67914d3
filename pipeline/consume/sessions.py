"""Consumers' incremental fetches (KIP-227's unprivileged sessions): `read_incremental` returns only
the partitions of a topic with committed records the consumer has not read yet.

A consumer fetches from every leader of the topic's partitions, one session per (consumer, leader)
in that leader's session cache, which it shares with the followers' (privileged) sessions of the
rounds: same slots (`max.incremental.fetch.session.cache.slots` per leader), same eviction order
(fetch_session.try_evict), same epochs and errors. Session-level values are O(consumers x leaders)
rows read on the driver; positions and cached partition entries are DataFrames.

Positions start at each partition's log start offset (Kafka's auto.offset.reset=earliest) and
advance to the high watermark on every response: a call returns every committed record it has not
returned before (no per-partition byte limit).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from functools import reduce
from typing import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline.control import session_cache as sessions
from pipeline.schemas import CLIENT_SESSIONS_SCHEMA, CONSUMER_POSITIONS_SCHEMA, PARTITION_KEY
from pipeline.storage import Storage

__all__ = ["CONSUMER_PREFIX", "consumer_fetcher", "ClientSessions", "load_client_sessions",
           "client_session_rows", "save_client_sessions", "client_cache_after_round", "read_incremental",
           "Fetched", "fetch_incremental", "throttled_fetch", "advance_positions"]

CONSUMER_PREFIX = "consumer-"
_POSITION_KEY = ["consumer_id", "topic", "partition"]


def consumer_fetcher(consumer_id: str) -> str:
    return f"{CONSUMER_PREFIX}{consumer_id}"


@dataclass(frozen=True)
class ClientSessions:
    """The client_sessions table as values: consumers' cache entries, their handles, and the ids of
    follower sessions that consumers evicted."""

    sessions: list[sessions.Session]
    handles: list[sessions.Handle]
    evicted: list[sessions.Session]

    def cache(self, followers: list[sessions.Session]) -> list[sessions.Session]:
        """Every leader's cache: the followers' sessions consumers have not evicted, and theirs."""
        gone = {e.session_id for e in self.evicted}
        return [s for s in followers if s.privileged and s.session_id not in gone] + self.sessions


def load_client_sessions(storage: Storage) -> ClientSessions:
    storage.ensure("client_sessions")
    if storage.unwritten("client_sessions"):  # no consumer has had a session: no Spark job to say so
        return ClientSessions([], [], [])
    rows = [r.asDict() for r in storage.read("client_sessions").collect()]  # O(consumers x leaders)
    as_session = [sessions.Session(**{k: v for k, v in r.items() if k != "kind"}) for r in rows]
    return ClientSessions(
        [s for s, r in zip(as_session, rows) if r["kind"] == "session"],
        [sessions.Handle(r["fetcher"], r["leader"], r["session_id"], r["epoch"]) for r in rows if r["kind"] == "handle"],
        [s for s, r in zip(as_session, rows) if r["kind"] == "evicted"])


def client_session_rows(state: ClientSessions) -> list[tuple]:
    def row(kind: str, s: sessions.Session) -> tuple:
        return (kind, s.fetcher, s.leader, s.privileged, s.session_id, s.epoch, s.created_ms, s.last_used_ms,
                s.size)
    return ([row("session", s) for s in state.sessions]
            + [("handle", h.fetcher, h.leader, False, h.session_id, h.epoch, 0, 0, 0) for h in state.handles]
            + [row("evicted", s) for s in state.evicted])


def save_client_sessions(storage: Storage, state: ClientSessions) -> None:
    spark = storage.spark
    storage.overwrite_table(spark.createDataFrame(client_session_rows(state), CLIENT_SESSIONS_SCHEMA),
                            "client_sessions")


@dataclass(frozen=True)
class Fetched:
    """One consumer fetch before it is committed: the records, the leaders' contexts, the ranges
    it read per partition (topic, partition, start_offset, end_offset: the HW it moves to), and
    `commit`, which saves the sessions and moves the positions."""

    records: DataFrame
    contexts: list
    ranges: DataFrame
    commit: Callable[[], None]
    # the consumer's fetch quota (consumer_byte_rate): how long it should wait before its next
    # fetch; a fetch while it waits is served empty (Cluster.fetch_incremental)
    throttle_time_ms: int = 0


def read_incremental(storage: Storage, brokers: list[int], round_sessions: list[sessions.Session],
                     consumer_id: str, topic: str, now_ms: int, slots: int,
                     rng: random.Random) -> tuple[DataFrame, list[sessions.Context]]:
    """One fetch of `consumer_id` for `topic` from each leader of its partitions, committed.
    Returns (the records: topic, partition, offset, leader_epoch, timestamp, key, value of every
    partition the responses carried; the leaders' contexts, with the partitions each response
    carried). `round_sessions`: the sessions after the newest round (its followers' share the
    leaders' caches)."""
    fetched = fetch_incremental(storage, brokers, round_sessions, consumer_id, topic, now_ms, slots, rng)
    fetched.commit()
    return fetched.records, fetched.contexts


def fetch_incremental(storage: Storage, brokers: list[int], round_sessions: list[sessions.Session],
                      consumer_id: str, topic: str, now_ms: int, slots: int, rng: random.Random) -> Fetched:
    """read_incremental's fetch, not yet committed (see Fetched)."""
    spark = storage.spark
    storage.ensure("consumer_positions")
    fetcher = consumer_fetcher(consumer_id)
    clients = load_client_sessions(storage)
    cache = clients.cache(round_sessions)
    handles = {h.leader: h for h in clients.handles if h.fetcher == fetcher}

    leaders = storage.read("partitions").filter((F.col("topic") == topic) & (F.col("leader") >= 0)).select(
        *PARTITION_KEY, "leader")
    sizes = {r["leader"]: r["count"] for r in leaders.groupBy("leader").count().collect()}  # O(brokers)
    contexts, evicted = [], []
    for leader in sorted(sizes):
        handle = handles.get(leader, sessions.Handle(fetcher, leader))
        mine = [s for s in cache if s.leader == leader]
        others = [s for s in cache if s.leader != leader]
        context, mine_after, handles[leader], _ = sessions.new_context(
            mine, handle, privileged=False, size=sizes[leader], now_ms=now_ms, slots=slots, rng=rng,
            taken=[s.session_id for s in cache])
        evicted += [s for s in mine if s.session_id not in {m.session_id for m in mine_after}
                    and s.session_id != handle.session_id]
        cache = others + mine_after
        contexts.append(context)

    ctx = spark.createDataFrame([(c.leader, c.kind, c.session_id) for c in contexts],
                                "leader int, fetch_kind string, request_session_id int")
    positions = storage.read("consumer_positions").filter(
        (F.col("consumer_id") == consumer_id) & (F.col("topic") == topic)).drop("consumer_id", "updated_ms")
    state = storage.replica_state().filter(F.col("topic") == topic).select(
        *PARTITION_KEY, F.col("broker").alias("leader"), "high_watermark", "log_start_offset")
    in_cache = F.col("session_id") == F.col("request_session_id")
    position = F.greatest(F.coalesce(F.col("position"), F.col("log_start_offset")), F.col("log_start_offset"))
    unknown = F.lit(-1).cast("long")
    served = (
        leaders.join(state, on=[*PARTITION_KEY, "leader"], how="inner")
        .join(F.broadcast(ctx), on="leader", how="inner")
        .filter(F.col("fetch_kind") != "error")
        .join(positions, on=PARTITION_KEY, how="left")
        .withColumn("from_offset", position)
        .withColumn("responded", F.when(F.col("fetch_kind") != "incremental", F.lit(True)).otherwise(
            sessions.must_respond(F.col("high_watermark") - F.col("from_offset"), F.col("high_watermark"),
                                  F.when(in_cache, F.col("cached_high_watermark")).otherwise(unknown),
                                  F.col("log_start_offset"),
                                  F.when(in_cache, F.col("cached_log_start_offset")).otherwise(unknown),
                                  F.lit(None).cast("string"))))
        .filter("responded")
    ).localCheckpoint()
    carried = {r["leader"]: r["count"] for r in served.groupBy("leader").count().collect()}  # O(brokers)
    contexts = [replace(c, response_partitions=carried.get(c.leader, 0)) for c in contexts]
    logs = [storage.read_log(b).filter(F.col("topic") == topic).withColumn("leader", F.lit(b)) for b in brokers]
    log = reduce(DataFrame.unionByName, logs)
    records = (
        log.join(served.filter(F.col("high_watermark") > F.col("from_offset"))
                 .select(*PARTITION_KEY, "leader", "from_offset", "high_watermark"),
                 on=[*PARTITION_KEY, "leader"], how="inner")
        .filter((F.col("offset") >= F.col("from_offset")) & (F.col("offset") < F.col("high_watermark")))
        .select("topic", "partition", "offset", "leader_epoch", "timestamp", "key", "value")
    ).localCheckpoint()

    cached = (F.col("request_session_id") != sessions.INVALID_SESSION_ID) & F.col("fetch_kind").isin(
        "full", "incremental")
    moved = served.select(
        F.lit(consumer_id).alias("consumer_id"), *PARTITION_KEY, F.col("high_watermark").alias("position"),
        F.when(cached, F.col("request_session_id")).otherwise(0).alias("session_id"),
        F.when(cached, F.col("high_watermark")).otherwise(unknown).alias("cached_high_watermark"),
        F.when(cached, F.col("log_start_offset")).otherwise(unknown).alias("cached_log_start_offset"),
        F.lit(now_ms).cast("long").alias("updated_ms"))
    def commit() -> None:
        # the sessions first: a crash before the positions land leaves positions the next call
        # serves again from (nothing skipped), where the other order could skip a response never
        # returned
        consumers = [s for s in cache if not s.privileged]
        followers_evicted = [s for s in evicted if s.privileged]
        save_client_sessions(storage, ClientSessions(
            consumers, [h for h in clients.handles if h.fetcher != fetcher] + list(handles.values()),
            clients.evicted + followers_evicted))
        storage.upsert(moved.select(*CONSUMER_POSITIONS_SCHEMA.fieldNames()), "consumer_positions", _POSITION_KEY)

    ranges = served.select(*PARTITION_KEY, F.col("from_offset").alias("start_offset"),
                           F.col("high_watermark").alias("end_offset"))
    return Fetched(records, contexts, ranges, commit)


def throttled_fetch(storage: Storage, throttle_ms: int) -> Fetched:
    """A fetch the consumer's quota holds back: no records, nothing read or moved (Kafka's
    throttled response: empty, with the time left to wait)."""
    spark = storage.spark
    records = spark.createDataFrame([], "topic string, partition int, offset long, leader_epoch int, "
                                        "timestamp long, key binary, value binary")
    ranges = spark.createDataFrame([], "topic string, partition int, start_offset long, end_offset long")
    return Fetched(records, [], ranges, lambda: None, throttle_ms)


def advance_positions(storage: Storage, consumer_id: str, ranges_df: DataFrame, now_ms: int) -> None:
    """Moves `consumer_id`'s positions up to each range's end_offset (never back); a partition
    without a position gets one, outside any session (its next fetch serves it whole)."""
    storage.ensure("consumer_positions")
    rows = ranges_df.select(
        F.lit(consumer_id).alias("consumer_id"), *PARTITION_KEY, F.col("end_offset").alias("position"),
        F.lit(0).alias("session_id"), F.lit(-1).cast("long").alias("cached_high_watermark"),
        F.lit(-1).cast("long").alias("cached_log_start_offset"), F.lit(now_ms).cast("long").alias("updated_ms"))
    storage.update_if(rows.select(*CONSUMER_POSITIONS_SCHEMA.fieldNames()), "consumer_positions", _POSITION_KEY,
                      only_if="t.position < s.position", insert=True)


def client_cache_after_round(clients: ClientSessions, after: list[sessions.Session]) -> ClientSessions | None:
    """The client_sessions table after a round whose cache ended as `after`: consumers' sessions the
    round's followers evicted are gone (None: nothing to write)."""
    kept = {s.session_id for s in after}
    if all(s.session_id in kept for s in clients.sessions):
        return None
    return ClientSessions([s for s in clients.sessions if s.session_id in kept], clients.handles, clients.evicted)

