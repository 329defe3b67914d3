"""The public API: a cluster of Delta-backed brokers, its topics, producers, rounds and reads."""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import re
import uuid
from dataclasses import replace
from typing import Any, Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline import cleaner, consumer
from pipeline import controller
from pipeline import fetch_session as sessions
from pipeline import groups
from pipeline import maintenance
from pipeline import quotas
from pipeline import recovery
from pipeline import views
from pipeline.assignment import assign_replicas
from pipeline.broker_dirs import check_locations, given_locations, log_problem, split_dirs_config, write_problem
from pipeline.clock import Clock, SystemClock
from pipeline.config import (CLUSTER_KEYS, LONG_MAX, TOPIC_KEYS, to_json, validate_cluster_config, validate_topic_config,
                             with_defaults)
from pipeline.errors import ErrorCode, LogDirFailure, ReplogError
from pipeline.produce import check_client, is_bulk, parse_acks, record_rows, records_frame
from pipeline.replication import record_size
from pipeline.round import Carry, RoundInputs, RoundReport, idle_round, run_round
from pipeline.round.reads import fetch_pair_counts
from pipeline.schemas import (ADMIN_SCHEMA, BROKERS_SCHEMA, CLIENT_QUOTAS_SCHEMA, CLUSTER_SCHEMA, GROUP_OFFSETS_SCHEMA, INBOX_SCHEMA,
                              LEASE_SCHEMA, PARTITIONS_SCHEMA, REPLICA_STATE_SCHEMA, TOPICS_SCHEMA)
from pipeline.spark import compiled_expressions
from pipeline.storage import Storage, is_concurrent_conflict

__all__ = ["Cluster"]

# KIP-73 measures replication rates over replication.quota.window.num (11) windows of
# replication.quota.window.size.seconds (1): a throttled broker's unused budget accrues for at most
# that long
THROTTLE_BURST_SECONDS = 11

_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_ISOLATION = ("read_committed", "read_uncommitted")

_log = logging.getLogger(__name__)


def _state(broker_row: Any) -> str:
    """A broker's state from its row in the brokers table (a row from before states: running)."""
    return broker_row["state"] or controller.RUNNING


def _nothing_waiting(report: RoundReport) -> bool:
    """After this round: no acks pending, no request held by a client quota, every partition settled."""
    return report.pending_requests == 0 and report.active_partitions == 0 and not report.throttled_requests


def _validate_topic_name(name: Any) -> None:
    if not isinstance(name, str) or not _TOPIC_NAME.match(name) or name in (".", ".."):
        raise ReplogError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                          f"topic name {name!r} is invalid: use 1 to 249 of [a-zA-Z0-9._-], not '.' or '..'")


_UNREAD = object()  # Cluster._last before the rounds table is read
# the tables every cluster has had since the first release (open() checks they are there)
_REQUIRED_TABLES = ("brokers", "topics", "partitions", "replica_state", "inbox", "results", "rounds")


class Cluster:
    """A replicated log whose brokers are Delta tables under `root`.

    >>> cluster = Cluster.create(spark, "/tmp/replog", brokers=3, clock=ManualClock(0))
    >>> cluster.create_topic("orders", partitions=8, replication_factor=3)
    >>> request_id = cluster.produce("orders", [{"key": "k", "value": "v"}], acks="all")
    >>> cluster.run_round(); cluster.run_round()
    >>> cluster.read("orders").show()
    """

    def __init__(self, spark: SparkSession, storage: Storage, clock: Clock, config: dict[str, Any],
                 brokers: list[int], views_wanted: bool = True):
        self.spark = spark
        self.storage = storage
        self.clock = clock
        self.config = config
        self.brokers = brokers
        self._last: RoundReport | None | object = _UNREAD  # the newest round's report (_last_report)
        self._seen: tuple | None = None  # table versions and broker states at the last round
        self._rng = random.Random()  # fetch session ids
        self._brokers_seen: tuple | None = None  # (brokers table version, its rows)
        self._topics_seen: tuple | None = None  # (topics table version, its rows by topic)
        self._pairs: tuple[int, tuple] | None = None  # (partitions version, (fetch pairs, reassigning))
        self._clients: tuple[int, consumer.ClientSessions] | None = None  # (version, consumers' sessions)
        self._consumer_requests: dict[str, list[sessions.Context]] = {}
        self._fetch_throttles: dict[str, int] = {}  # consumer id -> its last fetch's throttle time
        self._last_clean_ms: int | None = None  # the log cleaner's last pass (compact_if_due)
        self._last_maintenance_ms: int | None = None  # the last maintain() pass (maintain_if_due)
        self._carry: Carry | None = None  # the last round's state, pinned (round.Carry)
        self._restarted = False  # set by open(): the next round is this process's first
        self._config_version = storage.version("cluster")  # alter_configs(brokers) changes it
        # KIP-73: ("leader" | "follower", broker) -> bytes of throttled replication left over
        self._throttle_tokens: dict[tuple[str, int], float] = {}
        # client quotas (pipeline/quotas.py): the configured entities by the client_quotas table's
        # version, and the rates measured in this process (produce: by its rounds; fetch: by its
        # consumers' reads), as a Kafka broker keeps its quota metrics in memory
        self._quotas_seen: tuple[int, dict] | None = None
        window = (config["quota.window.num"], config["quota.window.size.seconds"] * 1000)
        self._sensors = {key: quotas.Sensors(*window) for key in quotas.QUOTA_KEYS}
        # the one-writer lease: who this object is, and its (job epoch, lease table version) once held
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._lease: tuple[int, int] | None = None
        storage.before_commit = self._hold_lease  # every commit of a round checks the lease first
        # recovery (recovery.py): checked by this object's first round and after a failed round;
        # the inputs of an interrupted round to replay, once found
        self._recovery_checked = False
        self._replay: recovery.Replay | None = None
        self._views = views_wanted
        if views_wanted:
            views.register_views(spark, storage, brokers, config["min.insync.replicas"])

    # -- factories ---------------------------------------------------------------------------
    @classmethod
    def create(cls, spark: SparkSession, root: str, brokers: int = 3, config: Mapping[str, Any] | None = None,
               clock: Clock | None = None, broker_dirs: Mapping[int, str] | None = None) -> "Cluster":
        """A new cluster at `root` with `brokers` empty brokers (ids 0..brokers-1).

        `broker_dirs`: a storage location per broker (Kafka's log.dirs; also `broker.<id>.log.dirs`
        in `config`), a path or a URI Spark can write, each in a failure domain of its own; a broker
        not named keeps `<root>/brokers/<id>`. The cluster's metadata stays under `root`.

        >>> Cluster.create(spark, "/data/replog", brokers=3,
        ...                broker_dirs={0: "/mnt/disk0/replog", 1: "/mnt/disk1/replog", 2: "s3a://b/replog-2"})
        """
        if isinstance(brokers, bool) or not isinstance(brokers, int) or brokers < 1:
            raise ValueError(f"brokers must be an int >= 1, got {brokers!r}")
        configured, config = split_dirs_config(config)
        full = validate_cluster_config(config)
        storage = Storage(spark, root)
        if storage.exists():
            raise ReplogError(ErrorCode.CLUSTER_ALREADY_EXISTS, f"{storage.root} already holds a cluster")
        ids = list(range(brokers))
        given = given_locations(brokers, configured, broker_dirs)
        storage.broker_dirs = check_locations(storage, given, {b: storage.default_broker_root(b) for b in ids
                                                               if b not in given})
        storage.cluster_id = str(uuid.uuid4())
        clock = clock or SystemClock()
        storage.create_tables(ids)
        now = clock.now_ms()
        storage.append_table(spark.createDataFrame(
            [(b, storage.stored_location(b), False, None, now, controller.RUNNING, now, False, False, None) for b in ids],
            BROKERS_SCHEMA), "brokers")
        storage.create_cluster_table()
        storage.append_table(spark.createDataFrame(
            [(storage.cluster_id, brokers, to_json(full), now)], CLUSTER_SCHEMA), "cluster")
        return cls(spark, storage, clock, full, ids)

    @classmethod
    def open(cls, spark: SparkSession, root: str, clock: Clock | None = None, views: bool = True) -> "Cluster":
        """The cluster at `root`; CLUSTER_NOT_FOUND when there is none. `views`: register the
        replog.* views in the session for this root (the command line, which never reads them,
        skips it: about 3 s of a command's start)."""
        storage = Storage(spark, root)
        if not storage.exists():
            raise ReplogError(ErrorCode.CLUSTER_NOT_FOUND, f"{storage.root} holds no cluster (use Cluster.create)")
        row = storage.read("cluster").first()
        if row is None:
            raise ReplogError(ErrorCode.CLUSTER_NOT_FOUND, f"{storage.root} holds no complete cluster")
        for table in _REQUIRED_TABLES:
            if not storage.path_exists(f"{storage.path(table)}/_delta_log"):
                raise ReplogError(ErrorCode.KAFKA_STORAGE_ERROR,
                                  f"the cluster at {storage.root} has lost its '{table}' table ({storage.path(table)} "
                                  "is not a Delta table): restore it from a backup or Delta's history")
        storage.cluster_id = row["cluster_id"]
        located = storage.read("brokers").select("broker", "path").collect()
        brokers = sorted(r["broker"] for r in located)
        if storage.layout() >= 3:  # (an older root's brokers all have the default location, written absolute)
            storage.set_broker_dirs((r["broker"], r["path"]) for r in located)
        storage.upgrade(brokers)  # a root made by an older release: the tables, columns and properties it lacks
        cluster = cls(spark, storage, clock or SystemClock(), with_defaults(json.loads(row["config"])), brokers,
                      views_wanted=views)
        # no round runs while no process has the cluster open: this process's first round (re)starts
        # the brokers, and the leaders reset their followers' fetch state
        # (replication.reset_follower_state_on_restart), so the time it was down counts against none
        cluster._restarted = True
        return cluster

    # -- topics ------------------------------------------------------------------------------
    def _topic(self, topic: str):
        """The topic's row (None: no such topic), from the topics table (O(topics) rows), re-read only
        when its version changed: produce() asks on every call."""
        version = self.storage.version("topics")
        if self._topics_seen is None or self._topics_seen[0] != version:
            self._topics_seen = (version, {r["topic"]: r for r in self.storage.read("topics").collect()})
        return self._topics_seen[1].get(topic)

    def create_topic(self, topic: str, partitions: int = 1, replication_factor: int = 1,
                     config: Mapping[str, Any] | None = None) -> None:
        """A topic with Kafka's replica assignment; its leaders are the first replicas."""
        _validate_topic_name(topic)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ReplogError(ErrorCode.INVALID_PARTITIONS, f"partitions must be an int >= 1, got {partitions!r}")
        rf = replication_factor
        if isinstance(rf, bool) or not isinstance(rf, int) or not 1 <= rf <= len(self.brokers):
            raise ReplogError(ErrorCode.INVALID_REPLICATION_FACTOR,
                              f"replication factor must be between 1 and the broker count {len(self.brokers)}, got {rf!r}")
        overrides = validate_topic_config(config, rf)
        if self._topic(topic) is not None:
            raise ReplogError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic '{topic}' already exists")
        placeable = self._placeable_brokers()
        if rf > len(placeable):
            raise ReplogError(ErrorCode.INVALID_REPLICATION_FACTOR,
                              f"replication factor {rf} is more than the {len(placeable)} brokers that take new "
                              f"replicas ({len(self.brokers) - len(placeable)} being decommissioned)")
        now = self._admin_now_ms()
        start = len(self._topics_seen[1]) % len(placeable)  # (the topics _topic just read)
        assignment = assign_replicas(placeable, partitions, rf, start_index=start)
        self.storage.append_all([
            (self.spark.createDataFrame([(topic, p, r[0], 0, 0, r, r, 0, self._round_id, [], [])
                                         for p, r in enumerate(assignment)], PARTITIONS_SCHEMA),
             self.storage.path("partitions")),
            (self.spark.createDataFrame([(topic, p, b, 0, 0, 0, 0, now, 0, now, 0, 0, 0, -1, -1, 0, self._round_id)
                                         for p, r in enumerate(assignment) for b in r], REPLICA_STATE_SCHEMA),
             self.storage.path("replica_state"))], None)
        # the topic row last: a topic is visible to producers only once all its partitions are
        self.storage.append_table(self.spark.createDataFrame(
            [(topic, partitions, rf, to_json(overrides), now)], TOPICS_SCHEMA), "topics")

    def topics(self) -> DataFrame:
        return self.storage.read("topics")

    # -- produce -----------------------------------------------------------------------------
    def produce(self, topic: str, records: Any, acks: Any = 1, client_id: str | None = None,
                user: str | None = None) -> str:
        """Appends a produce request to the inbox and returns its request id; the next round
        appends it on the leaders. `records`: dicts with value (str|bytes|None), optional key and
        partition, or a DataFrame with those columns. `client_id` and `user` (Kafka's client.id and
        authenticated user) select the client quota the request counts against (alter_client_quotas):
        over its producer_byte_rate, the request waits in the inbox for a later round."""
        acks_value = parse_acks(acks)
        client = check_client(client_id, user)
        if not isinstance(topic, str):
            raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic must be a str, got {topic!r}")
        meta = self._topic(topic)
        partitions = meta["partitions"] if meta is not None else None
        request_id = str(uuid.uuid4())
        now = self.clock.now_ms()
        if isinstance(records, DataFrame):  # a bulk load is written with compiled expressions
            df = records_frame(records, topic, partitions, request_id, acks_value, now, client)
            with compiled_expressions(self.spark, when=is_bulk(df)):
                self.storage.append_table(df, "inbox")
            return request_id
        if isinstance(records, (str, bytes, dict)) or not hasattr(records, "__iter__"):
            raise ReplogError(ErrorCode.INVALID_RECORD, "records must be a list of dicts or a DataFrame")
        df = self.spark.createDataFrame(record_rows(records, topic, partitions, request_id, acks_value, now,
                                                    client), INBOX_SCHEMA)
        self.storage.append_table(df, "inbox")
        return request_id

    def produce_results(self) -> DataFrame:
        """request_id, topic, partition, base_offset, last_offset, acks, status, error_code."""
        return self.spark.sql(views.results_sql(self.storage))

    # -- rounds ------------------------------------------------------------------------------
    def _broker_rows(self) -> list:
        """The brokers table (O(brokers) rows), re-read only when it changed; a broker another
        process added (add_broker) joins `brokers` here."""
        version = self.storage.version("brokers")
        if self._brokers_seen is None or self._brokers_seen[0] != version:
            self._brokers_seen = (version, self.storage.read("brokers").collect())
            self.storage.set_broker_dirs((r["broker"], r["path"]) for r in self._brokers_seen[1])
            registered = sorted(r["broker"] for r in self._brokers_seen[1])
            if registered != self.brokers:
                self.brokers = registered
                views.register_views(self.spark, self.storage, registered, self.config["min.insync.replicas"])
        return self._brokers_seen[1]

    def _placeable_brokers(self) -> list[int]:
        """Brokers new replicas may go to: every registered one not being decommissioned."""
        return [r["broker"] for r in sorted(self._broker_rows(), key=lambda r: r["broker"]) if not r["decommissioned"]]

    def _broker_states(self) -> tuple[dict[int, int | None], dict[int, int]]:
        """(brokers that do not fetch -> their last fetch, throttles): a paused fetcher, and a
        broker that is down (stopped or fenced), which last fetched at its last heartbeat."""
        rows = self._broker_rows()
        paused = {r["broker"]: r["changed_ms"] for r in rows if r["fetcher_paused"]}
        paused.update({r["broker"]: r["last_heartbeat_ms"] for r in rows
                       if _state(r) in (controller.STOPPED, controller.FENCED)})
        throttles = {r["broker"]: r["fetch_max_bytes_per_round"] for r in rows
                     if r["fetch_max_bytes_per_round"] is not None}
        return paused, throttles

    def _controller_inputs(self, now: int) -> dict[str, Any]:
        """What the round's controller step does (O(brokers) decisions on the driver): the brokers
        to fence now (a stopped broker whose session expired: expired_broker_sessions, and a
        restarted one, whose old session ends as it registers again), the live brokers before and
        after the restarted ones are unfenced, and the brokers that lost their log."""
        rows = self._broker_rows()
        state = {r["broker"]: _state(r) for r in rows}
        expiring = [r for r in rows if state[r["broker"]] == controller.STOPPED]
        expired = []
        if expiring:
            df = self.spark.createDataFrame([(r["broker"], r["state"], r["last_heartbeat_ms"]) for r in expiring],
                                            "broker int, state string, last_heartbeat_ms long")
            expired = sorted(r["broker"] for r in controller.expired_broker_sessions(
                df, now, self.config["broker.session.timeout.ms"]).collect())
        starting = sorted(b for b, s in state.items() if s == controller.STARTING)
        fenced = {b for b, s in state.items() if s == controller.FENCED} | set(expired)
        return {
            "fence": expired, "unfence": starting,
            "live_before_start": [b for b in self.brokers if b not in fenced and b not in starting],
            "live": [b for b in self.brokers if b not in fenced],
            "lost_log": sorted(r["broker"] for r in rows if state[r["broker"]] == controller.STARTING and r["log_lost"]),
            "down": sorted(b for b, s in state.items() if s in (controller.STOPPED, controller.FENCED)),
        }

    def _after_controller(self, decisions: dict[str, Any]) -> None:
        """The brokers' new states once the round that fenced or unfenced them has committed."""
        rows = {r["broker"]: r.asDict() for r in self._broker_rows()}
        # compare-and-set: a broker stopped or started by another process meanwhile keeps that state
        for brokers, before, after in ((decisions["fence"], controller.STOPPED, {"state": controller.FENCED}),
                                       (decisions["unfence"], controller.STARTING,
                                        {"state": controller.RUNNING, "log_lost": False})):
            if brokers:
                self.storage.update_if(self.spark.createDataFrame(
                    [tuple({**rows[b], **after}[f] for f in BROKERS_SCHEMA.fieldNames()) for b in brokers],
                    BROKERS_SCHEMA), "brokers", ["broker"], only_if=f"t.state = '{before}'")

    @property
    def _last_report(self) -> RoundReport | None:
        """The newest round's report, read from the rounds table when first asked for (a command
        that runs no round and needs no round id never reads it)."""
        if self._last is _UNREAD:
            last = self.storage.read("rounds").orderBy(F.col("round_id").desc()).limit(2).collect()
            # (a row whose round's last wave did not land whole is not a complete round's: recovery.py)
            if last and recovery.last_complete_round(self.storage, last[0]["round_id"])[0] < last[0]["round_id"]:
                last = last[1:]
            self._last = RoundReport(**last[0].asDict()) if last else None
        return self._last  # type: ignore[return-value]

    @_last_report.setter
    def _last_report(self, report: RoundReport | None) -> None:
        self._last = report

    @property
    def _round_id(self) -> int:
        return self._last_report.round_id if self._last_report else 0

    def _admin_now_ms(self) -> int:
        """The time an admin call stamps on what the rounds measure time from (a new replica's
        last fetch, a restarted broker's registration, a resumed fetcher): the clock, but never
        before the newest round's time. A clock that stepped back runs the rounds at the last
        round's time, and a stamp before it would date a change before rounds that preceded it."""
        now = self.clock.now_ms()
        return max(now, self._last_report.now_ms) if self._last_report else now

    def last_batch_id(self) -> int | None:
        """The newest streaming micro-batch that ran a round here (None: none did): a replayed
        micro-batch at or below it has already run its round."""
        return self.storage.read("rounds").agg(F.max("batch_id")).first()[0]

    def _fetch_pairs(self, partitions_version: int) -> dict[tuple[int, int], int]:
        """(follower, leader) -> partitions the follower fetches from that leader: the fetch
        requests of a round (O(brokers^2) values, recounted only when the metadata changes)."""
        return self._metadata_summary(partitions_version)[0]

    def _reassigning(self, partitions_version: int) -> bool:
        """Whether a partition has a reassignment in progress (KIP-455)."""
        return self._metadata_summary(partitions_version)[1]

    def _metadata_summary(self, partitions_version: int) -> tuple[dict[tuple[int, int], int], bool]:
        """(fetch pairs, reassigning), from one aggregation of the partitions table, re-run only
        when its version changed."""
        if self._pairs is None or self._pairs[0] != partitions_version:
            partitions = self.storage.read("partitions")
            rows = (fetch_pair_counts(partitions)
                    .unionByName(partitions.filter(controller.reassignment_in_progress(
                        F.col("adding_replicas"), F.col("removing_replicas")))
                        .select(F.lit(-1).alias("follower"), F.lit(-1).alias("leader"), F.lit(1).cast("long").alias("count"))
                        .limit(1))
                    .collect())
            self._pairs = (partitions_version, ({(r["follower"], r["leader"]): r["count"] for r in rows
                                                 if r["follower"] != -1},
                                                any(r["follower"] == -1 for r in rows)))
        return self._pairs[1]

    def _client_sessions(self) -> consumer.ClientSessions:
        """Consumers' sessions (client_sessions table), re-read only when the table changed."""
        self.storage.ensure("client_sessions")
        version = self.storage.version("client_sessions")
        if self._clients is None or self._clients[0] != version:
            self._clients = (version, consumer.load_client_sessions(self.storage))
        return self._clients[1]

    def _round_sessions(self) -> tuple[list[sessions.Session], list[sessions.Handle]]:
        """The sessions and handles after the newest round (its consumers' sessions are stale
        copies: consumer.ClientSessions.cache keeps only the followers' from them)."""
        return sessions.sessions_from_json(self._last_report.fetch_sessions if self._last_report else None)

    def _session_inputs(self, paused: dict[int, int | None], down: set[int], fetch_pairs: dict[tuple[int, int], int],
                        now: int) -> dict[str, Any]:
        """The round's fetch requests as their leaders take them (KIP-227), for the (follower,
        leader) -> partitions pairs. A round whose controller elects new leaders plans them again
        with the pairs after its elections (RoundInputs.plan_sessions): the second plan starts from
        the same sessions, so only its outcome counts, except that consumers' sessions the first
        evicted stay evicted."""
        last, handles = self._round_sessions()
        clients = self._client_sessions()
        before = clients.cache(last)
        # a broker that is down neither fetches nor answers fetches
        pairs = {k: v for k, v in fetch_pairs.items() if k[1] not in down}
        contexts, after, handles, evictions = sessions.round_contexts(
            before, handles, pairs, set(paused), now,
            self.config["max.incremental.fetch.session.cache.slots"], self._rng,
            sessionless=self.config["replication.fetch.mode"] == "full")
        survivors = consumer.client_cache_after_round(clients, after)
        if survivors is not None:  # followers' sessions evicted consumers' (privileged first)
            consumer.save_client_sessions(self.storage, survivors)
        return {"contexts": contexts, "sessions_after": after, "handles_after": handles,
                "session_evictions": evictions}

    def _throttle_budgets(self, now: int, previous_ms: int | None) -> dict[tuple[str, int], int]:
        """Each throttled broker's bytes for this round (KIP-73, `leader.replication.throttled.rate`
        and `follower.replication.throttled.rate`, bytes/s by the cluster clock): what it left
        unused plus the rate times the time since the last round, at most THROTTLE_BURST_SECONDS'
        worth. Brokers without a rate are absent (unlimited)."""
        elapsed = max(now - previous_ms, 0) if previous_ms is not None else 0
        budgets = {}
        for side in ("leader", "follower"):
            rate = self.config[f"{side}.replication.throttled.rate"]
            if rate >= LONG_MAX:
                continue
            for broker in self.brokers:
                tokens = self._throttle_tokens.get((side, broker), 0.0) + rate * elapsed / 1000
                budgets[(side, broker)] = min(tokens, float(rate * THROTTLE_BURST_SECONDS))
        return {k: int(v) for k, v in budgets.items()}

    def _quota_entries(self) -> dict[tuple[str | None, str | None], dict[str, int]]:
        """The client_quotas table as (user entity, client-id entity) -> quotas set, re-read only
        when its version moved (O(entities))."""
        version = self.storage.version("client_quotas")
        if self._quotas_seen is None or self._quotas_seen[0] != version:
            entries = {} if self.storage.unwritten("client_quotas", version) else {
                (r["user"], r["client_id"]): {k: r[k] for k in quotas.QUOTA_KEYS if r[k] is not None}
                for r in self.storage.read("client_quotas").collect()}
            self._quotas_seen = (version, entries)
        return self._quotas_seen[1]

    def _quota_sensors(self, key: str, now: int):
        """For a round: (user, client_id) pairs -> their `key` quota's sensor rows (see
        round._SENSOR_SCHEMA); None when no client has that quota."""
        entries = self._quota_entries()
        if not any(key in v for v in entries.values()):
            return None
        sensors = self._sensors[key]
        sensors.reconfigure(self.config["quota.window.num"], self.config["quota.window.size.seconds"] * 1000)

        def rows(pairs: list[tuple]) -> list[tuple]:
            out = []
            for user, client_id in pairs:
                found = quotas.quota_for(entries, key, user, client_id)
                if found is None:
                    out.append((user, client_id, None, None, None, 0, 1, False))
                    continue
                sensor, quota = found
                out.append((user, client_id, *sensor, quota, *sensors.state(sensor, now)))
            return out
        return rows

    def _record_quota(self, key: str, recorded: Mapping[tuple[str, str], tuple[int, int]], now: int) -> None:
        """Records the bytes a round (or a consumer's fetch) served per sensor, (bytes, quota); over
        its quota, the sensor's clients wait the throttle time."""
        for sensor, (value, quota) in recorded.items():
            self._sensors[key].record(sensor, quota, value, now)

    def caught_up(self, report: RoundReport) -> bool:
        """Whether the cluster is done after the round of `report`: every produce request in the
        inbox read (a round that replays an interrupted one reads only as far as that round did),
        none pending or held by a client quota, every partition settled."""
        return _nothing_waiting(report) and self.storage.version("inbox") <= report.inbox_version

    def run_round(self, batch_id: int | None = None) -> RoundReport:
        """One fetch round; the streaming job's foreachBatch runs the same code. A round with
        nothing to do (no new produce request, every partition settled, no pending ack, no
        metadata or broker change since the last round, every fetch an incremental one of a
        session) only writes its metrics row, with the sessions' new epochs. With
        `replication.fetch.mode=full` every round fetches every partition.

        A running broker whose storage location has failed (its log gone, unreadable, another
        cluster's, or refusing a write: broker_dirs.py) halts, as a Kafka broker whose only log dir
        fails does: the round runs without it (again, when it met the failure mid-round, after
        undoing what it had committed), and the controller fences it and moves its leaderships
        after broker.session.timeout.ms. start_broker restarts it."""
        self._hold_lease()
        while True:
            try:
                self._halt_failed_brokers()
                if not self._recovery_checked:
                    self._recover()
                self._reload_config()
                return self._run_round(batch_id)
            except BaseException as err:
                # the round may have committed part of its writes: the next round undoes them first (or,
                # if its last wave landed whole, it is complete: the rounds table is read again)
                self._recovery_checked, self._carry, self._seen, self._last = False, None, None, _UNREAD
                failed = {err.broker: err.problem} if isinstance(err, LogDirFailure) and err.broker is not None else {}
                if not isinstance(err, Exception) or not self._halt_failed_brokers(failed):
                    raise

    def _recover(self) -> None:
        """Undoes what an interrupted round committed, and takes its inputs for the replay
        (recovery.py). A halted broker's log is left as it is: when it holds a commit of such a
        round, that broker restarts empty."""
        failed = [r["broker"] for r in self._broker_rows() if r["log_dir_failure"] is not None]
        stale = recovery.stale_logs(self.storage, failed, self._round_id)
        for broker in stale:
            self._set_broker(broker, log_lost=True)
        replay = recovery.recover(self.storage, [b for b in self.brokers if b not in failed], self._round_id)
        self._recovery_checked = True
        if replay is not None:  # (the rounds table is read again: the replayed round's row may have been undone)
            self._replay, self._carry, self._seen, self._last = replay, None, None, _UNREAD

    def _run_round(self, batch_id: int | None) -> RoundReport:
        paused, throttles = self._broker_states()
        last = self._last_report
        replay = self._replay
        now = replay.now_ms if replay is not None and replay.now_ms is not None else self.clock.now_ms()
        if replay is None and last is not None and now < last.now_ms:
            # the clock stepped back: the round runs at the last round's time, so no rule sees time go
            # back (a lag, a session or a quota measured backwards) and no HW can move back by it
            _log.warning("the clock reads %d ms, %d ms before the last round's time: the round runs at %d ms",
                         now, last.now_ms - now, last.now_ms)
            now = last.now_ms
        restarted = replay.restarted if replay is not None else self._restarted
        decisions = self._controller_inputs(now)
        partitions_version = self.storage.version("partitions")
        down = set(decisions["down"])
        session_inputs = self._session_inputs(paused, down, self._fetch_pairs(partitions_version), now)
        checked = last.retention_checked_ms if last else None
        retention_due = checked is None or now - checked >= self.config["log.retention.check.interval.ms"]
        inputs = RoundInputs(
            round_id=self._round_id + 1, now_ms=now,
            last_inbox_version=last.inbox_version if last else 0,
            cluster_config=self.config, brokers=self.brokers, paused_brokers=paused, throttles=throttles,
            previous_round_ms=last.now_ms if last else None,
            last_admin_version=last.admin_version if last else 0,
            retention_due=retention_due, last_retention_check_ms=checked or 0,
            last_pending_requests=last.pending_requests if last else None, batch_id=batch_id,
            last_records_replicated=last.records_replicated if last else 0,
            reassigning=self._reassigning(partitions_version),
            throttle_budgets=self._throttle_budgets(now, last.now_ms if last else None),
            quota_sensors=self._quota_sensors("producer_byte_rate", now),
            last_throttled_requests=last.throttled_requests if last else None,
            restarted=restarted, controller=decisions, **session_inputs,
            plan_sessions=lambda pairs: self._session_inputs(paused, down, pairs, now),
            inbox_to_version=replay.inbox_version if replay is not None else None,
            admin_to_version=replay.admin_version if replay is not None else None)
        now_at = (self.storage.version("inbox"), partitions_version, self.storage.version("admin"),
                  paused, throttles)
        quiet = (last is not None and _nothing_waiting(last)
                 and not retention_due and not decisions["fence"] and not decisions["unfence"]
                 and all(c.kind == "incremental" for c in session_inputs["contexts"]))
        if quiet and now_at == self._seen and replay is None:
            report = idle_round(self.spark, self.storage, inputs, last)
        else:
            report, self._carry = self._round(inputs)
            self._after_controller(decisions)
        # a replay runs at its recorded time: the time this process was down after it must still not
        # count against the followers, so a restarted process's next round resets them (again)
        self._restarted = self._restarted and replay is not None
        # what the round has read: the inbox and admin requests up to the versions it fixed (a replay
        # only as far as the interrupted round did, and a request that came after the check above is
        # not read), so the next round is idle only if nothing came after those versions
        self._last_report, self._replay = report, None
        self._seen = (report.inbox_version, partitions_version, report.admin_version, paused, throttles)
        self._throttle_tokens = {k: float(v - report.throttled_bytes.get(k, 0))
                                 for k, v in inputs.throttle_budgets.items()}
        self._record_quota("producer_byte_rate", report.client_quota_bytes, now)
        return report

    def _round(self, inputs: RoundInputs) -> tuple[RoundReport, Any]:
        """An active round (pipeline/round/run.py), with the last round's carry."""
        return run_round(self.spark, self.storage, inputs, self._carry)

    def _halt_failed_brokers(self, failed: Mapping[int, str] | None = None) -> list[int]:
        """Halts every running (or starting) broker whose storage location has failed: those in
        `failed` (broker -> what a write met) and those whose log a check of its Delta snapshot finds
        gone, unreadable, of another schema or another cluster's (no Spark job). A halted broker is
        stopped as by stop_broker, and its brokers row says why. Returns the brokers it halted."""
        problems = {}
        for r in self._broker_rows():
            broker = r["broker"]
            if _state(r) in (controller.STOPPED, controller.FENCED):
                continue
            problem = (failed or {}).get(broker)
            if problem is None:
                found = log_problem(self.storage, broker)
                problem = found and f"the log of broker {broker} at {self.storage.log_path(broker)} {found}"
            if problem:
                problems[broker] = problem
        for broker, problem in sorted(problems.items()):
            _log.warning("broker %d halts: its log directory failed (%s); start_broker(%d) restarts it", broker,
                         problem, broker)
            self.stop_broker(broker, log_dir_failure=problem)
        if problems:
            self._register_views()
        return sorted(problems)

    def _lease_row(self):
        return self.storage.read("lease").filter(F.col("lease") == "replication").first()

    def _hold_lease(self) -> None:
        """One writer: the first round of this object takes the replication lease with the next job
        epoch (a compare-and-set MERGE: of two processes taking it at once, Delta's conflict check
        fails one); every later round checks, from the lease table's version (no Spark job), that
        no newer process took it over, and a fenced one raises FENCED_INSTANCE_ID, naming the
        holder, before it writes anything. A newer process always takes over (a restarted job
        must not wait for a dead one); the old one stops at its next round."""
        if self._lease is not None:
            if self.storage.version("lease") == self._lease[1]:
                return
            row = self._lease_row()
            if row is not None and row["job_epoch"] != self._lease[0]:
                raise ReplogError(ErrorCode.FENCED_INSTANCE_ID,
                                  f"replication on {self.storage.root} was taken over by {row['holder']} "
                                  f"(job epoch {row['job_epoch']}; this process held {self._lease[0]}): "
                                  "this process runs no more rounds")
            self._lease = (self._lease[0], self.storage.version("lease"))
            return
        current = self._lease_row()
        epoch = (current["job_epoch"] if current is not None else 0) + 1
        claim = self.spark.createDataFrame([("replication", self.holder, epoch, self.clock.now_ms())], LEASE_SCHEMA)
        try:  # one row written: the claim committed, so the lease is this process's
            claimed = self.storage.update_if(claim, "lease", ["lease"], only_if=f"t.job_epoch = {epoch - 1}",
                                             insert=True) == 1
        except Exception as e:  # a concurrent claim committed first (Delta's concurrent-modification check)
            if not is_concurrent_conflict(e):
                raise
            claimed = False
        if not claimed:
            held = self._lease_row()
            raise ReplogError(ErrorCode.FENCED_INSTANCE_ID,
                              f"replication on {self.storage.root} is held by "
                              f"{held['holder'] if held else 'nobody'}: another process took it at the same time")
        self._lease = (epoch, self.storage.version("lease"))

    def rounds(self) -> DataFrame:
        return self.storage.read("rounds")

    # -- state -------------------------------------------------------------------------------
    def _check_topic(self, topic: str | None) -> None:
        if topic is not None and self._topic(topic) is None:
            raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic '{topic}'")

    def describe(self, topic: str | None = None) -> DataFrame:
        """topic, partition, leader, leader_epoch, replicas, isr, high_watermark, log_end_offset,
        log_start_offset (plus partition_epoch and min_isr)."""
        self._check_topic(topic)
        df = self.spark.sql(views.partitions_sql(self.storage, self.config["min.insync.replicas"]))
        return df if topic is None else df.filter(F.col("topic") == topic)

    def replicas(self, topic: str | None = None) -> DataFrame:
        """topic, partition, broker, is_leader, in_isr, log_end_offset, high_watermark, lag,
        last_caught_up_time_ms."""
        self._check_topic(topic)
        df = self.spark.sql(views.replicas_sql(self.storage))
        return df if topic is None else df.filter(F.col("topic") == topic)

    def metrics(self) -> DataFrame:
        """name, value, round_id, now_ms: UnderReplicatedPartitions, UnderMinIsrPartitionCount,
        AtMinIsrPartitionCount, OfflinePartitionsCount, MaxLag, IsrShrinksPerSec, IsrExpandsPerSec,
        NumIncrementalFetchSessions, NumIncrementalFetchPartitionsCached,
        IncrementalFetchSessionEvictionsPerSec."""
        return self.spark.sql(views.metrics_sql(self.storage))

    def fetch_sessions(self) -> DataFrame:
        """Every leader's KIP-227 fetch session cache after the newest round: leader, fetcher,
        privileged, session_id, epoch (the next one the leader expects), created_ms, last_used_ms,
        partitions, round_id."""
        return self.spark.sql(views.fetch_sessions_sql(self.storage))

    def fetch_requests(self) -> list[sessions.Context]:
        """What each leader made of each fetch request of the newest round (kind 'full',
        'incremental', 'sessionless' or 'error' with FETCH_SESSION_ID_NOT_FOUND /
        INVALID_FETCH_SESSION_EPOCH)."""
        text = self._last_report.fetch_sessions if self._last_report else None
        return [sessions.Context(**c) for c in json.loads(text)["requests"]] if text else []

    def read_incremental(self, consumer_id: str, topic: str, client_id: str | None = None,
                         user: str | None = None) -> DataFrame:
        """The committed records of `topic` that consumer `consumer_id` has not read yet, through
        its KIP-227 fetch session with each leader (unprivileged: it shares the leaders' cache slots
        with the followers' sessions and yields to them). An incremental response carries only
        partitions with new committed records (or a changed HW or log start offset), so the cost
        follows what changed. The first call reads from the log start offset; each call moves the
        consumer's positions to the high watermarks it saw. A leader that answers with
        FETCH_SESSION_ID_NOT_FOUND (its session was evicted) serves nothing this call and the next
        call opens a new session with a full fetch: nothing is skipped or returned twice.
        `client_id` (default: the consumer id) and `user` select its consumer_byte_rate quota (see
        fetch_incremental; fetch_throttle_time_ms tells the last call's throttle).
        Returns topic, partition, offset, leader_epoch, timestamp, key, value (pinned)."""
        fetched = self.fetch_incremental(consumer_id, topic, client_id, user)
        fetched.commit()
        return fetched.records

    def fetch_incremental(self, consumer_id: str, topic: str, client_id: str | None = None,
                          user: str | None = None) -> consumer.Fetched:
        """read_incremental's fetch without moving the consumer's positions yet: the records, the
        ranges read per partition, and `commit()` (pipeline/stream.py records the ranges first).
        Under a consumer_byte_rate quota the fetch's bytes are recorded (this process measures its
        consumers, as each Kafka broker measures its own); over the quota the result carries a
        throttle time, and a fetch while the client still waits serves nothing and moves nothing
        (its records stay for a later fetch)."""
        if not isinstance(consumer_id, str) or not consumer_id:
            raise ValueError(f"consumer_id must be a non-empty str, got {consumer_id!r}")
        client_id, user = check_client(client_id, user)
        client_id = consumer_id if client_id is None else client_id
        if not isinstance(topic, str) or self._topic(topic) is None:
            raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic!r}")
        now = self.clock.now_ms()
        self._reload_config()
        found = None  # (the quota's sensor key, the quota) of this client's consumer_byte_rate quota
        if self._quota_sensors("consumer_byte_rate", now) is not None:  # (brings the sensors' windows up to date)
            found = quotas.quota_for(self._quota_entries(), "consumer_byte_rate", user, client_id)
        quota_key, quota = found if found is not None else (None, None)
        waits = self._sensors["consumer_byte_rate"].remaining_ms(quota_key, now) if quota_key else 0
        if waits:
            fetched = consumer.throttled_fetch(self.storage, waits)
        else:
            fetched = consumer.fetch_incremental(
                self.storage, self.brokers, self._round_sessions()[0], consumer_id, topic, now,
                self.config["max.incremental.fetch.session.cache.slots"], self._rng)
            if quota_key is not None:
                size = fetched.records.agg(F.sum(record_size(F.col("key"), F.col("value")))).first()[0] or 0
                throttle = self._sensors["consumer_byte_rate"].record(quota_key, quota, int(size), now)
                fetched = replace(fetched, throttle_time_ms=throttle)
        self._consumer_requests[consumer_id] = fetched.contexts
        self._fetch_throttles[consumer_id] = fetched.throttle_time_ms
        return fetched

    def fetch_throttle_time_ms(self, consumer_id: str) -> int:
        """The throttle time of `consumer_id`'s last fetch in this process (Kafka's consumer
        metric fetch-throttle-time): 0 within its consumer_byte_rate quota."""
        return self._fetch_throttles.get(consumer_id, 0)

    def stream(self, topic: str, consumer_id: str, process: Any, checkpoint: str,
               trigger: Mapping[str, Any] | None = None) -> Any:
        """A Structured Streaming query calling `process(records, batch_id)` with the committed
        records of `topic` that `consumer_id` has not processed, a micro-batch after rounds have
        run; a batch Spark retries reads the same records (pipeline/stream.py)."""
        from pipeline.stream import committed_stream
        return committed_stream(self, topic, consumer_id, process, checkpoint, dict(trigger) if trigger else None)

    def consumer_fetch_requests(self, consumer_id: str) -> list[sessions.Context]:
        """What each leader made of `consumer_id`'s fetch requests in its last read_incremental
        call in this process (kinds as in fetch_requests)."""
        return list(self._consumer_requests.get(consumer_id, []))

    def laggiest_replicas(self, n: int = 10) -> DataFrame:
        """The `n` followers furthest behind: topic, partition, broker, in_isr, lag_records, lag_ms."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        return self.spark.sql(views.lagging_replicas_sql(self.storage)).limit(n)

    def _hold_lease_recovered(self) -> None:
        """The one-writer lease, for work beside the rounds that writes the tables rounds write
        (the cleaner, maintenance): an interrupted round is undone and replayed first."""
        self._hold_lease()
        if not self._recovery_checked or self._replay is not None:
            self.run_round()

    def compact(self) -> cleaner.CleanerReport | None:
        """One pass of the log cleaner over every topic with cleanup.policy `compact` (Kafka's
        log compaction; pipeline/cleaner.py has the rules): in each partition that is due (by
        min.cleanable.dirty.ratio or max.compaction.lag.ms), below the high watermark and outside
        min.compaction.lag.ms, every replica loses the records whose key comes again later, and
        tombstones delete.retention.ms after a clean first passed them. Offsets never change. The
        replication job runs it every log.cleaner.backoff.ms; it writes the broker logs, so it takes
        the one-writer lease as a round does, and finishes an interrupted round first. Returns the
        pass's figures (also in replog.metrics); None when no topic is compacted."""
        self._hold_lease_recovered()
        rows = self._broker_rows()
        down = {r["broker"] for r in rows if _state(r) != controller.RUNNING}
        return cleaner.run_cleaner(self.spark, self.storage, self.brokers, self.config, self.clock.now_ms(),
                                   down, self._log_readable, self._hold_lease)

    def compact_if_due(self) -> cleaner.CleanerReport | None:
        """The replication job's cleaner step, after each round: a compact() pass when
        log.cleaner.enable is on and log.cleaner.backoff.ms (by the cluster clock) has passed since
        the last pass; None otherwise."""
        if not self.config["log.cleaner.enable"]:
            return None
        now = self.clock.now_ms()
        if self._last_clean_ms is None:
            self._last_clean_ms = self.storage.read("cleaner_runs").agg(F.max("now_ms")).first()[0]
        if self._last_clean_ms is not None and now - self._last_clean_ms < self.config["log.cleaner.backoff.ms"]:
            return None
        self._last_clean_ms = now
        return self.compact()

    def maintain(self) -> maintenance.MaintenanceReport:
        """One pass of Delta table maintenance over every cluster table and broker log:
        compaction of small files (`log.maintenance.min.files`), VACUUM within
        `log.maintenance.file.retention.ms`, and the Delta log retention of the tables rounds
        write (`log.maintenance.log.retention.ms`); pipeline/maintenance.py. It rewrites files,
        not rows, so it takes the one-writer lease as a round does and finishes an interrupted
        round first. KAFKA_STORAGE_ERROR when a directory refuses the writes."""
        self._hold_lease_recovered()
        healthy = [r["broker"] for r in self._broker_rows() if r["log_dir_failure"] is None]  # (not a halted one's)
        report = maintenance.maintain(self.storage, healthy, self.config)
        self._last_maintenance_ms = self.clock.now_ms()
        maintenance.record_pass(self.storage, self._last_maintenance_ms)
        return report

    def maintain_if_due(self) -> maintenance.MaintenanceReport | None:
        """The replication job's maintenance step, after each round: a maintain() pass when
        log.maintenance.interval.ms (cluster clock) has passed since the last pass by any job;
        None otherwise. A cluster that never had one starts counting now (recorded, no pass)."""
        now = self.clock.now_ms()
        if self._last_maintenance_ms is None:
            self._last_maintenance_ms = maintenance.last_pass_ms(self.storage)
            if self._last_maintenance_ms is None:
                maintenance.record_pass(self.storage, now)
                self._last_maintenance_ms = now
        if now - self._last_maintenance_ms < self.config["log.maintenance.interval.ms"]:
            return None
        return self.maintain()

    def cleaner_runs(self) -> DataFrame:
        """One row per pass of the log cleaner (see compact())."""
        return self.storage.read("cleaner_runs")

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Kafka's DeleteRecords: moves the partition's log start offset to `before_offset` (-1: the
        high watermark) at the next round; followers drop the same prefix. Returns the log start
        offset the partition will have. OFFSET_OUT_OF_RANGE above the high watermark."""
        meta = self._topic(topic) if isinstance(topic, str) else None
        if meta is None or isinstance(partition, bool) or not isinstance(partition, int) \
                or not 0 <= partition < meta["partitions"]:
            raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {partition!r} of topic {topic!r}")
        leader = self.describe(topic).filter(F.col("partition") == partition).first()
        hw, start = leader["high_watermark"], leader["log_start_offset"]
        if before_offset == -1 and not isinstance(before_offset, bool):
            before_offset = hw
        if isinstance(before_offset, bool) or not isinstance(before_offset, int) or not 0 <= before_offset <= hw:
            raise ReplogError(ErrorCode.OFFSET_OUT_OF_RANGE,
                              f"before_offset must be -1 or between 0 and the high watermark {hw}, got {before_offset!r}")
        self.storage.append_table(self.spark.createDataFrame(
            [(str(uuid.uuid4()), "delete_records", topic, partition, before_offset, self.clock.now_ms(), None)],
            ADMIN_SCHEMA), "admin")
        return max(start, before_offset)

    # -- consumer groups ---------------------------------------------------------------------
    def _check_group(self, group: Any) -> None:
        if not isinstance(group, str) or not group.strip():
            raise ReplogError(ErrorCode.INVALID_GROUP_ID, f"a group id must be a non-empty string, got {group!r}")

    def commit_offsets(self, group: str, offsets: Mapping[tuple[str, int], int], metadata: str | None = None) -> None:
        """Kafka's OffsetCommit: stores, per (topic, partition), the next offset `group` reads, in
        one commit (all or nothing). A later commit of the same partition replaces it."""
        self._check_group(group)
        if not isinstance(offsets, Mapping) or not offsets:
            raise ValueError("offsets must be a non-empty mapping {(topic, partition): offset}")
        if metadata is not None and len(metadata.encode("utf-8")) > groups.OFFSET_METADATA_MAX_BYTES:
            raise ReplogError(ErrorCode.OFFSET_METADATA_TOO_LARGE,
                              f"metadata is over offset.metadata.max.bytes ({groups.OFFSET_METADATA_MAX_BYTES})")
        rows, counts = [], {}
        for key, offset in offsets.items():
            if not (isinstance(key, tuple) and len(key) == 2):
                raise ValueError(f"offsets keys are (topic, partition), got {key!r}")
            topic, partition = key
            if topic not in counts:
                meta = self._topic(topic) if isinstance(topic, str) else None
                if meta is None:
                    raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic!r}")
                counts[topic] = meta["partitions"]
            if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < counts[topic]:
                raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                  f"topic '{topic}' has no partition {partition!r}")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"the offset of {topic}-{partition} must be an int >= 0, got {offset!r}")
            rows.append((group, topic, partition, offset, metadata, self.clock.now_ms()))
        self.storage.upsert(self.spark.createDataFrame(rows, GROUP_OFFSETS_SCHEMA), "group_offsets",
                            ["group_id", "topic", "partition"])

    def committed_offsets(self, group: str) -> DataFrame:
        """Kafka's OffsetFetch: topic, partition, committed_offset, metadata, commit_ms of `group`."""
        self._check_group(group)
        return self.storage.read("group_offsets").filter(F.col("group_id") == group).drop("group_id")

    def consumer_lag(self, group: str | None = None) -> DataFrame:
        """kafka-consumer-groups --describe: group_id, topic, partition, current_offset,
        log_end_offset (the HW: the end a consumer can read to) and lag, per committed partition."""
        df = self.spark.sql(views.consumer_lag_sql(self.storage))
        return df if group is None else df.filter(F.col("group_id") == group)

    def read(self, topic: str, partition: int | None = None, from_offset: int | None = None,
             replica: int | None = None, isolation: str = "read_committed", group: str | None = None,
             auto_offset_reset: str = "latest", leader_epoch: int | None = None) -> DataFrame:
        """Records of a topic from one replica per partition (the leader by default), from each
        partition's log start offset or from `from_offset` (OFFSET_OUT_OF_RANGE when below the log
        start offset): read_committed stops at that replica's HW, read_uncommitted at its LEO.

        With `group`, each partition starts at the group's committed offset; where it has none,
        or one out of range, `auto_offset_reset` decides as Kafka's consumer does: `latest` (the
        default: nothing until new records), `earliest` (the log start) or `none`
        (NO_OFFSET_FOR_PARTITION). Reading does not commit: call commit_offsets().

        `leader_epoch` (with `partition`) is the leader epoch the reader last knew, as a Kafka
        fetch's currentLeaderEpoch (KIP-320): an older one fails with FENCED_LEADER_EPOCH, a newer
        one with UNKNOWN_LEADER_EPOCH, and the reader refreshes its metadata (describe())."""
        if isolation not in _ISOLATION:
            raise ValueError(f"isolation must be one of {_ISOLATION}, got {isolation!r}")
        if group is not None:
            self._check_group(group)
            if from_offset is not None:
                raise ValueError("give either group (start at its committed offsets) or from_offset, not both")
            if auto_offset_reset not in groups.AUTO_OFFSET_RESET:
                raise ValueError(f"auto_offset_reset must be one of {groups.AUTO_OFFSET_RESET}, got {auto_offset_reset!r}")
        meta = self._topic(topic) if isinstance(topic, str) else None
        if meta is None:
            raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic!r}")
        if partition is not None and (isinstance(partition, bool) or not isinstance(partition, int)
                                      or not 0 <= partition < meta["partitions"]):
            raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic '{topic}' has no partition {partition!r}")
        if leader_epoch is not None:
            if partition is None:
                raise ValueError("leader_epoch needs a partition: epochs are per partition")
            current = self.storage.read("partitions").filter(
                (F.col("topic") == topic) & (F.col("partition") == partition)).first()["leader_epoch"]
            if leader_epoch != current:
                code = ErrorCode.FENCED_LEADER_EPOCH if leader_epoch < current else ErrorCode.UNKNOWN_LEADER_EPOCH
                raise ReplogError(code, f"leader epoch {leader_epoch} of {topic}-{partition} is not the current "
                                        f"one ({current}): refresh the metadata")
        if replica is not None and replica not in self.brokers:
            raise ReplogError(ErrorCode.BROKER_NOT_AVAILABLE, f"no broker {replica!r}")
        if from_offset is not None and (isinstance(from_offset, bool) or not isinstance(from_offset, int)
                                        or from_offset < 0):
            raise ReplogError(ErrorCode.OFFSET_OUT_OF_RANGE, f"from_offset must be an int >= 0, got {from_offset!r}")
        state = self.storage.replica_state().filter(F.col("topic") == topic)
        if replica is None:
            leaders = self.storage.read("partitions").filter(F.col("topic") == topic).select(
                "topic", "partition", F.col("leader").alias("broker"))
            state = state.join(leaders, on=["topic", "partition", "broker"], how="inner")
        else:
            state = state.filter(F.col("broker") == replica)
        if partition is not None:
            state = state.filter(F.col("partition") == partition)
        if from_offset is not None:
            below = state.filter(F.col("log_start_offset") > from_offset).select(
                "partition", "log_start_offset").limit(1).collect()
            if below:
                raise ReplogError(ErrorCode.OFFSET_OUT_OF_RANGE,
                                  f"offset {from_offset} is below the log start offset {below[0]['log_start_offset']} "
                                  f"of partition {below[0]['partition']} of '{topic}'")
        upper = "high_watermark" if isolation == "read_committed" else "log_end_offset"
        state = state.select("topic", "partition", "broker", "log_start_offset", "high_watermark", "log_end_offset")
        start = F.greatest(F.lit(from_offset or 0), F.col("log_start_offset"))
        if group is not None:
            committed = self.committed_offsets(group).filter(F.col("topic") == topic)
            if auto_offset_reset == "none":
                missing = groups.partitions_without_offset(state, committed).limit(1).collect()
                if missing:
                    raise ReplogError(ErrorCode.NO_OFFSET_FOR_PARTITION,
                                      f"group '{group}' has no offset in range for partition {missing[0]['partition']} "
                                      f"of '{topic}' (committed: {missing[0]['committed_offset']}) and "
                                      "auto_offset_reset is 'none'")
            starts = groups.group_start_offsets(state, committed, auto_offset_reset)
            state = state.join(starts.select("topic", "partition", "start_offset"), on=["topic", "partition"])
            start = F.col("start_offset")
        # a replica's read needs only its log; a stopped broker's lost log directory serves nothing
        hosts = [replica] if replica is not None else [
            b for b in self.brokers if self.storage.path_exists(f"{self.storage.log_path(b)}/_delta_log")]
        logs = self.spark.sql(views.logs_sql(self.storage, hosts)).filter(F.col("topic") == topic)
        return (
            logs.join(state, on=["topic", "partition", "broker"], how="inner")
            .filter((F.col("offset") >= start) & (F.col("offset") < F.col(upper)))
            .select("topic", "partition", "offset", "leader_epoch", "timestamp", "key", "value")
        )

    # -- fault hooks -------------------------------------------------------------------------
    def _set_broker(self, broker: int, **changes: Any) -> None:
        if broker not in self.brokers:
            raise ReplogError(ErrorCode.BROKER_NOT_AVAILABLE, f"no broker {broker!r}")
        row = self.storage.read("brokers").filter(F.col("broker") == broker).first().asDict()
        row.update(changes)
        self.storage.upsert(self.spark.createDataFrame([tuple(row[f] for f in BROKERS_SCHEMA.fieldNames())],
                                                       BROKERS_SCHEMA), "brokers", ["broker"])

    def pause_fetcher(self, broker: int) -> None:
        """The broker stays alive but stops fetching (a stuck follower)."""
        # remembered: the time of its last fetch, which Kafka's lag rule measures from
        self._set_broker(broker, fetcher_paused=True, changed_ms=self._last_report.now_ms if self._last_report else self.clock.now_ms())

    def resume_fetcher(self, broker: int) -> None:
        self._set_broker(broker, fetcher_paused=False, changed_ms=self._admin_now_ms())

    def throttle_fetcher(self, broker: int, max_bytes_per_round: int | None) -> None:
        """At most `max_bytes_per_round` bytes per partition per round to this follower (a slow
        follower; at least one record still moves). None lifts the throttle."""
        if max_bytes_per_round is not None and (not isinstance(max_bytes_per_round, int) or max_bytes_per_round < 1):
            raise ValueError(f"max_bytes_per_round must be an int >= 1 or None, got {max_bytes_per_round!r}")
        self._set_broker(broker, fetch_max_bytes_per_round=max_bytes_per_round)

    def _broker_row(self, broker: int) -> Any:
        if broker not in self.brokers:
            raise ReplogError(ErrorCode.BROKER_NOT_AVAILABLE, f"no broker {broker!r}")
        return next(r for r in self._broker_rows() if r["broker"] == broker)

    def _broker_state(self, broker: int) -> str:
        return _state(self._broker_row(broker))

    def _register_views(self) -> None:
        """The replog.* views again, over the logs there are now (a halted broker's may be gone)."""
        if self._views:
            views.register_views(self.spark, self.storage, self.brokers, self.config["min.insync.replicas"])

    def stop_broker(self, broker: int, log_dir_failure: str | None = None) -> None:
        """A crash: from now on the broker neither heartbeats nor fetches nor answers fetches, and
        its tables stay as they are. Its partitions take no produce requests
        (NOT_LEADER_OR_FOLLOWER) until the controller fences it, broker.session.timeout.ms after its
        last heartbeat (the last round's time), and elects new leaders from the ISR. A broker still
        starting (no round has registered it yet) can crash too: its last heartbeat is its
        registration, and a lost log it restarted with stays on record for its next start."""
        state = self._broker_state(broker)
        if state == controller.STARTING:
            self._set_broker(broker, state=controller.STOPPED, log_dir_failure=log_dir_failure)
            return
        if state != controller.RUNNING:
            raise ReplogError(ErrorCode.BROKER_NOT_AVAILABLE, f"broker {broker} is not running ({state})")
        last_heartbeat = self._last_report.now_ms if self._last_report else self.clock.now_ms()
        self._set_broker(broker, state=controller.STOPPED, last_heartbeat_ms=last_heartbeat,
                         log_dir_failure=log_dir_failure)

    def start_broker(self, broker: int) -> None:
        """Restarts a stopped broker. It registers again: the next round ends its old session (it
        leaves every ISR it is not the last member of, and leadership) and unfences it; its replicas
        then fetch, truncate any suffix that diverges from their leader's log by leader epoch, and
        rejoin the ISR once caught up. A broker whose log directory is gone or unreadable restarts
        empty, and stays out of every ISR and of leadership until it has fetched everything back:
        so does one whose location was replaced by an empty one. A location that cannot be written
        is refused (KAFKA_STORAGE_ERROR): the broker stays stopped."""
        row = self._broker_row(broker)
        state = _state(row)
        if state not in (controller.STOPPED, controller.FENCED):
            raise ReplogError(ErrorCode.BROKER_NOT_AVAILABLE, f"broker {broker} is not stopped ({state})")
        where = self.storage.broker_root(broker)
        unwritable = write_problem(self.storage, where)
        if unwritable:
            raise ReplogError(ErrorCode.KAFKA_STORAGE_ERROR, f"broker {broker} cannot start: its location {where} "
                              f"{unwritable}")
        # a missing, corrupted or foreign log restarts empty, as Kafka does with a failed log dir; so
        # does a log an interrupted round wrote to after the broker halted (recovery could not undo it),
        # and an empty log from a start that crashed before a round registered it is still a lost one
        lost = bool(row["log_lost"]) or log_problem(self.storage, broker) is not None
        if lost:
            self._recreate_log(broker)
        self._set_broker(broker, state=controller.STARTING, last_heartbeat_ms=self._admin_now_ms(), log_lost=lost,
                         log_dir_failure=None)
        self._register_views()

    def _log_readable(self, broker: int) -> bool:
        return log_problem(self.storage, broker) is None

    def _recreate_log(self, broker: int) -> None:
        """An empty log for `broker` and its replicas' offsets back to 0 (they refetch from the
        leaders' log start offsets)."""
        self.storage.remove_log(broker)
        self.storage.create_log(broker)
        zero = ("log_start_offset", "log_end_offset", "high_watermark", "fetch_offset", "last_fetch_leader_leo",
                "last_caught_up_time_ms", "validated_leader_epoch", "session_id")
        self.storage.reset_replica_state(broker, {c: "0" for c in zero})

    def broker_states(self) -> DataFrame:
        """broker, state (running | stopped | fenced | starting), last_heartbeat_ms (a running
        broker's is the newest round's time), fetcher_paused, log_lost."""
        return self.spark.sql(views.brokers_sql(self.storage))

    def elections(self) -> DataFrame:
        """Every leader change the controller made: round_id, now_ms, topic, partition, election
        (clean | unclean | offline), previous_leader, leader, leader_epoch, start_offset,
        high_watermark, offsets_lost, isr."""
        return self.storage.read("elections")

    def elect_preferred_leaders(self, topic: str | None = None, partition: int | None = None) -> None:
        """Kafka's preferred leader election (kafka-leader-election --election-type PREFERRED): at
        the next round, each named partition (every partition of `topic`, or of every topic) whose
        first replica is live, in the ISR and not leading gets it back as leader, so leadership
        returns to the balanced assignment after failures. Elections are rows of `elections()`."""
        if topic is None:
            if partition is not None:
                raise ValueError("give a topic with a partition")
            topics = [r["topic"] for r in self.storage.read("topics").select("topic").collect()]
        else:
            meta = self._topic(topic) if isinstance(topic, str) else None
            if meta is None:
                raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic!r}")
            if partition is not None and (isinstance(partition, bool) or not isinstance(partition, int)
                                          or not 0 <= partition < meta["partitions"]):
                raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                  f"topic '{topic}' has no partition {partition!r}")
            topics = [topic]
        now = self.clock.now_ms()
        rows = [(str(uuid.uuid4()), "elect_preferred", t, -1 if partition is None else partition, -1, now, None)
                for t in topics]
        if rows:
            self.storage.append_table(self.spark.createDataFrame(rows, ADMIN_SCHEMA), "admin")

    # -- reassignments and brokers (KIP-455; kafka-reassign-partitions) ---------------------------
    def reassign_partitions(self, assignment: Mapping[tuple[str, int], Any]) -> None:
        """Kafka's AlterPartitionReassignments (kafka-reassign-partitions --execute): at the next
        round each named partition's replicas grow to the target list; the new ones fetch from the
        leader's log start offset, outside the ISR and not electable, until they meet the ISR
        expansion rule; then the replicas become the target, the ones left out leave (their logs
        are deleted) and leadership moves if the leader left. Raising the replication factor is a
        target with more replicas. A target equal to the replicas before an unfinished
        reassignment cancels it. Progress: `reassignments()` (`replog.reassignments`).

        `assignment`: {(topic, partition): [broker, ...]}. Every entry is checked before anything
        is written: UNKNOWN_TOPIC_OR_PARTITION, INVALID_REPLICA_ASSIGNMENT (empty, duplicate,
        unknown or decommissioning brokers)."""
        if not isinstance(assignment, Mapping) or not assignment:
            raise ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                              "give a non-empty mapping {(topic, partition): [broker, ...]}")
        rows, now = [], self.clock.now_ms()
        placeable = set(self._placeable_brokers())
        for key, target in assignment.items():
            topic, partition = self._check_partition(key)
            rows.append((str(uuid.uuid4()), "reassign", topic, partition, -1, now,
                         self._check_target(topic, partition, target, placeable)))
        self.storage.append_table(self.spark.createDataFrame(rows, ADMIN_SCHEMA), "admin")

    def _check_partition(self, key: Any) -> tuple[str, int]:
        if not isinstance(key, tuple) or len(key) != 2:
            raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{key!r} is not a (topic, partition) pair")
        topic, partition = key
        meta = self._topic(topic) if isinstance(topic, str) else None
        if meta is None:
            raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic!r}")
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < meta["partitions"]:
            raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic '{topic}' has no partition {partition!r}")
        return topic, partition

    def _check_target(self, topic: str, partition: int, target: Any, placeable: set[int]) -> list[int]:
        where = f"{topic}-{partition}"
        if isinstance(target, (str, bytes)) or not hasattr(target, "__iter__"):
            raise ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"{where}: replicas must be a list of broker ids")
        target = list(target)
        if not target:
            raise ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"{where}: the replica list is empty")
        if any(isinstance(b, bool) or not isinstance(b, int) for b in target):
            raise ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"{where}: broker ids must be ints, got {target!r}")
        if len(set(target)) != len(target):
            raise ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"{where}: duplicate brokers in {target}")
        unknown = [b for b in target if b not in self.brokers]
        if unknown:
            raise ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                              f"{where}: unknown brokers {unknown} (registered: {self.brokers})")
        leaving = [b for b in target if b not in placeable]
        if leaving:
            raise ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                              f"{where}: brokers {leaving} are being decommissioned")
        return target

    def reassignments(self) -> DataFrame:
        """Partitions with a reassignment in progress (kafka-reassign-partitions --verify, Kafka's
        ListPartitionReassignments): topic, partition, replicas, isr, adding, removing, and per
        partition the records and bytes its adding replicas still have to fetch from the leader."""
        return self.spark.sql(views.reassignments_sql(self.storage, self.brokers))

    def add_broker(self, dir: str | None = None) -> int:
        """Registers a new, empty broker (the next id) and returns its id; it hosts nothing until a
        reassignment or a new topic places replicas on it. `dir`: its storage location (as
        `broker_dirs` of create; default `<root>/brokers/<id>`), refused when another broker's
        location is the same, holds it or lies in it, or it holds a log already."""
        self._broker_rows()
        broker = max(self.brokers) + 1
        taken = {b: self.storage.broker_root(b) for b in self.brokers}
        given = check_locations(self.storage, {broker: dir if dir is not None else self.storage.default_broker_root(broker)},
                                taken)
        now = self._admin_now_ms()
        self.storage.broker_dirs.update(given)
        self.storage.create_log(broker)  # the log first: a registered broker always has one
        self.storage.append_table(self.spark.createDataFrame(
            [(broker, self.storage.stored_location(broker), False, None, now, controller.RUNNING, now, False, False,
              None)], BROKERS_SCHEMA), "brokers")
        self._broker_rows()
        return broker

    def decommission_broker(self, broker: int) -> dict[tuple[str, int], list[int]]:
        """Moves every replica off `broker` by reassignment, each to the broker (not yet a replica
        of that partition, not being decommissioned) that holds the fewest replicas, and takes no
        new replicas on it. Refused (INVALID_REPLICATION_FACTOR, nothing written) while some
        partition would have nowhere to go: its replication factor would drop. Returns the targets."""
        if isinstance(broker, bool) or not isinstance(broker, int) or broker not in self.brokers:
            raise ReplogError(ErrorCode.BROKER_NOT_AVAILABLE, f"no broker {broker!r}")
        others = [b for b in self._placeable_brokers() if b != broker]
        rows = self.storage.read("partitions").select("topic", "partition", "replicas", "removing_replicas").collect()
        targets = {(r["topic"], r["partition"]): [b for b in r["replicas"] if b not in (r["removing_replicas"] or [])]
                   for r in rows}
        load = {b: 0 for b in others}
        for replicas in targets.values():
            for b in replicas:
                if b in load:
                    load[b] += 1
        plan = {}
        for key in sorted(k for k, replicas in targets.items() if broker in replicas):
            replicas = targets[key]
            free = [b for b in others if b not in replicas]
            if not free:
                raise ReplogError(ErrorCode.INVALID_REPLICATION_FACTOR,
                                  f"broker {broker} cannot be decommissioned: {key[0]}-{key[1]} has replicas {replicas} "
                                  f"and no other broker to move to (its replication factor would drop)")
            to = min(free, key=lambda b: (load[b], b))
            load[to] += 1
            plan[key] = [to if b == broker else b for b in replicas]
        self._set_broker(broker, decommissioned=True)
        if plan:
            self.reassign_partitions(plan)
        return plan

    # -- configs at run time (kafka-configs --alter) -----------------------------------------
    def _reload_config(self) -> None:
        """The cluster-wide config as another process may have altered it (a version check, ~4 ms);
        a change drops the carried state, whose partitions hold the effective topic settings. A new
        version with the same config (a maintenance pass records its time in the table's
        properties) keeps it: dropping it would make the next round read every partition again."""
        version = self.storage.version("cluster")
        if version != self._config_version:
            row = self.storage.read("cluster").first()
            config = with_defaults(json.loads(row["config"]))
            self._config_version = version
            if config == self.config:
                return
            self.config, self._carry, self._seen = config, None, None
            if self._views:
                views.register_views(self.spark, self.storage, self.brokers, self.config["min.insync.replicas"])

    # -- client quotas (Kafka's design 4.9, pipeline/quotas.py) -------------------------------------
    def alter_client_quotas(self, entity: Mapping[str, str | None], set: Mapping[str, Any] | None = None,
                            delete: Any = ()) -> dict[str, int]:
        """Kafka's AlterClientQuotas: sets or deletes `producer_byte_rate` / `consumer_byte_rate`
        (bytes/s) of an entity: {"user": name}, {"client-id": name} or both, a None name being the
        default entity (kafka-configs --entity-default). INVALID_REQUEST names what is wrong and
        writes nothing; the next round (produce) and the next fetch (consume) use them. Returns the
        entity's quotas after the change."""
        key = quotas.check_entity(entity)
        delete = [delete] if isinstance(delete, str) else list(delete or [])
        values = quotas.check_quota_values(dict(set or {}), delete)
        if not values and not delete:
            raise ReplogError(ErrorCode.INVALID_REQUEST, f"nothing to alter for {dict(entity)}: give a quota to set "
                                                         "or to delete")
        entries = dict(self._quota_entries())
        after = {k: v for k, v in entries.get(key, {}).items() if k not in delete}
        after.update(values)
        entries[key] = after
        now = self.clock.now_ms()
        rows = [(u, c, q.get("producer_byte_rate"), q.get("consumer_byte_rate"), now)
                for (u, c), q in sorted(entries.items(), key=lambda e: (str(e[0][0]), str(e[0][1]))) if q]
        self.storage.overwrite_table(self.spark.createDataFrame(rows, CLIENT_QUOTAS_SCHEMA), "client_quotas")
        return after

    def describe_client_quotas(self) -> list[dict[str, Any]]:
        """Kafka's DescribeClientQuotas: every entity with quotas, as {"entity": {"user": ...,
        "client-id": ...} (None: the default), "quotas": {key: bytes/s}}."""
        out = []
        for (user, client), values in sorted(self._quota_entries().items(), key=lambda e: (str(e[0][0]), str(e[0][1]))):
            entity = {kind: (None if name == quotas.DEFAULT else name)
                      for kind, name in zip(quotas.ENTITY_TYPES, (user, client)) if name is not None}
            out.append({"entity": entity, "quotas": dict(values)})
        return out

    @staticmethod
    def _client_entity(entity_type: str, name: Any) -> dict[str, Any] | None:
        """kafka-configs' --entity-type users|clients with a name (None: --entity-default)."""
        kind = {"users": "user", "clients": "client-id"}.get(entity_type)
        return None if kind is None else {kind: name}

    def describe_configs(self, entity_type: str, name: str | None = None) -> dict[str, Any]:
        """kafka-configs --describe: a topic's overrides (entity_type 'topics'), or the cluster-wide
        broker defaults ('brokers', no name), every key with its value."""
        if entity_type == "topics":
            row = self._topic(name) if isinstance(name, str) else None
            if row is None:
                raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
            return json.loads(row["config"])
        entity = self._client_entity(entity_type, name)
        if entity is not None:
            return dict(self._quota_entries().get(quotas.check_entity(entity), {}))
        self._check_broker_entity(entity_type, name)
        self._reload_config()
        return dict(self.config)

    def alter_configs(self, entity_type: str, name: str | None = None, set: Mapping[str, Any] | None = None,
                      delete: Any = ()) -> dict[str, Any]:
        """kafka-configs --alter (Kafka's IncrementalAlterConfigs: SET and DELETE): a topic's
        overrides (entity_type 'topics', name the topic; a deleted key falls back to the cluster's
        value), or the cluster-wide broker defaults ('brokers', no name: --entity-default; a
        deleted key goes back to Kafka's default). Validated as at creation (INVALID_CONFIG,
        UNKNOWN_TOPIC_OR_PARTITION; nothing written on an error); the next round uses them, in a
        running job too. 'users' and 'clients' (name None: the default entity) set client quotas
        (alter_client_quotas). Returns the entity's config after the change."""
        set = dict(set or {})
        delete = [delete] if isinstance(delete, str) else list(delete or [])
        if entity_type == "topics":
            row = self._topic(name) if isinstance(name, str) else None
            if row is None:
                raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
            self._check_deletes(delete, TOPIC_KEYS, "topic")
            current = {k: v for k, v in json.loads(row["config"]).items() if k not in delete}
            replication = (self.storage.read("partitions").filter(F.col("topic") == name)
                           .agg(F.min(F.size("replicas") - F.size(F.coalesce(
                               "removing_replicas", F.array().cast("array<int>"))))).first()[0])
            overrides = validate_topic_config({**current, **set}, replication)
            self.storage.upsert(self.spark.createDataFrame(
                [(name, row["partitions"], row["replication_factor"], to_json(overrides), row["created_ms"])],
                TOPICS_SCHEMA), "topics", ["topic"])
            return overrides
        entity = self._client_entity(entity_type, name)
        if entity is not None:  # --entity-type users|clients: client quotas
            return self.alter_client_quotas(entity, set, delete)
        self._check_broker_entity(entity_type, name)
        self._check_deletes(delete, CLUSTER_KEYS, "cluster")
        self._reload_config()
        current = {k: v for k, v in self.config.items() if k not in delete}
        full = validate_cluster_config({**current, **set})
        row = self.storage.read("cluster").first()
        self.storage.upsert(self.spark.createDataFrame(
            [(row["cluster_id"], row["brokers"], to_json(full), row["created_ms"])], CLUSTER_SCHEMA),
            "cluster", ["cluster_id"])
        self._reload_config()
        return full

    @staticmethod
    def _check_deletes(delete: list, keys: Mapping[str, Any], scope: str) -> None:
        unknown = [k for k in delete if k not in keys]
        if unknown:
            raise ReplogError(ErrorCode.INVALID_CONFIG, f"unknown {scope} config keys {unknown}")

    @staticmethod
    def _check_broker_entity(entity_type: str, name: Any) -> None:
        if entity_type != "brokers":
            raise ReplogError(ErrorCode.INVALID_CONFIG,
                              f"entity type must be 'topics', 'brokers', 'users' or 'clients', got {entity_type!r}")
        if name is not None:
            raise ReplogError(ErrorCode.INVALID_CONFIG,
                              f"configs are kept cluster-wide (kafka-configs --entity-default), not for broker {name!r}")
