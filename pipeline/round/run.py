"""The cluster's active round (Cluster.run_round) on its tables: the partition state from the
last round's carry (or from the partitions and replica_state tables), the controller's wave when
one is due (controller.py), client quotas, the active round (active.py), then the commits of what
it changed: the partitions whose ISR changed, then the replica_state rows and the produce results
(the HW and the acks it allows, after the logs) with the rounds row, in one wave."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.control import acks as acks_rules
from pipeline.control import session_cache as sessions
from pipeline.control.acks import STATUS_PENDING
from pipeline.control.fetch_round import RoundContext
from pipeline.control.fetch_session import NO_SESSION, UNKNOWN
from pipeline.control.state import SESSION_ARRAYS
from pipeline.control.producer_state import batches_in_leader_log
from pipeline.round.active import Laps, RoundTables, run_active_round
from pipeline.round.client_quotas import apply_client_quotas, deferred_requests, with_throttle_time
from pipeline.round.control_job import partition_state_from_tables, produce_results, producer_checks
from pipeline.round.figures import broker_gauges_json
from pipeline.round.controller import ControllerWave, controller_requests_asked, controller_wave, unvalidated_brokers
from pipeline.round.inputs import (CARRIED_TABLES, REQUEST_KEY, RoundInputs, RoundReport,
                                   rows_changed, session_figures, table_versions, with_input_versions)
from pipeline.round.reads import log_start_requests, partition_meta, pending_results, read_inbox, serving_brokers
from pipeline.schemas import (NO_LEADER, PARTITION_KEY, PARTITIONS_SCHEMA, REPLICA_STATE_SCHEMA, RESULTS_SCHEMA,
                              ROUNDS_SCHEMA)
from pipeline.runtime import compiled_expressions
from pipeline.storage import Storage, added_rows, all_null, is_concurrent_conflict

__all__ = ["Carry", "run_round"]


# replica_state is compacted once the rows superseded since its last compaction are at least
# STATE_COMPACTION_RATIO times the current ones, and at least STATE_COMPACTION_MIN_ROWS (so the
# amortized cost per round follows the rows a round writes; see Storage.replica_state). A readers'
# query of the current rows reads at most (1 + ratio) times them; at 3 the rounds of a busy large
# cluster compact a third as often as at 1 (docs/benchmarks.md, "replica_state's compaction").
STATE_COMPACTION_MIN_ROWS = 10_000
STATE_COMPACTION_RATIO = 3

# a bulk round: at least this many new inbox rows, or this many records replicated in the round
# before (followers catching up): its Spark steps run with compiled expressions (the session
# interprets them, which is faster for a round's usual few rows)
BULK_ROWS = 100_000


@dataclass(frozen=True)
class Carry:
    """What a v2 round leaves to the next round of the same process: the partition state and the
    pending requests after it (pinned), and the versions of round.CARRIED_TABLES they equal (the
    next round uses them only while nobody else wrote those tables)."""

    versions: tuple[int | None, ...]  # None: another writer committed to that table during the round
    state: DataFrame
    pending: DataFrame  # results rows still pending (without round_id)
    lagging_leaders: set[int]  # leaders with a follower behind their LEO after the round
    state_table_rows: int  # rows in the replica_state table (the superseded ones too)
    topic_checks: DataFrame  # each topic's checks, round_v2._TOPIC_CHECKS (pinned)
    # brokers with a follower that has not validated its leader's epoch (controller_wave.py): it
    # checks, and may truncate, in the first round it fetches in
    unvalidated: frozenset[int] = frozenset()
    # produce requests waiting for their client's quota (round.QuotaStep.deferred), None: none
    deferred: DataFrame | None = None
    # the round expanded an ISR: a reassignment in progress may complete (controller_wave.py)
    isr_expanded: bool = False


def _new_inbox_stats(storage: Storage, inputs: RoundInputs) -> list[dict] | None:
    """The statistics of the files the round's new inbox commits added (Storage.added_file_stats,
    read once for the probes below; no Spark job): [] with no new commit, None when unknown."""
    if inputs.inbox_to_version <= inputs.last_inbox_version:
        return []
    return storage.added_file_stats("inbox", inputs.last_inbox_version, inputs.inbox_to_version)


def _has_idempotent_rows(storage: Storage, inputs: RoundInputs, inbox_stats: list[dict] | None) -> bool:
    """Whether the round's new inbox rows hold an idempotent producer's: from the statistics of
    their files (`_new_inbox_stats`), else a Spark job stopping at the first row."""
    plain = all_null(inbox_stats, "producer_id")
    if plain is None:  # (no statistics: the rows tell)
        inbox = storage.read_changes("inbox", inputs.last_inbox_version, inputs.inbox_to_version)
        plain = not inbox.filter(F.col("producer_id").isNotNull()).limit(1).count()
    return not plain


def is_bulk(inputs: RoundInputs, inbox_stats: list[dict] | None) -> bool:
    """Whether the round is a bulk one (BULK_ROWS): many new inbox rows (from their files'
    statistics, `_new_inbox_stats`; without statistics, not bulk) or many records replicated by
    the round before."""
    if inputs.last_records_replicated >= BULK_ROWS:
        return True
    added = added_rows(inbox_stats)
    return added is not None and added >= BULK_ROWS


def _sequences(storage: Storage, inputs: RoundInputs, inbox: DataFrame, state: DataFrame, topic_checks: DataFrame,
               down: set[int]) -> DataFrame:
    """The sequence checks of the round's idempotent batches (control_job.producer_checks), pinned,
    against the batches the producers table holds that are still in their leader's log (the
    serving leaders' logs, read at the batches' last offsets)."""
    logs = reduce(DataFrame.unionByName, [storage.read_log(b).withColumn("broker", F.lit(b))
                                          for b in serving_brokers(inputs)])
    stored = batches_in_leader_log(storage.read("producers"), _serving_leaders(state, down), logs)
    return producer_checks(inbox, state, topic_checks, stored.drop("round_id")).localCheckpoint()


# what a round checks per topic (its effective config): records, and retention when it is due
_TOPIC_CHECKS = ("topic", "message_max_bytes", "compact", "retention_ms", "retention_bytes",
                 "leader_throttled_replicas", "follower_throttled_replicas")


def _retention_leaders(storage: Storage, inputs: RoundInputs, state: DataFrame, topic_checks: DataFrame,
                       down: set[int]) -> DataFrame | None:
    """The serving leaders of partitions under a retention limit, with their log's offsets
    (round.log_start_requests's `leaders`); None when retention can delete nothing: no topic has a
    limit, or only time limits (retention.ms) and no serving log holds a record older than the
    latest of their cutoffs (now - retention.ms), known from the logs' file statistics on
    `timestamp` (a Spark job with no file to read, where the whole check read every log)."""
    limited = topic_checks.filter((F.col("retention_ms") >= 0) | (F.col("retention_bytes") >= 0))
    limits = limited.select("retention_ms", "retention_bytes").distinct().collect()  # (O(topics))
    if not limits:
        return None
    if all(r["retention_bytes"] < 0 for r in limits):
        cutoff = inputs.now_ms - min(r["retention_ms"] for r in limits)
        logs = [storage.read_log(b).select("timestamp") for b in serving_brokers(inputs)]
        if not reduce(DataFrame.unionByName, logs).filter(F.col("timestamp") < cutoff).limit(1).count():
            return None
    return _serving_leaders(state, down).join(
        F.broadcast(limited.select("topic", "retention_ms", "retention_bytes")), on="topic")


def _serving_leaders(state: DataFrame, down: set[int]) -> DataFrame:
    """Each partition's leader that is not down (its log may be read), with its log's offsets:
    broker, topic, partition, log_start_offset, log_end_offset."""
    at = F.array_position(F.col("replicas"), F.col("leader")).cast("int")
    return (state.filter((F.col("leader") != NO_LEADER) & ~F.col("leader").isin(*sorted(down)))
            .select(F.col("leader").alias("broker"), *PARTITION_KEY,
                    F.element_at("log_start_offset", at).alias("log_start_offset"),
                    F.element_at("log_end_offset", at).alias("log_end_offset")))


def _topic_config(meta: DataFrame) -> DataFrame:
    """Each partition with its topic's effective min ISR, lag and checks (_TOPIC_CHECKS), of the
    partitions with their topic's settings (round._partition_meta)."""
    return meta.select(*PARTITION_KEY, "leader", "leader_epoch", "leader_epoch_start_offset", "partition_epoch",
                       "replicas", "isr", "adding_replicas", "min_isr", "lag_time_max_ms", *_TOPIC_CHECKS[1:])


def _replica_state_rows(rows: DataFrame) -> DataFrame:
    """replica_state rows of the partition rows `rows` (with round_id), one per replica: the
    leader's high watermark is the partition's."""
    at = F.col("_i") + 1
    arrays = {"log_start_offset": "log_start_offset", "log_end_offset": "log_end_offset",
              "fetch_offset": "fetch_offset", "last_fetch_time_ms": "last_fetch_time_ms",
              "last_fetch_leader_leo": "last_fetch_leader_leo", "last_caught_up_time_ms": "last_caught_up_time_ms",
              "last_data_round": "last_data_round"}
    exploded = rows.select("*", F.posexplode("replicas").alias("_i", "broker"))
    columns = {
        "topic": F.col("topic"), "partition": F.col("partition"), "broker": F.col("broker"),
        **{name: F.element_at(F.col(array), at) for name, array in arrays.items()},
        "high_watermark": F.when(F.col("broker") == F.col("leader"), F.col("high_watermark"))
        .otherwise(F.element_at(F.col("replica_high_watermark"), at)),
        **{name: F.when(F.col("broker") == F.col("leader"), F.lit(none)).otherwise(F.element_at(F.col(name), at))
           for name, none in zip(SESSION_ARRAYS, (NO_SESSION, 0, UNKNOWN, UNKNOWN))},  # (a leader is in no session)
        "validated_leader_epoch": F.when(F.col("broker") == F.col("leader"), F.col("leader_epoch"))
        .otherwise(F.element_at(F.col("validated_leader_epoch"), at)), "round_id": F.col("round_id")}
    return exploded.select(*[columns[f.name].cast(f.dataType).alias(f.name) for f in REPLICA_STATE_SCHEMA.fields])


def _log_starts_of(rows: DataFrame, broker: int) -> DataFrame:
    """topic, partition, log_start_offset of `broker`'s replicas in the partition rows the round
    changed (a replica whose log start did not move drops nothing)."""
    replica = F.array_position(F.col("replicas"), F.lit(broker)).cast("int")
    return (rows.filter(F.col("is_changed") & F.col("is_known") & F.array_contains("replicas", broker))
            .select(*PARTITION_KEY, F.element_at("log_start_offset", replica).alias("log_start_offset"))
            .filter(F.col("log_start_offset") > 0))


# what a round's ISR change writes of a partitions row: not its reassignment (the controller's)
_ISR_COLUMNS = [f.name for f in PARTITIONS_SCHEMA.fields if f.name not in ("adding_replicas", "removing_replicas")]


def _partition_rows(rows: DataFrame) -> DataFrame:
    """partitions rows (the controller's metadata) of the partition rows `rows` (with round_id),
    without their reassignment: the round writes them with _ISR_COLUMNS only."""
    none = F.array().cast("array<int>")
    return rows.select(*[(none.alias(f.name) if f.name in ("adding_replicas", "removing_replicas")
                          else F.col(f.name).cast(f.dataType).alias(f.name)) for f in PARTITIONS_SCHEMA.fields])


def _fetch_contexts(inputs: RoundInputs) -> tuple[tuple[int, int, str, int], ...]:
    """RoundContext.fetch_contexts of the round's planned fetch sessions."""
    return tuple((int(c.fetcher[len(sessions.REPLICA_FETCHER_PREFIX):]), c.leader, c.kind, c.session_id)
                 for c in inputs.contexts)


def _last_fetches(inputs: RoundInputs) -> tuple[tuple[int, int], ...]:
    """(broker, its last fetch before the round): when its fetcher was paused, else the last round."""
    last = {b: inputs.paused_brokers.get(b) if b in inputs.paused_brokers else inputs.previous_round_ms
            for b in inputs.brokers}
    return tuple((b, int(ms)) for b, ms in sorted(last.items()) if ms is not None)


def run_round(spark: SparkSession, storage: Storage, inputs: RoundInputs, carry: Carry | None
              ) -> tuple[RoundReport, Carry]:
    """One round of the cluster by round v2 on today's tables: the partition state from the carry
    (or from the partitions and replica_state tables), the control job, the records written once
    per broker, then the partitions whose ISR changed, and the replica_state rows and the results
    the round changed (the HW and the acks it allows, after the logs) with the rounds row."""
    round_ = _RoundOnTables(spark, storage, inputs, carry)
    round_.controller()
    round_.partition_state()
    round_.requests()
    return round_.run()


class _RoundOnTables:
    """run_round's steps, in order; each leaves what the next reads."""

    def __init__(self, spark: SparkSession, storage: Storage, inputs: RoundInputs, carry: Carry | None) -> None:
        self.spark, self.storage = spark, storage
        self.started = time.perf_counter()
        self.lap = Laps()
        self.inputs = inputs = with_input_versions(storage, inputs)
        self.config = config = inputs.cluster_config
        self.seen = table_versions(storage)
        # (commits that changed no row, a maintenance pass's, keep the carry: inputs.rows_changed; a
        # version None: another writer committed during the last round)
        if carry is not None and (None in carry.versions or rows_changed(storage, carry.versions, self.seen)):
            carry = None
        self.carry = carry
        self.fetchers = int(config["num.replica.fetchers"])
        down = self.down = set((inputs.controller or {}).get("down") or [])
        self.ctx = RoundContext(
            round_id=inputs.round_id, now_ms=inputs.now_ms,
            fetching_brokers=tuple(b for b in inputs.brokers if b not in down and b not in inputs.paused_brokers),
            ineligible_brokers=tuple(sorted(down)),
            partition_max_bytes=int(config["replica.fetch.max.bytes"]),
            fetcher_max_bytes=tuple((b, int(v)) for b, v in sorted(inputs.throttles.items()) if v),
            response_max_bytes=int(config["replica.fetch.response.max.bytes"]),
            restarted=inputs.restarted, paused_brokers=tuple(sorted(inputs.paused_brokers)),
            broker_last_fetch_ms=_last_fetches(inputs), fetch_contexts=_fetch_contexts(inputs),
            **_replication_budgets(inputs))

    def controller(self) -> None:
        """The controller's wave when one is due; its new leaders' sessions replace the round's."""
        self.wave, self.unvalidated = _controller_wave_if_due(self.spark, self.storage, self.inputs, self.carry,
                                                              self.ctx)
        wave = self.wave
        if wave is not None and wave.inputs is not None and wave.inputs is not self.inputs:  # (new leaders' sessions)
            self.inputs = wave.inputs
            self.ctx = replace(self.ctx, fetch_contexts=_fetch_contexts(self.inputs))
        self.lap("controller wave" if wave is not None else "controller check")
        if wave is not None:  # (its commits are the round's own: the versions after them are the ones read)
            self.carry, self.seen = None, table_versions(self.storage)

    def partition_state(self) -> None:
        """The partition state and the pending requests: carried, or read from the tables."""
        storage, carry, wave = self.storage, self.carry, self.wave
        if carry is not None:
            self.state, self.pending, self.state_table_rows = carry.state, carry.pending, carry.state_table_rows
            self.topic_checks = carry.topic_checks
        else:
            self.state_table_rows = storage.read("replica_state").count()  # (before this round appends to it)
            topics = _topic_config(partition_meta(storage, self.config) if wave is None else wave.meta)
            self.state = partition_state_from_tables(
                topics, storage.replica_state() if wave is None else wave.replica_rows, self.fetchers)
            self.pending = pending_results(storage, self.inputs.last_pending_requests).localCheckpoint()
            self.topic_checks = topics.select(*_TOPIC_CHECKS).distinct().localCheckpoint()
            self.unvalidated = wave.unvalidated if wave is not None else self.unvalidated
        self.failed = None
        if wave is not None and wave.new_leaders is not None:  # (acks.fail_on_leader_change)
            self.failed = acks_rules.fail_on_leader_change(self.pending, wave.new_leaders).localCheckpoint()
            self.pending = self.pending.join(self.failed.select(*REQUEST_KEY), on=REQUEST_KEY,
                                             how="left_anti").localCheckpoint()
        self.lap("read state" if carry is None else "carried state")

    def requests(self) -> None:
        """The round's new produce requests within the client quotas, their producers' sequences,
        and the log start offsets asked (delete_records, retention)."""
        spark, storage, inputs, carry = self.spark, self.storage, self.inputs, self.carry
        inbox, self.inbox_version = read_inbox(spark, storage, inputs.last_inbox_version, inputs.inbox_to_version)
        # client quotas (KIP-13's producer_byte_rate): the requests served this round, of the new ones
        # and those that waited (client_quotas.py; no Spark job without a new or a waiting request, or a quota)
        deferred = carry.deferred if carry is not None else deferred_requests(storage, inputs.last_throttled_requests)
        self.inbox_stats = _new_inbox_stats(storage, inputs)
        self.inbox, self.quota = apply_client_quotas(spark, inbox, deferred, inputs, added_rows(self.inbox_stats))
        self.lap("inbox and client quotas")
        idempotent = _has_idempotent_rows(storage, inputs, self.inbox_stats) or (
            deferred is not None and bool(self.inbox.filter(F.col("producer_id").isNotNull()).limit(1).count()))
        self.sequences = _sequences(storage, inputs, self.inbox, self.state, self.topic_checks, self.down) \
            if idempotent else None
        self.lap("producer sequences")
        retention = _retention_leaders(storage, inputs, self.state, self.topic_checks, self.down) \
            if inputs.retention_due else None
        self.log_starts, self.admin_version = log_start_requests(storage, inputs, retention)
        self.lap("log start requests")

    def run(self) -> tuple[RoundReport, Carry]:
        """The active round (active.py) and its commits, the compaction of replica_state when due,
        and the carry for the next round."""
        storage, inputs = self.storage, self.inputs
        self.reports: list[RoundReport] = []
        tables = RoundTables(logs={b: storage.log_path(b) for b in inputs.brokers}, producers=storage.path("producers"))
        state = _with_throttle_listing(self.state, self.topic_checks) if self.ctx.throttled else self.state
        with compiled_expressions(self.spark, when=is_bulk(inputs, self.inbox_stats)):
            active = run_active_round(state, self.inbox, self.pending, self.ctx, self.fetchers, tables,
                                      lambda appends: storage.append_all(appends, inputs.round_id),
                                      commit_outputs=self._commit_outputs, topic_checks=self.topic_checks,
                                      lagging_leaders=self.carry.lagging_leaders if self.carry is not None else None,
                                      sequences=self.sequences, log_starts=self.log_starts, laps=self.lap)
        figures = active.figures
        table_rows = self.state_table_rows + figures["changed_replicas"]
        # (the carried state is the tables' rows at the versions of the round's own commits after the
        # ones it read; an append of no rows is no commit)
        seen = self.seen
        at = storage.version_of_own_commits("replica_state", seen[CARRIED_TABLES.index("replica_state")],
                                            inputs.round_id)
        if _compact_state(storage, active.state, figures["replicas"], table_rows, inputs.round_id,
                          -1 if at is None else at):
            table_rows = figures["replicas"]
        self.lap("compact replica_state")
        versions = tuple(storage.version_of_own_commits(table, v, inputs.round_id)
                         for table, v in zip(CARRIED_TABLES, seen))
        # (the rounds row holds the round's time until its last commit wave, which writes the row; the
        # report returned holds all of it)
        report = replace(self.reports[0], duration_ms=self._elapsed_ms(), phases=self.lap.phases)
        return report, Carry(versions, active.state, active.pending, set(figures["lagging_leaders"]), table_rows,
                             self.topic_checks, self.unvalidated, self.quota.deferred, bool(figures["isr_expands"]))

    def _elapsed_ms(self) -> int:
        return int((time.perf_counter() - self.started) * 1000)

    def _report(self, figures: dict) -> RoundReport:
        inputs, wave = self.inputs, self.wave
        added = figures["session_partitions_added"]
        # (KIP-227: an incremental request adds partitions new to its session, and forgets those whose
        # replica a reassignment took off the follower)
        removed = wave.sessions_removed if wave is not None else {}
        incremental = {c.session_id for c in inputs.contexts if c.kind == "incremental"}
        after = [replace(s, size=s.size + added.get(s.session_id, 0)
                         - (removed.get(s.session_id, 0) if s.session_id in incremental else 0))
                 for s in inputs.sessions_after]
        after, handles = sessions.follow_up(after, inputs.handles_after, figures["followed_up_sessions"])
        return RoundReport(
            round_id=inputs.round_id, now_ms=inputs.now_ms, inbox_version=self.inbox_version,
            admin_version=self.admin_version,
            retention_checked_ms=inputs.now_ms if inputs.retention_due else inputs.last_retention_check_ms,
            fetch_request_partitions=figures["fetch_request_partitions"],
            fetch_response_partitions=figures["fetch_response_partitions"],
            active_partitions=figures["unsettled"],
            **{name: int(figures[name]) for name in (
                "records_appended", "records_replicated", "requests_acked", "requests_failed", "isr_shrinks",
                "isr_expands", "under_replicated_partitions", "under_min_isr_partitions", "at_min_isr_partitions",
                "offline_partitions", "max_lag", "pending_requests", "hw_advances")},
            duration_ms=self._elapsed_ms(), batch_id=inputs.batch_id,
            **session_figures(inputs, after, handles), throttled_requests=self.quota.waiting,
            broker_gauges=broker_gauges_json(figures["broker_gauges"], figures["broker_max_lag"], inputs.brokers),
            client_quota_bytes=self.quota.recorded, throttled_bytes=figures["throttled_bytes"],
            phases=dict(self.lap.phases))

    def _results(self, rows: DataFrame) -> DataFrame:
        """The results rows the round writes: the settled ones, the new pending ones (a pending one
        carried from before is written already), those a leader change failed."""
        results = produce_results(rows)
        carried = self.pending.select(*REQUEST_KEY)
        written = results.filter(F.col("status") != STATUS_PENDING).unionByName(
            results.filter(F.col("status") == STATUS_PENDING).join(carried, on=REQUEST_KEY, how="left_anti"))
        if self.failed is not None:
            written = written.unionByName(self.failed.withColumn("round_id", F.lit(self.inputs.round_id).cast("long"))
                                          .select(*written.columns))
        return written

    def _commit_outputs(self, rows: DataFrame, figures: dict) -> None:
        """The round's commits after its logs: the partitions whose ISR changed, the log start
        offsets moved, then the last wave (the replica_state rows, the results, the rounds row)."""
        storage, round_id, wave, quota = self.storage, self.inputs.round_id, self.wave, self.quota
        if figures["isr_changes"]:  # the ISR before the HW it allows (DESIGN.md: persisted before they take effect)
            storage.upsert(_partition_rows(rows.filter((F.col("isr_shrinks") + F.col("isr_expands") > 0)
                                                       & F.col("is_known"))), "partitions", PARTITION_KEY, round_id,
                           columns=_ISR_COLUMNS)
        written = self._results(rows)
        answers = []
        changed = rows.filter(F.col("is_changed") & F.col("is_known"))
        if wave is not None:  # the partitions whose replica rows the controller's wave changed, too
            changed = changed.unionByName(rows.filter(~F.col("is_changed") & F.col("is_known"))
                                          .join(F.broadcast(wave.touched), on=PARTITION_KEY, how="left_semi"))
        if figures["changed"] or wave is not None:
            answers.append((_replica_state_rows(changed), "replica_state"))
        if figures["results"] or self.failed is not None or quota.waiting_results is not None:
            written = with_throttle_time(written, quota.held).select(*RESULTS_SCHEMA.fieldNames())
            if quota.waiting_results is not None:  # (a request waiting for its quota has no throttle time yet)
                written = written.unionByName(quota.waiting_results.select(*RESULTS_SCHEMA.fieldNames()))
            answers.append((written, "results"))
        for broker in sorted(figures["log_start_brokers"]):  # (after the logs; the round's row comes last)
            storage.delete_log_prefixes(broker, _log_starts_of(rows, broker), round_id)
        # the last wave: the HW and ISR's rows, the results and the round's row at once; the row's
        # commit names the others, and the round is complete when they all landed (storage/recovery.py)
        self.reports.append(self._report(figures))
        storage.commit_round_row(self.spark.createDataFrame([tuple(self.reports[0].as_dict().values())],
                                                            ROUNDS_SCHEMA), answers, round_id)


def _replication_budgets(inputs: RoundInputs) -> dict[str, tuple[tuple[int, int], ...]]:
    """RoundContext's leader_budgets and follower_budgets of the round's KIP-73 budgets."""
    return {f"{side}_budgets": tuple(sorted((broker, int(n)) for (s, broker), n in inputs.throttle_budgets.items()
                                            if s == side)) for side in ("leader", "follower")}


def _with_throttle_listing(state: DataFrame, topic_checks: DataFrame) -> DataFrame:
    """The partition state with each replica's replication throttles (KIP-73): whether its
    topic's `leader.replication.throttled.replicas` and `follower.replication.throttled.replicas`
    name it (`*`, or `partition:broker` in a comma-separated list)."""
    lists = topic_checks.select("topic", "leader_throttled_replicas", "follower_throttled_replicas")

    def listed(column: str) -> Column:
        return F.transform("replicas", lambda broker: F.coalesce(
            (F.col(column) == "*") | F.array_contains(F.split(F.col(column), ","), F.concat_ws(
                ":", F.col("partition").cast("string"), broker.cast("string"))), F.lit(False)))
    return (state.join(F.broadcast(lists), on="topic", how="left")
            .withColumns({"leader_throttle_listed": listed("leader_throttled_replicas"),
                          "follower_throttle_listed": listed("follower_throttled_replicas")})
            .drop("leader_throttled_replicas", "follower_throttled_replicas"))


def _controller_wave_if_due(spark: SparkSession, storage: Storage, inputs: RoundInputs, carry: Carry | None,
                            ctx: RoundContext) -> tuple[ControllerWave | None, frozenset[int]]:
    """The controller's wave (controller_wave.py) when the round has one: a broker to fence or
    unfence, a preferred leader election or a reassignment asked, a reassignment in progress that
    may complete (the last round expanded an ISR), or a follower fetching this round that has not
    validated its leader's epoch. Also the brokers with such followers before the round (from the
    carry, else one Spark job)."""
    decisions = inputs.controller or {}
    if decisions.get("fence") or decisions.get("unfence") or controller_requests_asked(storage, inputs) \
            or (inputs.reassigning and (carry is None or carry.isr_expanded)):
        return controller_wave(spark, storage, inputs), frozenset()
    unvalidated = carry.unvalidated if carry is not None else \
        unvalidated_brokers(storage.replica_state(), storage.read("partitions"))
    if set(unvalidated) & set(ctx.fetching_brokers):
        return controller_wave(spark, storage, inputs), unvalidated
    return None, unvalidated


def _compact_state(storage: Storage, state: DataFrame, current_rows: int, table_rows: int, round_id: int,
                   version: int) -> bool:
    """replica_state compacted to its current rows when the rows superseded since its last
    compaction are at least STATE_COMPACTION_RATIO times the current ones and at least
    STATE_COMPACTION_MIN_ROWS: the rows of the partition state after the round, written instead of
    read again while the table is at `version` (this round's commits on the version it read);
    whether a compaction was committed."""
    if table_rows - current_rows < max(STATE_COMPACTION_RATIO * current_rows, STATE_COMPACTION_MIN_ROWS):
        return False
    rows = _replica_state_rows(state.withColumn("round_id", F.lit(round_id).cast("long")))
    try:
        return storage.compact_replica_state(round_id, rows, version)
    except Exception as e:  # another writer appended meanwhile: a later round compacts
        if not is_concurrent_conflict(e):
            raise
        return False
