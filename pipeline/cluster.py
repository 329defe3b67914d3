"""The public API: a cluster of Delta-backed brokers, its topics, producers, rounds and reads.

A thin facade: each method documents the call and delegates to the part that does it (admin.py,
configs.py, brokers.py, produce.py, consume.py, reads.py, housekeeping.py, round/driver.py, the
SQL of storage/views.py), over the process state of one open cluster (core.py)."""

from __future__ import annotations

import json
import uuid
from typing import Any, Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline import admin, brokers, configs, housekeeping, reads
from pipeline.clock import Clock, SystemClock
from pipeline.config import to_json, validate_cluster_config, with_defaults
from pipeline.consume import fetch as consume
from pipeline.consume import sessions as consumer
from pipeline.control import cleaner, controller
from pipeline.control import session_cache as sessions
from pipeline.core import ClusterCore
from pipeline.errors import ErrorCode, ReplogError
from pipeline.produce import produce_request
from pipeline.round import RoundReport
from pipeline.round import driver
from pipeline.schemas import BROKERS_SCHEMA, CLUSTER_SCHEMA
from pipeline.storage import Storage, maintenance, views
from pipeline.storage.locations import check_locations, given_locations, split_dirs_config

__all__ = ["Cluster"]

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
        self.core = ClusterCore(spark, storage, clock, config, brokers, views_wanted)
        if views_wanted:
            views.register_views(spark, storage, brokers, config["min.insync.replicas"])

    # the open cluster's parts, as attributes users and jobs read
    spark = property(lambda self: self.core.spark)
    storage = property(lambda self: self.core.storage)
    clock = property(lambda self: self.core.clock, lambda self, clock: self.core.set_clock(clock))
    config = property(lambda self: self.core.config, doc="The cluster-wide config (Kafka's keys, with defaults).")
    brokers = property(lambda self: self.core.brokers, doc="The registered brokers' ids.")
    holder = property(lambda self: self.core.lease.holder, doc="This process's name in the replication lease.")

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
        ids = sorted(r["broker"] for r in located)
        if storage.layout() >= 3:  # (an older root's brokers all have the default location, written absolute)
            storage.set_broker_dirs((r["broker"], r["path"]) for r in located)
        storage.upgrade(ids)  # a root made by an older release: the tables, columns and properties it lacks
        cluster = cls(spark, storage, clock or SystemClock(), with_defaults(json.loads(row["config"])), ids,
                      views_wanted=views)
        # no round runs while no process has the cluster open: this process's first round (re)starts
        # the brokers, and the leaders reset their followers' fetch state
        # (replication.reset_follower_state_on_restart), so the time it was down counts against none
        cluster.core.restarted = True
        return cluster

    # -- topics and produce ------------------------------------------------------------------
    def create_topic(self, topic: str, partitions: int = 1, replication_factor: int = 1,
                     config: Mapping[str, Any] | None = None, validate_only: bool = False) -> None:
        """A topic with Kafka's replica assignment; its leaders are the first replicas. `config`:
        topic overrides (retention.ms, min.insync.replicas, cleanup.policy, ...). Errors:
        INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR, INVALID_CONFIG,
        TOPIC_ALREADY_EXISTS. `validate_only`: the checks only, nothing created (Kafka's
        CreateTopicsOptions.validateOnly).

        >>> cluster.create_topic("orders", partitions=8, replication_factor=3, config={"min.insync.replicas": 2})
        """
        admin.create_topic(self.core, topic, partitions, replication_factor, config, validate_only)

    def topics(self) -> DataFrame:
        """topic, partitions, replication_factor, config (its overrides as JSON), created_ms."""
        return self.storage.read("topics")

    def produce(self, topic: str, records: Any, acks: Any = 1, client_id: str | None = None,
                user: str | None = None) -> str:
        """Appends a produce request to the inbox and returns its request id; the next round
        appends it on the leaders. `records`: dicts with value (str|bytes|None), optional key and
        partition, or a DataFrame with those columns. `client_id` and `user` (Kafka's client.id and
        authenticated user) select the client quota the request counts against (alter_client_quotas):
        over its producer_byte_rate, the request waits in the inbox for a later round.

        >>> cluster.produce("orders", [{"key": "k1", "value": "v1"}], acks="all")
        """
        return produce_request(self.core, topic, records, acks, client_id, user)

    def producer_id_block(self) -> range:
        """A block of 1000 producer ids for idempotent producers that no other call, in any
        process, gets (Kafka's AllocateProducerIds; the front door's InitProducerId hands them out).

        >>> ids = cluster.producer_id_block(); ids[0]
        """
        return admin.producer_id_block(self.core)

    def produce_results(self) -> DataFrame:
        """request_id, topic, partition, base_offset, last_offset, acks, status, error_code."""
        return self.spark.sql(views.results_sql(self.storage))

    # -- rounds ------------------------------------------------------------------------------
    def run_round(self, batch_id: int | None = None) -> RoundReport:
        """One fetch round; the streaming job's foreachBatch runs the same code. A round with
        nothing to do (no new produce request, every partition settled, no pending ack, no
        metadata or broker change since the last round, every fetch an incremental one of a
        session) only writes its metrics row, with the sessions' new epochs. With
        `replication.fetch.mode=full` every round fetches every partition.

        A running broker whose storage location has failed (its log gone, unreadable, another
        cluster's, or refusing a write: storage/locations.py) halts, as a Kafka broker whose only
        log dir fails does: the round runs without it (again, when it met the failure mid-round,
        after undoing what it had committed), and the controller fences it and moves its
        leaderships after broker.session.timeout.ms. start_broker restarts it.

        >>> report = cluster.run_round(); report.records_appended, report.high_watermark_moves
        """
        return driver.run_round(self.core, batch_id)

    def caught_up(self, report: RoundReport) -> bool:
        """Whether the cluster is done after the round of `report`: every produce request in the
        inbox read (a round that replays an interrupted one reads only as far as that round did),
        none pending or held by a client quota, every partition settled."""
        return driver.caught_up(self.core, report)

    def last_batch_id(self) -> int | None:
        """The newest streaming micro-batch that ran a round here (None: none did): a replayed
        micro-batch at or below it has already run its round."""
        return self.storage.read("rounds").agg(F.max("batch_id")).first()[0]

    def rounds(self) -> DataFrame:
        """One row per round: its id, time, figures and fetch sessions (RoundReport's fields)."""
        return self.storage.read("rounds")

    # -- state -------------------------------------------------------------------------------
    def _check_topic(self, topic: str | None) -> None:
        if topic is not None and self.core.metadata.topic(topic) is None:
            raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic '{topic}'")

    def describe(self, topic: str | None = None) -> DataFrame:
        """topic, partition, leader, leader_epoch, replicas, isr, high_watermark, log_end_offset,
        log_start_offset (plus partition_epoch and min_isr).

        >>> cluster.describe("orders").show()
        """
        self._check_topic(topic)
        df = self.spark.sql(views.partitions_sql(self.storage, self.config["min.insync.replicas"]))
        return df if topic is None else df.filter(F.col("topic") == topic)

    def replicas(self, topic: str | None = None) -> DataFrame:
        """topic, partition, broker, is_leader, in_isr, log_end_offset, high_watermark, lag,
        last_caught_up_time_ms."""
        self._check_topic(topic)
        df = self.spark.sql(views.replicas_sql(self.storage))
        return df if topic is None else df.filter(F.col("topic") == topic)

    def serve(self, host: str = "127.0.0.1", port: int = 9092, run_rounds: bool = False,
              round_interval_ms: int = 1000) -> Any:
        """Serves Kafka's protocol for this cluster on host:port (0: a free port) from a thread of
        its own, so that stock Kafka clients produce and consume (pipeline/wire/). `run_rounds`: the
        server runs the rounds too (one every `round_interval_ms`, at once for a produce request);
        otherwise a replication job on the root runs them. Returns the server: `.port`, `.shutdown()`.

        >>> server = cluster.serve(port=9092, run_rounds=True)   # bootstrap.servers=127.0.0.1:9092
        """
        from pipeline.wire.front_door import serve
        if isinstance(round_interval_ms, bool) or not isinstance(round_interval_ms, int) or round_interval_ms < 1:
            raise ReplogError(ErrorCode.INVALID_CONFIG, f"round_interval_ms must be an int >= 1, got {round_interval_ms!r}")
        return serve(self, host, port, run_rounds=run_rounds, round_interval_ms=round_interval_ms)

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
        last = self.core.last_report
        text = last.fetch_sessions if last else None
        return [sessions.Context(**c) for c in json.loads(text)["requests"]] if text else []

    def laggiest_replicas(self, n: int = 10) -> DataFrame:
        """The `n` followers furthest behind: topic, partition, broker, in_isr, lag_records, lag_ms."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        return self.spark.sql(views.lagging_replicas_sql(self.storage)).limit(n)

    # -- reads and consumers -----------------------------------------------------------------
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
        one with UNKNOWN_LEADER_EPOCH, and the reader refreshes its metadata (describe()).

        >>> cluster.read("orders", partition=0, from_offset=10).show()
        """
        return reads.read(self.core, topic, partition, from_offset, replica, isolation, group, auto_offset_reset,
                          leader_epoch)

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
        Returns topic, partition, offset, leader_epoch, timestamp, key, value (pinned).

        >>> new = cluster.read_incremental("billing", "orders")
        """
        fetched = self.fetch_incremental(consumer_id, topic, client_id, user)
        fetched.commit()
        return fetched.records

    def fetch_incremental(self, consumer_id: str, topic: str, client_id: str | None = None,
                          user: str | None = None) -> consumer.Fetched:
        """read_incremental's fetch without moving the consumer's positions yet: the records, the
        ranges read per partition, and `commit()` (pipeline/consume/stream.py records the ranges first).
        Under a consumer_byte_rate quota the fetch's bytes are recorded (this process measures its
        consumers, as each Kafka broker measures its own); over the quota the result carries a
        throttle time, and a fetch while the client still waits serves nothing and moves nothing
        (its records stay for a later fetch)."""
        return consume.fetch_incremental(self.core, consumer_id, topic, client_id, user)

    def fetch_throttle_time_ms(self, consumer_id: str) -> int:
        """The throttle time of `consumer_id`'s last fetch in this process (Kafka's consumer
        metric fetch-throttle-time): 0 within its consumer_byte_rate quota."""
        return self.core.fetch_throttles.get(consumer_id, 0)

    def consumer_fetch_requests(self, consumer_id: str) -> list[sessions.Context]:
        """What each leader made of `consumer_id`'s fetch requests in its last read_incremental
        call in this process (kinds as in fetch_requests)."""
        return list(self.core.consumer_requests.get(consumer_id, []))

    def stream(self, topic: str, consumer_id: str, process: Any, checkpoint: str,
               trigger: Mapping[str, Any] | None = None) -> Any:
        """A Structured Streaming query calling `process(records, batch_id)` with the committed
        records of `topic` that `consumer_id` has not processed, a micro-batch after rounds have
        run; a batch Spark retries reads the same records (pipeline/consume/stream.py).

        >>> query = cluster.stream("orders", "billing", lambda df, batch: df.show(), "/tmp/ckpt")
        """
        from pipeline.consume.stream import committed_stream
        return committed_stream(self, topic, consumer_id, process, checkpoint, dict(trigger) if trigger else None)

    def commit_offsets(self, group: str, offsets: Mapping[tuple[str, int], int], metadata: str | None = None) -> None:
        """Kafka's OffsetCommit: stores, per (topic, partition), the next offset `group` reads, in
        one commit (all or nothing). A later commit of the same partition replaces it.

        >>> cluster.commit_offsets("billing", {("orders", 0): 42})
        """
        consume.commit_offsets(self.core, group, offsets, metadata)

    def committed_offsets(self, group: str) -> DataFrame:
        """Kafka's OffsetFetch: topic, partition, committed_offset, metadata, commit_ms of `group`."""
        return consume.committed_offsets(self.core, group)

    def consumer_lag(self, group: str | None = None) -> DataFrame:
        """kafka-consumer-groups --describe: group_id, topic, partition, current_offset,
        log_end_offset (the HW: the end a consumer can read to) and lag, per committed partition."""
        df = self.spark.sql(views.consumer_lag_sql(self.storage))
        return df if group is None else df.filter(F.col("group_id") == group)

    # -- work beside the rounds --------------------------------------------------------------
    def compact(self) -> cleaner.CleanerReport | None:
        """One pass of the log cleaner over every topic with cleanup.policy `compact` (Kafka's
        log compaction; pipeline/control/cleaner.py has the rules): in each partition that is due (by
        min.cleanable.dirty.ratio or max.compaction.lag.ms), below the high watermark and outside
        min.compaction.lag.ms, every replica loses the records whose key comes again later, and
        tombstones delete.retention.ms after a clean first passed them. Offsets never change. The
        replication job runs it every log.cleaner.backoff.ms; it writes the broker logs, so it takes
        the one-writer lease as a round does, and finishes an interrupted round first. Returns the
        pass's figures (also in replog.metrics); None when no topic is compacted."""
        return housekeeping.compact(self.core)

    def compact_if_due(self) -> cleaner.CleanerReport | None:
        """The replication job's cleaner step, after each round: a compact() pass when
        log.cleaner.enable is on and log.cleaner.backoff.ms (by the cluster clock) has passed since
        the last pass; None otherwise."""
        return housekeeping.compact_if_due(self.core)

    def cleaner_runs(self) -> DataFrame:
        """One row per pass of the log cleaner (see compact())."""
        return self.storage.read("cleaner_runs")

    def maintain(self) -> maintenance.MaintenanceReport:
        """One pass of Delta table maintenance over every cluster table and broker log:
        compaction of small files (`log.maintenance.min.files`), VACUUM within
        `log.maintenance.file.retention.ms`, and the Delta log retention of the tables rounds
        write (`log.maintenance.log.retention.ms`); pipeline/storage/maintenance.py. It rewrites
        files, not rows, so it takes the one-writer lease as a round does and finishes an
        interrupted round first. KAFKA_STORAGE_ERROR when a directory refuses the writes."""
        return housekeeping.maintain(self.core)

    def maintain_if_due(self) -> maintenance.MaintenanceReport | None:
        """The replication job's maintenance step, after each round: a maintain() pass when
        log.maintenance.interval.ms (cluster clock) has passed since the last pass by any job;
        None otherwise. A cluster that never had one starts counting now (recorded, no pass)."""
        return housekeeping.maintain_if_due(self.core)

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Kafka's DeleteRecords: moves the partition's log start offset to `before_offset` (-1: the
        high watermark) at the next round; followers drop the same prefix. Returns the log start
        offset the partition will have. OFFSET_OUT_OF_RANGE above the high watermark.

        >>> cluster.delete_records("orders", 0, before_offset=-1)
        """
        return admin.delete_records(self.core, topic, partition, before_offset)

    # -- brokers: faults and lifecycle -------------------------------------------------------
    def pause_fetcher(self, broker: int) -> None:
        """The broker stays alive but stops fetching (a stuck follower)."""
        brokers.pause_fetcher(self.core, broker)

    def resume_fetcher(self, broker: int) -> None:
        """A paused fetcher fetches again from the next round."""
        brokers.resume_fetcher(self.core, broker)

    def throttle_fetcher(self, broker: int, max_bytes_per_round: int | None) -> None:
        """At most `max_bytes_per_round` bytes per partition per round to this follower (a slow
        follower; at least one record still moves). None lifts the throttle."""
        brokers.throttle_fetcher(self.core, broker, max_bytes_per_round)

    def stop_broker(self, broker: int, log_dir_failure: str | None = None) -> None:
        """A crash: from now on the broker neither heartbeats nor fetches nor answers fetches, and
        its tables stay as they are. Its partitions take no produce requests
        (NOT_LEADER_OR_FOLLOWER) until the controller fences it, broker.session.timeout.ms after its
        last heartbeat (the last round's time), and elects new leaders from the ISR.

        >>> cluster.stop_broker(1)
        """
        brokers.stop_broker(self.core, broker, log_dir_failure)

    def start_broker(self, broker: int) -> None:
        """Restarts a stopped broker. It registers again: the next round ends its old session (it
        leaves every ISR it is not the last member of, and leadership) and unfences it; its replicas
        then fetch, truncate any suffix that diverges from their leader's log by leader epoch, and
        rejoin the ISR once caught up. A broker whose log directory is gone or unreadable restarts
        empty, and stays out of every ISR and of leadership until it has fetched everything back:
        so does one whose location was replaced by an empty one. A location that cannot be written
        is refused (KAFKA_STORAGE_ERROR): the broker stays stopped.

        >>> cluster.start_broker(1)
        """
        brokers.start_broker(self.core, broker)

    def broker_states(self) -> DataFrame:
        """broker, state (running | stopped | fenced | starting), last_heartbeat_ms (a running
        broker's is the newest round's time), fetcher_paused, log_lost, location,
        log_dir_failure."""
        return self.spark.sql(views.brokers_sql(self.storage))

    def add_broker(self, dir: str | None = None) -> int:
        """Registers a new, empty broker (the next id) and returns its id; it hosts nothing until a
        reassignment or a new topic places replicas on it. `dir`: its storage location (as
        `broker_dirs` of create; default `<root>/brokers/<id>`), refused when another broker's
        location is the same, holds it or lies in it, or it holds a log already.

        >>> cluster.add_broker(dir="/mnt/disk3/replog")
        """
        return admin.add_broker(self.core, dir)

    def decommission_broker(self, broker: int) -> dict[tuple[str, int], list[int]]:
        """Moves every replica off `broker` by reassignment, each to the broker (not yet a replica
        of that partition, not being decommissioned) that holds the fewest replicas, and takes no
        new replicas on it. Refused (INVALID_REPLICATION_FACTOR, nothing written) while some
        partition would have nowhere to go: its replication factor would drop. Returns the targets."""
        return admin.decommission_broker(self.core, broker)

    # -- leaders and reassignments (KIP-455; kafka-reassign-partitions) ----------------------
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
        admin.elect_preferred_leaders(self.core, topic, partition)

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
        unknown or decommissioning brokers).

        >>> cluster.reassign_partitions({("orders", 0): [1, 2, 3]})
        """
        admin.reassign_partitions(self.core, assignment)

    def reassignments(self) -> DataFrame:
        """Partitions with a reassignment in progress (kafka-reassign-partitions --verify, Kafka's
        ListPartitionReassignments): topic, partition, replicas, isr, adding, removing, and per
        partition the records and bytes its adding replicas still have to fetch from the leader."""
        return self.spark.sql(views.reassignments_sql(self.storage, self.brokers))

    # -- configs and client quotas (kafka-configs) -------------------------------------------
    def describe_configs(self, entity_type: str, name: str | None = None) -> dict[str, Any]:
        """kafka-configs --describe: a topic's overrides (entity_type 'topics'), the cluster-wide
        broker defaults ('brokers', no name), every key with its value, or a client entity's
        quotas ('users' or 'clients'; name None: the default entity)."""
        return configs.describe_configs(self.core, entity_type, name)

    def alter_configs(self, entity_type: str, name: str | None = None, set: Mapping[str, Any] | None = None,
                      delete: Any = ()) -> dict[str, Any]:
        """kafka-configs --alter (Kafka's IncrementalAlterConfigs: SET and DELETE): a topic's
        overrides (entity_type 'topics', name the topic; a deleted key falls back to the cluster's
        value), or the cluster-wide broker defaults ('brokers', no name: --entity-default; a
        deleted key goes back to Kafka's default). Validated as at creation (INVALID_CONFIG,
        UNKNOWN_TOPIC_OR_PARTITION; nothing written on an error); the next round uses them, in a
        running job too. 'users' and 'clients' (name None: the default entity) set client quotas
        (alter_client_quotas). Returns the entity's config after the change.

        >>> cluster.alter_configs("topics", "orders", set={"retention.ms": 86_400_000})
        """
        return configs.alter_configs(self.core, entity_type, name, set, delete)

    def alter_client_quotas(self, entity: Mapping[str, str | None], set: Mapping[str, Any] | None = None,
                            delete: Any = ()) -> dict[str, int]:
        """Kafka's AlterClientQuotas: sets or deletes `producer_byte_rate` / `consumer_byte_rate`
        (bytes/s) of an entity: {"user": name}, {"client-id": name} or both, a None name being the
        default entity (kafka-configs --entity-default). INVALID_REQUEST names what is wrong and
        writes nothing; the next round (produce) and the next fetch (consume) use them. Returns the
        entity's quotas after the change.

        >>> cluster.alter_client_quotas({"client-id": "loader"}, set={"producer_byte_rate": 1_048_576})
        """
        return configs.alter_client_quotas(self.core, entity, set, delete)

    def describe_client_quotas(self) -> list[dict[str, Any]]:
        """Kafka's DescribeClientQuotas: every entity with quotas, as {"entity": {"user": ...,
        "client-id": ...} (None: the default), "quotas": {key: bytes/s}}."""
        return configs.describe_client_quotas(self.core)
