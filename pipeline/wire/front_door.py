"""The front door: Kafka's protocol served from a cluster (issue 51). `serve(cluster, ...)` starts
the server (pipeline/wire/server.py) with a handler that answers each API from the cluster's
tables through the rules in this package; the replication job may run beside it on the root, or
the door runs the rounds itself (`run_rounds`).

Served: ApiVersions, Metadata (v0-v12), Produce (v3-v9), Fetch (v4-v12), ListOffsets (v1-v6),
InitProducerId (v0-v4), CreateTopics (v2-v7), and for consumers that assign their partitions
themselves FindCoordinator (v0-v3), OffsetCommit (v2-v8) and OffsetFetch (v1-v7)
(pipeline/wire/groups.py). A client that asks for any other API has its connection closed, as
Kafka closes one for an API it does not serve.

The door's calls into the cluster take one lock (a Cluster object is used by one thread at a
time); the rounds it runs use a Cluster of their own. A request that waits (a Produce for its round's result,
a Fetch with nothing new for max.wait.ms) waits without it, on a RoundWatch: the rounds table's
version, read from its Delta log every POLL_MS (no Spark job), so rounds run by a job beside the
door wake it as well as the door's own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

from pyspark.sql import functions as F

from pipeline.core import newest_report
from pipeline.errors import ReplogError
from pipeline.control import session_cache as session_rules
from pipeline.wire.fetch import FETCH, RECORD_OVERHEAD, answers, fetch_ranges, fetch_response
from pipeline.wire.fetch_sessions import DoorSessions, request_metadata, requested
from pipeline.wire.groups import (FIND_COORDINATOR, OFFSET_COMMIT, OFFSET_FETCH, find_coordinator_response,
                                  offset_commit_plan, offset_commit_response, offset_fetch_response)
from pipeline.wire.list_offsets import EARLIEST, LIST_OFFSETS, list_offsets_response, timestamps_asked
from pipeline.wire.metadata import METADATA, metadata_response, requested_topics
from pipeline.wire.produce import (INIT_PRODUCER_ID, PRODUCE, init_producer_id_response, produce_plan,
                                   produce_response, result_of)
from pipeline.wire.protocol import API_VERSIONS, MAX_REQUEST_BYTES, ProtocolError, Request
from pipeline.wire.records import write_fetched
from pipeline.wire.server import WireServer, serve_kafka
from pipeline.wire.topics import CREATE_TOPICS, create_topics_response, topics_asked

__all__ = ["FrontDoor", "RoundWatch", "serve", "SERVED_APIS", "POLL_MS"]

LOG = logging.getLogger("replog.wire")

# api key -> the versions the door serves (ApiVersions announces them). Fetch stops at v12 and
# Produce at v9: later versions name topics by id only.
SERVED_APIS = {PRODUCE: (3, 9), FETCH: (4, 12), API_VERSIONS: (0, 3), METADATA: (0, 12), LIST_OFFSETS: (1, 6),
               FIND_COORDINATOR: (0, 3), OFFSET_COMMIT: (2, 8), OFFSET_FETCH: (1, 7), CREATE_TOPICS: (2, 7),
               INIT_PRODUCER_ID: (0, 4)}

# the fetcher name of a consumer's session at the door, before its client id
WIRE_FETCHER_PREFIX = "wire-"

# how often a waiting request looks for a new round (the rounds table's Delta log, ~4 ms a look)
POLL_MS = 100


class RoundWatch:
    """The rounds table's newest version, looked up every POLL_MS while someone waits for a round."""

    def __init__(self, storage: Any, poll_ms: int = POLL_MS):
        self.storage, self.poll_ms = storage, poll_ms
        self.closed = threading.Event()

    def version(self) -> int:
        return self.storage.version("rounds")

    def wait_past(self, version: int, deadline: float) -> int | None:
        """Waits until a round committed after `version` (its version) or the monotonic `deadline`
        (None)."""
        while not self.closed.is_set():
            now = self.version()
            if now > version:
                return now
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.closed.wait(min(left, self.poll_ms / 1000))
        return None


class RoundLoop:
    """Rounds run by the door itself (serve(run_rounds=True)): one every `interval_ms`, or at once
    when a produce request arrives. They run on a Cluster of their own on the root, as a job beside
    the door would, so the door answers requests while a round runs."""

    def __init__(self, cluster: Any, interval_ms: int):
        from pipeline.cluster import Cluster
        self.cluster = Cluster.open(cluster.spark, cluster.storage.root, clock=cluster.core.clock, views=False)
        self.interval_ms = interval_ms
        self.kicked, self.stopped = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name="replog-wire-rounds", daemon=True)
        self.thread.start()

    def kick(self) -> None:
        self.kicked.set()

    def stop(self) -> None:
        self.stopped.set()
        self.kicked.set()
        self.thread.join(timeout=120)

    def _run(self) -> None:
        busy = False
        while not self.stopped.is_set():
            if not busy:
                self.kicked.wait(self.interval_ms / 1000)
            self.kicked.clear()
            if self.stopped.is_set():
                return
            try:
                report = self.cluster.run_round()
                busy = not self.cluster.caught_up(report)
            except Exception:  # noqa: BLE001 - a failed round is logged and the next one runs
                LOG.exception("a round run by the front door failed")
                busy = False

class FrontDoor:
    """The handler: a request in, its response entity out, from `cluster`'s state. `host` and
    `port`: the address Metadata gives for every broker (the door's own)."""

    def __init__(self, cluster: Any, host: str, port: int, run_rounds: bool = False, round_interval_ms: int = 1000):
        self.cluster, self.host, self.port = cluster, host, port
        self.lock = threading.RLock()
        self.watch = RoundWatch(cluster.storage)
        self.rounds = RoundLoop(cluster, round_interval_ms) if run_rounds else None
        self._ids: list[int] = []
        self._rows: tuple | None = None  # (tables' versions, describe() rows): _partition_rows
        self._held: tuple | None = None  # (tables' versions, sessions per leader): _slots_for
        self.sessions = DoorSessions()  # consumers' KIP-227 fetch sessions, in memory as in a broker
        self.fetch_kinds: Counter = Counter()  # fetch requests by what the door made of them

    def close(self) -> None:
        """Stops the door's rounds and releases the requests that wait."""
        self.watch.closed.set()
        if self.rounds is not None:
            self.rounds.stop()

    def __call__(self, request: Request) -> Any:
        if request.api_key == PRODUCE:
            return self.produce(request)
        if request.api_key == FETCH:
            return self.fetch(request)
        with self.lock:
            if request.api_key == METADATA:
                return self.metadata(request)
            if request.api_key == LIST_OFFSETS:
                return self.list_offsets(request)
            if request.api_key == FIND_COORDINATOR:
                return find_coordinator_response(request.api_version, request.body, self._live(), self.host, self.port)
            if request.api_key == OFFSET_COMMIT:
                return self.offset_commit(request)
            if request.api_key == OFFSET_FETCH:
                return self.offset_fetch(request)
            if request.api_key == INIT_PRODUCER_ID:
                return self.init_producer_id(request)
            if request.api_key == CREATE_TOPICS:
                return self.create_topics(request)
        raise AssertionError(f"API key {request.api_key} is not served")  # (the server admits only SERVED_APIS)

    # -- produce -----------------------------------------------------------------------------
    def produce(self, request: Request) -> Any:
        """Appends the request's records to the inbox (one produce request per topic), then waits
        for the rounds' results (acks 1 and -1) until the request's timeout."""
        body = request.body
        deadline = time.monotonic() + max(int(body.timeout.total_seconds() * 1000), 0) / 1000
        with self.lock:
            counts = {}
            for topic in {t.name for t in body.topic_data}:
                meta = self.cluster.core.metadata.topic(topic)
                if meta is not None:
                    counts[topic] = meta["partitions"]
            plan = produce_plan(body, counts)
            version = self.watch.version()
            ids = {topic: self.cluster.produce(topic, records, acks=plan.acks, client_id=request.client_id or None)
                   for topic, records in plan.records.items()}
        if self.rounds is not None and ids:
            self.rounds.kick()
        if plan.acks == 0:
            if plan.errors:  # (Kafka's KafkaApis: no response to send, so the client learns by the close)
                raise ProtocolError(f"an acks=0 produce with errors: {sorted(plan.errors.values())[0][1]}")
            return None
        waiting = {(topic, p): ids[topic] for topic, parts in plan.partitions.items() for p in parts}
        answers: dict = {}
        while waiting:  # (results come from rounds: looked up once a round has committed)
            seen = self.watch.wait_past(version, deadline)
            if seen is None:
                break
            version = seen
            self._answer(waiting, answers)
        with self.lock:
            log_start = self._log_start(list(answers)) if answers else {}
        return produce_response(request.api_version, body, plan, answers, log_start)

    def _answer(self, waiting: dict, answers: dict) -> None:
        """Moves the partitions whose results are final from `waiting` to `answers`."""
        with self.lock:
            rows = (self.cluster.produce_results().filter(F.col("request_id").isin(sorted(set(waiting.values()))))
                    .select("request_id", "topic", "partition", "status", "error_code", "base_offset").collect())
        by_key = {(r["request_id"], r["topic"], r["partition"]): r.asDict() for r in rows}
        for (topic, partition), request_id in list(waiting.items()):
            row = by_key.get((request_id, topic, partition))
            answer = result_of([row] if row else [])
            if answer is not None:
                answers[(topic, partition)] = answer
                del waiting[(topic, partition)]

    def _partition_rows(self, topics: Any = None) -> dict[tuple[str, int], dict]:
        """describe()'s rows by (topic, partition), of `topics` (None: all), read again only when
        the partitions, replica_state or topics table has a new version (~4 ms a look): a consumer
        that polls with nothing new costs no Spark job."""
        storage = self.cluster.storage
        key = tuple(storage.version(t) for t in ("partitions", "replica_state", "topics"))
        if self._rows is None or self._rows[0] != key:
            self._rows = (key, {(r["topic"], r["partition"]): r.asDict() for r in self.cluster.describe().select(
                "topic", "partition", "leader", "leader_epoch", "replicas", "isr", "log_start_offset",
                "high_watermark", "log_end_offset").collect()})
        rows = self._rows[1]
        return rows if topics is None else {k: v for k, v in rows.items() if k[0] in set(topics)}

    def _log_start(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        rows = self._partition_rows({t for t, _ in keys})
        return {k: r["log_start_offset"] for k, r in rows.items()}

    def init_producer_id(self, request: Request) -> Any:
        producer_id = None
        if request.body.transactional_id is None:
            if not self._ids:
                self._ids = list(reversed(self.cluster.producer_id_block()))
            producer_id = self._ids.pop()
        return init_producer_id_response(request.api_version, request.body, producer_id)

    # -- fetch -------------------------------------------------------------------------------
    def fetch(self, request: Request) -> Any:
        """A consumer's fetch in its KIP-227 session (pipeline/wire/fetch_sessions.py): the committed
        records of the partitions it reads from their fetch offsets; with none, waits for a round
        until max.wait.ms and looks once more. The response carries what the session's rules say."""
        body = request.body
        leader = slots = 0
        if request_metadata(request.api_version, body)[1] == session_rules.INITIAL_EPOCH:  # may open a session
            with self.lock:
                leader = self._leader_of(requested(body))
                slots = self._slots_for(leader)
        opened = self.sessions.open(request.api_version, body, self.cluster.core.clock.now_ms(),
                                    f"{WIRE_FETCHER_PREFIX}{request.client_id or ''}", leader, slots)
        self.fetch_kinds[opened.kind] += 1
        if opened.kind == "error":
            return fetch_response(request.api_version, [], {}, {}, error=opened.error)
        deadline = time.monotonic() + max(int(body.max_wait.total_seconds() * 1000), 0) / 1000
        budget = int(getattr(body, "max_bytes", 2**31 - 1))
        while True:
            with self.lock:
                version = self.watch.version()
                partitions, errors, records = self._fetch_once(opened.fetch, budget)
            if records or errors or time.monotonic() >= deadline:
                break
            if self.watch.wait_past(version, deadline) is None:
                break
        answered = answers(opened.fetch, partitions, errors, records)
        carried, error = self.sessions.close(opened, answered)
        if error is not None:
            return fetch_response(request.api_version, [], {}, {}, error=error)
        return fetch_response(request.api_version, carried, answered, records, opened.session_id)

    def _leader_of(self, wanted: list) -> int:
        """The broker a consumer's full fetch is for: the leader of most of its partitions (the
        door answers for every broker; a consumer sends each leader its partitions)."""
        rows = self._partition_rows({w.topic for w in wanted})
        leaders = Counter(rows[w.key]["leader"] for w in wanted if w.key in rows and rows[w.key]["leader"] is not None)
        return min(leaders, key=lambda b: (-leaders[b], b)) if leaders else -1

    def _slots_for(self, leader: int) -> int:
        """The slots `leader`'s session cache has for the door's sessions: the cache's slots less
        the sessions the newest round's followers and the API's consumers hold there (read again
        only when the rounds or client_sessions table has a new version)."""
        storage = self.cluster.core.storage
        storage.ensure("client_sessions")
        key = (storage.version("rounds"), storage.version("client_sessions"))
        if self._held is None or self._held[0] != key:
            newest = newest_report(storage)  # (the rounds may run in another process: the job)
            followers, _ = session_rules.sessions_from_json(newest.fetch_sessions if newest else None)
            held = self.cluster.core.metadata.client_sessions().cache(followers)
            self._held = (key, Counter(s.leader for s in held))
        return self.cluster.core.config["max.incremental.fetch.session.cache.slots"] - self._held[1][leader]

    def fetch_sessions(self) -> list:
        """The door's fetch sessions: (session_cache.Session, its partitions as fetch_sessions.Wanted)."""
        return self.sessions.snapshot()

    def _fetch_once(self, wanted: tuple, budget: int) -> tuple[dict, dict, dict]:
        """The partitions' rows, the errors, and the record batches of the partitions read, in the
        order of `wanted`: each up to its partition_max_bytes and what is left of the request's
        max_bytes, except that the first partition with records gets at least one (KIP-74)."""
        partitions = self._partition_rows({w.topic for w in wanted})
        ranges, errors = fetch_ranges(wanted, partitions)
        read: dict = {}
        for topic in sorted({t for t, _ in ranges}):
            asked = [(p, lo, hi, max_bytes) for (t, p), (lo, hi, max_bytes) in ranges.items() if t == topic]
            spark = self.cluster.spark
            wanted_df = spark.createDataFrame(asked, "partition int, lo long, hi long, max_bytes int")
            size = (F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))
                    + F.lit(RECORD_OVERHEAD))
            before = F.sum(size).over(_by_offset()) - size
            rows = (self.cluster.read(topic).join(F.broadcast(wanted_df), "partition")
                    .filter((F.col("offset") >= F.col("lo")) & (F.col("offset") < F.col("hi")))
                    .withColumn("_before", before).filter((F.col("_before") < F.col("max_bytes"))
                                                          | (F.col("offset") == F.col("lo")))
                    .select("partition", "offset", "leader_epoch", "timestamp", "key", "value")
                    .orderBy("partition", "offset").collect())
            for r in rows:
                read.setdefault((topic, r["partition"]), []).append(r)
        records: dict = {}
        for w in wanted:
            recs = read.get(w.key)
            if not recs:
                continue
            limit, used = min(w.max_bytes, budget), 0
            taken = []
            for r in recs:
                size = len(r["key"] or b"") + len(r["value"] or b"") + RECORD_OVERHEAD
                if used + size > limit and (taken or records):
                    break
                taken.append(r)
                used += size
            if taken:
                records[w.key] = write_fetched((r["offset"], r["leader_epoch"], r["timestamp"], r["key"], r["value"])
                                               for r in taken)
                budget -= used
        return partitions, errors, records

    # -- topics ------------------------------------------------------------------------------
    def create_topics(self, request: Request) -> Any:
        asked = topics_asked(request.body)
        validate_only = bool(getattr(request.body, "validate_only", False))
        outcomes: dict = {}
        for topic in asked:
            if topic.error is not None or topic.name in outcomes:
                continue
            try:
                self.cluster.create_topic(topic.name, topic.partitions, topic.replication_factor, topic.config or None,
                                          validate_only=validate_only)
                outcomes[topic.name] = None
            except ReplogError as err:
                outcomes[topic.name] = (err.code, err.detail)
        return create_topics_response(request.api_version, asked, outcomes)

    def metadata(self, request: Request) -> Any:
        requested = requested_topics(request.api_version, request.body)
        rows = list(self._partition_rows(requested).values())
        return metadata_response(request.api_version, requested, rows, self._live(),
                                 self.cluster.storage.cluster_id, self.host, self.port)


    def _live(self) -> list[int]:
        """The brokers not fenced."""
        return [r["broker"] for r in self.cluster.broker_states().filter("state <> 'fenced'").select("broker").collect()]

    def offset_commit(self, request: Request) -> Any:
        """The partitions that exist are committed (one commit per metadata value); the others
        are answered with their errors."""
        body = request.body
        known = set(self._partition_rows({t.name for t in body.topics}))
        commits, errors = offset_commit_plan(body, known)
        for metadata, offsets in commits.items():
            self.cluster.commit_offsets(body.group_id, offsets, metadata)
        return offset_commit_response(request.api_version, body, errors)

    def offset_fetch(self, request: Request) -> Any:
        committed = {(r["topic"], r["partition"]): (r["committed_offset"], r["metadata"])
                     for r in self.cluster.committed_offsets(request.body.group_id).collect()}
        return offset_fetch_response(request.api_version, request.body, committed)

    def list_offsets(self, request: Request) -> Any:
        """The partitions' offsets from describe(), and for the timestamps asked the first record at
        or after each in the leader's log below the HW (one read per topic asked, off the round)."""
        body = request.body
        partitions = self._partition_rows({t.name for t in body.topics})
        asked = [a for a in timestamps_asked(body) if a[:2] in partitions]
        earliest = {(t.name, p.partition_index) for t in body.topics for p in t.partitions if p.timestamp == EARLIEST}
        found, first_epochs = {}, {}
        for topic in sorted({t for t, _ in partitions}):
            try:
                log = self.cluster.read(topic)
            except ReplogError:  # (a partition it cannot read is answered by its error)
                continue
            if any(k[0] == topic for k in earliest):
                first_epochs.update({(topic, r["partition"]): r["epoch"] for r in log.groupBy("partition").agg(
                    F.min_by("leader_epoch", "offset").alias("epoch")).collect()})
            wanted = [(p, ts) for t, p, ts in asked if t == topic]
            if wanted:
                spark = self.cluster.spark
                times = spark.createDataFrame(wanted, "partition int, asked long")
                first = (log.join(times, "partition").filter(F.col("timestamp") >= F.col("asked"))
                         .groupBy("partition", "asked")
                         .agg(F.min_by(F.struct("offset", "timestamp", "leader_epoch"), "offset").alias("r")))
                found.update({(topic, r["partition"], r["asked"]): tuple(r["r"]) for r in first.collect()})
        return list_offsets_response(request.api_version, body, partitions, found, first_epochs)


def _by_offset() -> Any:
    from pyspark.sql import Window
    return Window.partitionBy("partition").orderBy("offset").rowsBetween(Window.unboundedPreceding, 0)


def serve(cluster: Any, host: str = "127.0.0.1", port: int = 9092, max_request_bytes: int = MAX_REQUEST_BYTES,
          run_rounds: bool = False, round_interval_ms: int = 1000) -> WireServer:
    """Starts the front door for `cluster` on host:port (0: a free port); `.shutdown()` stops it.
    `run_rounds`: the door runs the rounds (one every `round_interval_ms`, and at once for a
    produce request); otherwise a replication job on the root runs them."""
    door = FrontDoor(cluster, host, port, run_rounds, round_interval_ms)
    server = serve_kafka(door, host, port, SERVED_APIS, max_request_bytes, on_shutdown=door.close)
    door.port = server.port  # (port 0: the one the system gave)
    return server
