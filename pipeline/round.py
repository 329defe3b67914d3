"""Orchestration: one fetch round (DESIGN.md "One round, in order"), the function the streaming
job's foreachBatch calls. Pins its inputs once, applies the rules, commits O(brokers) times. Unlike
DESIGN.md's round, a follower that received records fetches again in the same round
(_follow_up_fetch), so the HW moves over what the round appended, and that fetch's response
carries the records the first had no room for (_follow_up_response; README, "The API").

Every step's output is pinned with an eager localCheckpoint, not cache(): a cached DataFrame keeps
its whole lineage, so each later step re-analyses and re-plans every earlier one and the round's
last query carries the plan of all of them (measured with jobs/profile_round.py: an active round
went from ~16 s to ~10 s on 2 cores). The checkpoint blocks are freed when the DataFrames are.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from functools import reduce
from typing import Any, Callable

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StringType

from pipeline import acks as acks_rules
from pipeline.carry import Keyed, pinned, pinned_without_history
from pipeline import controller as ctl
from pipeline import fetch_session as sessions
from pipeline import isr as isr_rules
from pipeline import log_start
from pipeline import producer_state
from pipeline import quotas
from pipeline import replication as rules
from pipeline.schemas import (ELECTIONS_SCHEMA, LOG_SCHEMA, NO_LEADER, PARTITION_KEY, PARTITIONS_SCHEMA,
                              PRODUCERS_SCHEMA, REPLICA_KEY,
                              REPLICA_STATE_SCHEMA, RESULTS_SCHEMA, ROUNDS_SCHEMA)
from pipeline.spark import (BROADCAST_SMALL_SIDES, COMPILED_EXPRESSIONS, apply_settings, per_partition_step,
                            settings_restored, small_side)
from pipeline.storage import Storage, current_rows, is_concurrent_conflict

__all__ = ["RoundReport", "RoundInputs", "Carry", "CARRIED_TABLES", "run_round", "idle_round", "last_round_phases"]

_PHASES: dict[str, float] = {}
_JOBS: dict[str, int] = {}


def last_round_phases() -> dict[str, float]:
    """Seconds the last round spent in each phase on the driver (for jobs/profile_round.py)."""
    return dict(_PHASES)


def last_round_jobs() -> dict[str, int]:
    """Spark jobs the last round ran in each phase (for jobs/profile_round.py)."""
    return dict(_JOBS)


class _Stopwatch:
    """Times the round's phases; each phase's Spark jobs run in a job group of their own, so
    they can be counted afterwards from the status tracker."""

    def __init__(self, spark: SparkSession) -> None:
        _PHASES.clear()
        _JOBS.clear()
        self.sc = spark.sparkContext
        self.group = f"replog-round-{time.perf_counter_ns()}"
        self.n = 0
        self.sc.setJobGroup(f"{self.group}-0", "replog round", False)
        self.mark = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        _PHASES[phase] = _PHASES.get(phase, 0.0) + now - self.mark
        jobs = len(self.sc.statusTracker().getJobIdsForGroup(f"{self.group}-{self.n}"))
        _JOBS[phase] = _JOBS.get(phase, 0) + jobs
        self.n += 1
        self.sc.setJobGroup(f"{self.group}-{self.n}", "replog round", False)
        self.mark = time.perf_counter()

    def stop(self) -> None:
        self.sc.setLocalProperty("spark.jobGroup.id", None)
        self.sc.setLocalProperty("spark.job.description", None)


REQUEST_KEY = ["request_id", "topic", "partition"]
_FETCH_KINDS = ("full", "sessionless", "incremental")  # contexts that serve data (not "error")


@dataclass(frozen=True)
class RoundReport:
    """What one round did (also one row of `replog.rounds`)."""

    round_id: int
    now_ms: int
    inbox_version: int
    fetch_request_partitions: int
    fetch_response_partitions: int
    records_appended: int
    records_replicated: int
    requests_acked: int
    requests_failed: int
    isr_shrinks: int
    isr_expands: int
    under_replicated_partitions: int
    under_min_isr_partitions: int
    at_min_isr_partitions: int
    offline_partitions: int
    max_lag: int
    active_partitions: int
    pending_requests: int
    admin_version: int
    retention_checked_ms: int
    duration_ms: int
    batch_id: int | None = None
    incremental_fetch_sessions: int = 0  # Kafka's NumIncrementalFetchSessions (all leaders)
    incremental_fetch_partitions_cached: int = 0  # NumIncrementalFetchPartitionsCached
    fetch_session_evictions: int = 0  # this round's; IncrementalFetchSessionEvictionsPerSec in metrics
    fetch_sessions: str | None = None  # JSON: every leader's session cache and fetcher's handle after it
    throttled_requests: int | None = 0  # produce requests left waiting for their client's quota
    # ("leader" | "follower", broker) -> bytes moved for throttled replicas (KIP-73); not a column
    throttled_bytes: dict = field(default_factory=dict, compare=False)
    # a produce quota's sensor key -> (bytes of the requests it let through, quota); not a column
    client_quota_bytes: dict = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row.pop("throttled_bytes")
        row.pop("client_quota_bytes")
        return row


@dataclass(frozen=True)
class RoundInputs:
    """What the driver knows before a round: O(brokers) values, never per-partition data."""

    round_id: int
    now_ms: int
    last_inbox_version: int
    cluster_config: dict[str, Any]
    brokers: list[int]
    paused_brokers: dict[int, int | None]  # broker -> its last fetch time before the pause
    throttles: dict[int, int]  # broker -> max bytes per partition per round
    previous_round_ms: int | None
    last_admin_version: int = 0
    retention_due: bool = False
    last_retention_check_ms: int = 0
    last_pending_requests: int | None = None  # None: unknown, read the results table
    last_records_replicated: int = 0  # by the last round: followers far behind make a bulk round
    batch_id: int | None = None  # the streaming job's micro-batch, recorded in the rounds row
    # KIP-227: what each leader made of each follower's fetch request this round, and the caches and
    # handles after them (see fetch_session.round_contexts)
    contexts: list = field(default_factory=list)
    sessions_after: list = field(default_factory=list)
    handles_after: list = field(default_factory=list)
    session_evictions: int = 0
    # the first round of a process that opened an existing cluster: its brokers (re)start
    restarted: bool = False
    # the controller's decisions (Cluster._controller_inputs): fence, unfence, live_before_start,
    # live, lost_log, down (brokers stopped or fenced before this round)
    controller: dict | None = None
    # the inbox and admin versions the round reads up to (None: the newest; a replayed round reads
    # what it read the first time, see recovery.py)
    inbox_to_version: int | None = None
    admin_to_version: int | None = None
    # a partition has a reassignment in progress (KIP-455): the controller checks for completions
    reassigning: bool = False
    # KIP-73 replication quotas: ("leader" | "follower", broker) -> bytes that broker may still move
    # for throttled replicas this round (absent: unlimited); see Cluster._throttle_budgets
    throttle_budgets: dict = field(default_factory=dict)
    # client quotas (pipeline/quotas.py): (user, client_id) pairs -> their produce quota's sensor
    # rows (Cluster._quota_sensors; None: no producer_byte_rate is configured), and the requests
    # the last round left waiting (None: unknown, 0: none)
    quota_sensors: Callable[[list[tuple]], list[tuple]] | None = None
    last_throttled_requests: int | None = None


def with_input_versions(storage: Storage, inputs: RoundInputs) -> RoundInputs:
    """`inputs` with the inbox and admin versions it reads fixed, once, and the round's commits
    tagged with them (storage.commit_tag), so an interrupted round can be replayed as it ran."""
    inbox = inputs.inbox_to_version if inputs.inbox_to_version is not None else storage.version("inbox")
    admin = inputs.admin_to_version if inputs.admin_to_version is not None else storage.version("admin")
    inputs = replace(inputs, inbox_to_version=max(inbox, inputs.last_inbox_version),
                     admin_to_version=max(admin, inputs.last_admin_version))
    storage.round_inputs = (f"now={inputs.now_ms};inbox={inputs.inbox_to_version};"
                            f"admin={inputs.admin_to_version};restarted={int(inputs.restarted)}")
    return inputs


# the tables whose content a round carries over to the next round of the same process
CARRIED_TABLES = ("replica_state", "partitions", "topics", "results")


@dataclass(frozen=True)
class Carry:
    """What a round leaves to the next round of the same process instead of re-reading the tables
    it has just written (pipeline/carry.py): the partition metadata, the replica state and the
    pending produce requests after it, pinned, and the versions of CARRIED_TABLES they equal. The
    next round uses them only when those tables are still at exactly these versions (nobody else
    wrote them)."""

    versions: tuple[int, ...]
    meta_rows: Keyed  # partitions joined with their topic's effective config
    state_rows: Keyed  # replica_state's current rows (without round_id)
    pending: DataFrame  # results rows still pending (without round_id)
    # topic, partition: every partition the last round left with something to do (see
    # _attention); the next round's working set starts from it
    attention: DataFrame
    gauges: dict[str, int]  # the partition counts after the last round
    throttles: dict[int, int]  # the fetch limits the sessions cached
    state_table_rows: int  # rows in the replica_state table (the superseded ones too)
    # produce requests waiting for their client's quota: their inbox rows and `_deferred_since`
    deferred: DataFrame | None = None

    @property
    def meta(self) -> DataFrame:
        return self.meta_rows.all()

    @property
    def state(self) -> DataFrame:
        return self.state_rows.all()


# replica_state is compacted once the rows superseded since its last compaction are at least as
# many as the current ones, and at least this many (so the amortized cost per round follows the
# rows a round writes; see Storage.replica_state)
STATE_COMPACTION_MIN_ROWS = 10_000


def _compact_state_if_due(storage: Storage, current_rows: int, table_rows: int, round_id: int,
                          state: Keyed, version: int) -> tuple[int, bool]:
    """Compacts replica_state when STATE_COMPACTION_MIN_ROWS says so: the table's rows after, and
    whether it committed a compaction (a table that holds only current rows may not have).

    `state`: the current rows after this round, which it carries; when the table is at `version`
    (this round's own commits on the version it read, nobody else's), they are what the table's
    current rows are, and the compaction writes them instead of reading the table again (a
    compacted row's round_id is then the compacting round's)."""
    if table_rows - current_rows < max(current_rows, STATE_COMPACTION_MIN_ROWS):
        return table_rows, False
    rows = state.all().withColumn("round_id", F.lit(round_id).cast("long"))
    try:
        compacted = storage.compact_replica_state(round_id, rows, version)
    except Exception as e:  # another writer appended meanwhile: a later round compacts
        if not is_concurrent_conflict(e):
            raise
        return table_rows, False
    return (current_rows, True) if compacted else (table_rows, False)


# -- reading the inputs (pinned with localCheckpoint: the round writes to the same tables) ------

def _partition_meta(storage: Storage, config: dict[str, Any]) -> DataFrame:
    """Partitions with each topic's effective config (overrides over the cluster's)."""
    overrides = F.from_json(F.col("config"), MapType(StringType(), StringType()))

    def setting(key: str, cast: str) -> Any:
        return F.coalesce(overrides.getItem(key), F.lit(str(config[key]).lower())).cast(cast)

    policy = F.split(setting("cleanup.policy", "string"), ",")
    deletes, compact = F.array_contains(policy, "delete"), F.array_contains(policy, "compact")
    topics = storage.read("topics").select(
        "topic",
        setting("min.insync.replicas", "int").alias("min_isr"),
        setting("replica.lag.time.max.ms", "long").alias("lag_time_max_ms"),
        setting("message.max.bytes", "long").alias("message_max_bytes"),
        # retention applies under cleanup.policy delete (or compact,delete) only
        F.when(deletes, setting("retention.ms", "long")).otherwise(F.lit(-1).cast("long")).alias("retention_ms"),
        F.when(deletes, setting("retention.bytes", "long")).otherwise(F.lit(-1).cast("long")).alias("retention_bytes"),
        setting("unclean.leader.election.enable", "boolean").alias("unclean"),
        compact.alias("compact"),
        setting("leader.replication.throttled.replicas", "string").alias("leader_throttled_replicas"),
        setting("follower.replication.throttled.replicas", "string").alias("follower_throttled_replicas"),
    )
    none = F.array().cast("array<int>")
    return (storage.read("partitions").join(topics, on="topic", how="inner").drop("round_id")
            .withColumn("adding_replicas", F.coalesce(F.col("adding_replicas"), none))
            .withColumn("removing_replicas", F.coalesce(F.col("removing_replicas"), none)))


def _by_key(keys: list[Any], pairs: dict[Any, Any], cast: str) -> Any:
    """A column that maps the value of `keys` (columns) to `pairs`' value (null for others): the
    round's O(brokers) settings as expressions, not as a table to join."""
    match = [(reduce(lambda a, b: a & b, [F.col(k) == v for k, v in zip(keys, key if isinstance(key, tuple)
                                                                           else (key,))]), value)
             for key, value in pairs.items()]
    if not match:
        return F.lit(None).cast(cast)
    column = F.when(match[0][0], F.lit(match[0][1]))
    for condition, value in match[1:]:
        column = column.when(condition, F.lit(value))
    return column.cast(cast)


def _fetch_pair(context: Any) -> tuple[int, int]:
    """(follower broker, leader broker) of a replica fetcher's fetch context."""
    return int(context.fetcher[len(sessions.REPLICA_FETCHER_PREFIX):]), context.leader


def _with_broker_settings(replicas: DataFrame, inputs: RoundInputs) -> DataFrame:
    """Each replica row with its broker's fetcher (is_paused, broker_last_fetch_ms: its last fetch;
    partition_max_bytes, response_max_bytes: the fetch limits, a throttle's included) and the
    context its leader made of its fetch request this round (fetch_kind, request_session_id)."""
    config = inputs.cluster_config
    last_fetch = {b: (inputs.paused_brokers.get(b) if b in inputs.paused_brokers else inputs.previous_round_ms)
                  for b in inputs.brokers}
    limit = {b: min(inputs.throttles[b], config["replica.fetch.max.bytes"]) if inputs.throttles.get(b)
             else config["replica.fetch.max.bytes"] for b in inputs.brokers}
    contexts = {_fetch_pair(c): c for c in inputs.contexts}

    def listed(column: str, broker: str) -> Any:  # Kafka's throttled-replica lists: * or partition:broker
        entry = F.concat_ws(":", F.col("partition").cast("string"), F.col(broker).cast("string"))
        return (F.col(column) == "*") | F.array_contains(F.split(F.col(column), ","), entry)
    # a replica in the ISR is never throttled (KIP-73)
    out_of_sync = ~F.array_contains(F.col("isr"), F.col("broker"))
    budgets = inputs.throttle_budgets
    # (without a throttled rate, no quota columns: the response rule skips its quota windows)
    quota = {} if not budgets else {
        "leader_throttled": out_of_sync & listed("leader_throttled_replicas", "leader"),
        "follower_throttled": out_of_sync & listed("follower_throttled_replicas", "broker"),
        "leader_budget": _by_key(["leader"], {b: v for (k, b), v in budgets.items() if k == "leader"}, "long"),
        "follower_budget": _by_key(["broker"], {b: v for (k, b), v in budgets.items() if k == "follower"}, "long"),
    }
    return replicas.withColumns({
        **quota,
        "is_paused": F.coalesce(F.col("broker").isin(*inputs.paused_brokers), F.lit(False)),
        "broker_last_fetch_ms": _by_key(["broker"], {b: v for b, v in last_fetch.items() if v is not None}, "long"),
        "partition_max_bytes": _by_key(["broker"], limit, "long"),
        "response_max_bytes": F.lit(config["replica.fetch.response.max.bytes"]).cast("long"),
        "fetch_kind": _by_key(["broker", "leader"], {k: c.kind for k, c in contexts.items()}, "string"),
        "request_session_id": _by_key(["broker", "leader"], {k: c.session_id for k, c in contexts.items()}, "int"),
    })


def _read_meta_state(storage: Storage, inputs: RoundInputs, carry: Carry | None) -> tuple[Keyed, Keyed]:
    """(partition metadata, replica state), from the carry when there is one, else from the tables."""
    if carry is not None:
        return carry.meta_rows, carry.state_rows
    return (Keyed.of(_partition_meta(storage, inputs.cluster_config), PARTITION_KEY),
            Keyed.of(storage.replica_state().drop("round_id"), REPLICA_KEY))


def _serving(meta: DataFrame, inputs: RoundInputs) -> DataFrame:
    """The metadata the round serves requests by: a leader that is down (stopped, not yet fenced)
    appends nothing, answers no fetch and moves no HW or ISR: its partitions count as leaderless
    for the round (NOT_LEADER_OR_FOLLOWER to producers) until the controller fences it."""
    down = (inputs.controller or {}).get("down") or []
    if not down:
        return meta
    return meta.withColumn("leader", F.when(F.col("leader").isin(*down), F.lit(NO_LEADER)).otherwise(F.col("leader")))


def _serving_brokers(inputs: RoundInputs) -> list[int]:
    """The brokers whose logs a round may read: not the ones that are down (a stopped broker's log
    directory may be gone), which neither fetch nor lead for the round (_serving)."""
    down = set((inputs.controller or {}).get("down") or [])
    return [b for b in inputs.brokers if b not in down] or list(inputs.brokers)


@per_partition_step
def _read_replicas(spark: SparkSession, inputs: RoundInputs, meta: DataFrame, state: DataFrame) -> DataFrame:
    """One row per replica with its partition's metadata (as served) and its leader's offsets."""
    partition = Window.partitionBy(*PARTITION_KEY)
    leaders = {f"leader_{short}_before": F.max(F.when(F.col("is_leader"), F.col(column))).over(partition)
               for short, column in (("leo", "log_end_offset"), ("hw", "high_watermark"), ("lso", "log_start_offset"))}
    return (
        state.join(meta, on=PARTITION_KEY, how="inner")
        .filter(F.array_contains(F.col("replicas"), F.col("broker")))
        .withColumn("is_leader", F.col("broker") == F.col("leader"))
        .withColumns(leaders)
        .transform(lambda df: _with_broker_settings(df, inputs))
    ).localCheckpoint()


# -- the controller step (DESIGN.md "One round", step 1) -----------------------------------------

def _apply_changes(meta: DataFrame, changes: DataFrame) -> DataFrame:
    return pinned(meta.join(changes.select(*PARTITION_KEY), on=PARTITION_KEY, how="left_anti")
                .unionByName(changes.select(*meta.columns)))


def _admin_requests(storage: Storage, inputs: RoundInputs, kind: str) -> DataFrame | None:
    """New admin requests of `kind` (pinned), None when there are none."""
    version = inputs.admin_to_version
    if version <= inputs.last_admin_version:
        return None
    asked = (storage.read_changes("admin", inputs.last_admin_version, version)
             .filter(F.col("kind") == kind).localCheckpoint())
    return asked if asked.limit(1).collect() else None


def _preferred_election_requests(storage: Storage, inputs: RoundInputs) -> DataFrame | None:
    """Partitions named by new elect_preferred requests (partition -1: every partition of the
    topic): topic, partition; None when there are none."""
    asked = _admin_requests(storage, inputs, "elect_preferred")
    return None if asked is None else asked.select("topic", "partition")


def _reassignment_requests(storage: Storage, inputs: RoundInputs) -> DataFrame | None:
    """The newest reassign request of each partition named by new ones: topic, partition, target;
    None when there are none."""
    asked = _admin_requests(storage, inputs, "reassign")
    if asked is None:
        return None
    newest = Window.partitionBy(*PARTITION_KEY).orderBy(F.col("_commit_version").desc(), F.col("timestamp").desc())
    return (asked.withColumn("_n", F.row_number().over(newest)).filter(F.col("_n") == 1)
            .select(*PARTITION_KEY, F.col("replicas").alias("target")))


@dataclass(frozen=True)
class ControllerStep:
    """What the controller step changed (None: nothing): partitions, replica-state rows (a new
    leader's reset, replicas a reassignment added), election rows, and the replica-state rows of
    replicas a reassignment dropped (their rows and logs go)."""

    changed: DataFrame | None = None
    state_changed: DataFrame | None = None
    elections: DataFrame | None = None
    dropped: DataFrame | None = None
    added: DataFrame | None = None


def _added_replica_rows(added: DataFrame, state: DataFrame, now: int) -> DataFrame:
    """The replica-state rows of replicas a reassignment adds (added: topic, partition, broker,
    leader_epoch): an empty log that starts at the partition's log start offset, so it fetches
    from there (Kafka's new follower, reset to the leader's log start offset); never caught up,
    not fetched yet, in no session, with nothing to diverge from the current leader epoch."""
    starts = state.groupBy(*PARTITION_KEY).agg(F.max("log_start_offset").alias("_lso"))
    lso = F.coalesce(F.col("_lso"), F.lit(0)).cast("long")
    zero = F.lit(0).cast("long")
    return added.join(starts, on=PARTITION_KEY, how="left").select(
        *REPLICA_KEY, lso.alias("log_start_offset"), lso.alias("log_end_offset"), lso.alias("high_watermark"),
        lso.alias("fetch_offset"), zero.alias("last_fetch_time_ms"), zero.alias("last_fetch_leader_leo"),
        zero.alias("last_caught_up_time_ms"), zero.alias("last_data_round"), F.lit(0).alias("session_id"),
        zero.alias("session_max_bytes"), F.lit(-1).cast("long").alias("session_high_watermark"),
        F.lit(-1).cast("long").alias("session_leader_log_start_offset"),
        F.col("leader_epoch").alias("validated_leader_epoch"))


def _controller_step(storage: Storage, inputs: RoundInputs, meta_rows: Keyed, state_rows: Keyed
                     ) -> tuple[Keyed, Keyed, ControllerStep]:
    """Fences the brokers whose session ended and unfences the restarted ones, as Kafka's controller
    does in two steps (handleBrokerFenced, then handleBrokerUnfenced): the first election runs
    without the fenced and restarting brokers, the second with the restarting ones back. Then
    preferred leader elections, new reassignments and reassignments that can complete (KIP-455).

    Returns (meta, state, what changed). A new leader starts at the partition's HW
    (controller.new_leader_high_watermark), a new leader epoch starts at its leader's LEO (kept in
    the partition's leader_epoch_start_offset), and a new leader resets its followers."""
    decisions = inputs.controller or {}
    preferred = _preferred_election_requests(storage, inputs)
    reassign = _reassignment_requests(storage, inputs)
    fencing = bool(decisions.get("fence") or decisions.get("unfence"))
    if not fencing and preferred is None and reassign is None and not inputs.reassigning:
        return meta_rows, state_rows, ControllerStep()
    live = decisions.get("live", inputs.brokers)
    meta, state = meta_rows.all(), state_rows.all()
    steps = []
    if fencing:
        first = ctl.elect_leaders(meta, decisions["live_before_start"], decisions["lost_log"]).localCheckpoint()
        middle = _apply_changes(meta, first)
        second = ctl.elect_leaders(middle, decisions["live"]).localCheckpoint()
        after = _apply_changes(middle, second)
        steps += [first, second]
    else:
        after = meta
    if preferred is not None:  # kafka-leader-election --election-type PREFERRED
        named = (after.join(preferred.filter(F.col("partition") >= 0), on=PARTITION_KEY, how="left_semi")
                 .unionByName(after.join(preferred.filter(F.col("partition") < 0).select("topic"), on="topic",
                                         how="left_semi")))
        third = ctl.elect_preferred_leaders(named.dropDuplicates(PARTITION_KEY), live).localCheckpoint()
        after = _apply_changes(after, third)
        steps.append(third)
    moves = []  # reassignments: partitions with the brokers they add and drop
    if reassign is not None:
        started = ctl.start_reassignments(after.join(reassign, on=PARTITION_KEY, how="left_semi"), reassign,
                                          live).localCheckpoint()
        after = _apply_changes(after, started)
        steps.append(started)
        moves.append(started)
    if reassign is not None or inputs.reassigning:
        ongoing = after.filter(ctl.reassignment_in_progress(F.col("adding_replicas"), F.col("removing_replicas")))
        completed = ctl.complete_reassignments(ongoing, live).localCheckpoint()
        after = _apply_changes(after, completed)
        steps.append(completed)
        moves.append(completed)
    changed_keys = pinned(reduce(DataFrame.unionByName, [s.select(*PARTITION_KEY) for s in steps]).distinct())
    if not changed_keys.limit(1).collect():  # (a reassignment still catching up)
        return meta_rows, state_rows, ControllerStep()

    dropped = added = None
    if moves:
        brokers = lambda column: reduce(DataFrame.unionByName, [  # noqa: E731
            m.select(*PARTITION_KEY, F.explode(column).alias("broker"), "leader_epoch") for m in moves])
        dropped = pinned(state.join(brokers("dropped").select(*REPLICA_KEY), on=REPLICA_KEY, how="left_semi"))
        added = brokers("added").join(after.select(*PARTITION_KEY, F.col("leader_epoch").alias("_e")),
                                      on=PARTITION_KEY).select(*REPLICA_KEY, F.col("_e").alias("leader_epoch"))
        added = pinned(_added_replica_rows(added, state, inputs.now_ms).select(*state.columns))
        state = (state.join(dropped.select(*REPLICA_KEY), on=REPLICA_KEY, how="left_anti")
                 .join(added.select(*REPLICA_KEY), on=REPLICA_KEY, how="left_anti").unionByName(added))

    offsets = state.groupBy(*PARTITION_KEY).agg(F.max("high_watermark").alias("partition_hw"))
    leos = state.select(*PARTITION_KEY, F.col("broker").alias("leader"), F.col("log_end_offset").alias("leader_leo"))
    before = meta.select(*PARTITION_KEY, F.col("leader").alias("_old_leader"), F.col("leader_epoch").alias("_old_epoch"))
    moved = (after.join(changed_keys, on=PARTITION_KEY, how="left_semi").join(before, on=PARTITION_KEY)
             .join(offsets, on=PARTITION_KEY, how="left").join(leos, on=[*PARTITION_KEY, "leader"], how="left"))
    led = moved.filter((F.col("leader") != F.col("_old_leader")) & (F.col("leader") != NO_LEADER))
    # a new leader epoch (a new leader, or a completed reassignment) starts at its leader's LEO
    changed = (moved.withColumn("leader_epoch_start_offset", F.when(
        (F.col("leader_epoch") != F.col("_old_epoch")) & (F.col("leader") != NO_LEADER), F.col("leader_leo"))
        .otherwise(F.col("leader_epoch_start_offset")))
        .select(*meta.columns)).localCheckpoint()

    new_hw = ctl.new_leader_high_watermark(F.col("partition_hw"), F.col("leader_leo"))
    part = led.select(*PARTITION_KEY, "leader", "isr", "leader_leo", "partition_hw")
    rows = state.join(part, on=PARTITION_KEY, how="inner")
    leaders = (rows.filter(F.col("broker") == F.col("leader"))
               .withColumn("high_watermark", new_hw).withColumn("fetch_offset", F.col("log_end_offset")))
    followers = ctl.reset_followers_for_new_leader(rows.filter(F.col("broker") != F.col("leader")), inputs.now_ms)
    state_changed = leaders.unionByName(followers).select(*state.columns)
    if added is not None:
        state_changed = added.join(state_changed.select(*REPLICA_KEY), on=REPLICA_KEY, how="left_anti") \
            .unionByName(state_changed)
    state_changed = pinned(state_changed)
    state = (state.join(state_changed.select(*REPLICA_KEY), on=REPLICA_KEY, how="left_anti")
             .unionByName(state_changed))

    def election_rows(df: DataFrame) -> DataFrame:
        e = (df.filter(F.col("election").isNotNull()).join(offsets, on=PARTITION_KEY, how="left")
             .join(leos, on=[*PARTITION_KEY, "leader"], how="left"))
        hw = F.when(F.col("leader") != NO_LEADER, new_hw)
        return e.select(F.lit(inputs.round_id).cast("long").alias("round_id"),
                        F.lit(inputs.now_ms).cast("long").alias("now_ms"), *PARTITION_KEY, "election",
                        "previous_leader", "leader", "leader_epoch",
                        F.when(F.col("leader") != NO_LEADER, F.col("leader_leo")).alias("start_offset"),
                        hw.alias("high_watermark"),
                        F.when(F.col("leader") != NO_LEADER, F.greatest(F.col("partition_hw") - F.col("leader_leo"),
                                                                       F.lit(0))).otherwise(F.lit(0))
                        .cast("long").alias("offsets_lost"), "isr")
    elections = pinned(reduce(DataFrame.unionByName, [election_rows(s) for s in steps]).select(*ELECTIONS_SCHEMA.fieldNames()))
    return (Keyed.of(_apply_changes(meta, changed), PARTITION_KEY), Keyed.of(state, REPLICA_KEY),
            ControllerStep(changed, state_changed, elections, dropped, added))


# -- leader-epoch checks (DESIGN.md "One round", step 3: truncation by epoch, not by HW) --------

def _epoch_checks(storage: Storage, inputs: RoundInputs, replicas: DataFrame) -> tuple[DataFrame, DataFrame | None]:
    """Followers about to fetch from a leader whose epoch they have not validated yet send the epoch
    of their last record (lastFetchedEpoch). The leader answers a diverging one with the epoch and
    end offset its cache has for it, and the follower truncates its log there (Kafka's
    Partition.fetchRecords and AbstractFetcherThread.truncateOnFetchResponse); one whose
    truncation is not complete asks again next round and fetches nothing this one.

    Returns (replicas with their offsets after truncation, `epoch_checked` and `epoch_pending`,
    the truncations: broker, topic, partition, truncate_to; None when none)."""
    fetching = (~F.col("is_leader") & (F.col("leader") != NO_LEADER) & ~F.col("is_paused")
                & F.coalesce(F.col("fetch_kind").isin(*_FETCH_KINDS), F.lit(False)))
    unchecked = fetching & (F.coalesce(F.col("validated_leader_epoch"), F.lit(0)) < F.col("leader_epoch"))
    flagged = replicas.withColumn("epoch_checked", F.lit(False)).withColumn("epoch_pending", F.lit(False))
    if not replicas.filter(unchecked).limit(1).collect():
        return flagged, None
    need = replicas.filter(unchecked).select(
        *REPLICA_KEY, "leader", "leader_epoch", "leader_epoch_start_offset", "leader_leo", "leader_lso",
        "log_end_offset", "log_start_offset").localCheckpoint()
    logs = reduce(DataFrame.unionByName, [storage.read_log(b).withColumn("broker", F.lit(b))
                                          for b in _serving_brokers(inputs)])
    follower_records = (logs.join(need.select(*REPLICA_KEY, "log_start_offset", "log_end_offset"), on=REPLICA_KEY)
                        .filter((F.col("offset") >= F.col("log_start_offset")) & (F.col("offset") < F.col("log_end_offset"))))
    leaders = need.select(*PARTITION_KEY, F.col("leader").alias("broker"), "leader_epoch",
                          "leader_epoch_start_offset", "leader_lso", "leader_leo").distinct()
    leader_records = (logs.join(leaders.select(*REPLICA_KEY, "leader_lso", "leader_leo"), on=REPLICA_KEY)
                      .filter((F.col("offset") >= F.col("leader_lso")) & (F.col("offset") < F.col("leader_leo"))))
    current = leaders.select(*REPLICA_KEY, F.col("leader_epoch").alias("epoch"),
                             F.col("leader_epoch_start_offset").alias("start_offset"))
    follower_cache = ctl.epoch_cache(follower_records).localCheckpoint()
    leader_cache = ctl.epoch_cache(leader_records, current).localCheckpoint()
    last_epoch = follower_cache.groupBy(*REPLICA_KEY).agg(F.max("epoch").alias("last_fetched_epoch"))

    asked = need.join(last_epoch, on=REPLICA_KEY, how="left").withColumn(
        "last_fetched_epoch", F.coalesce(F.col("last_fetched_epoch"), F.lit(ctl.UNDEFINED_EPOCH)))
    to_leader = asked.select(*PARTITION_KEY, F.col("leader").alias("broker"), F.col("broker").alias("follower"),
                             F.col("last_fetched_epoch").alias("requested_epoch"),
                             F.col("leader_leo").alias("log_end_offset"), F.col("leader_lso").alias("log_start_offset"))
    answered = (ctl.end_offset_for_epoch(to_leader, leader_cache)
                .select(*PARTITION_KEY, F.col("follower").alias("broker"), "end_epoch", "end_offset"))
    checked = asked.join(answered, on=REPLICA_KEY, how="left").withColumn(
        "outcome", F.when(F.col("last_fetched_epoch") == ctl.UNDEFINED_EPOCH, F.lit(None).cast("string")).otherwise(
            ctl.diverging_epoch(F.col("last_fetched_epoch"), F.col("log_end_offset"), F.col("end_epoch"),
                                F.col("end_offset"))))
    own = (ctl.end_offset_for_epoch(
        checked.filter(F.col("outcome") == "diverging").select(
            *REPLICA_KEY, F.col("end_epoch").alias("requested_epoch"), "log_end_offset", "log_start_offset"),
        follower_cache)
        .select(*REPLICA_KEY, F.col("end_epoch").alias("own_epoch"), F.col("end_offset").alias("own_offset")))
    offset, completed = ctl.truncation_offset(F.col("end_epoch"), F.col("end_offset"), F.col("own_epoch"),
                                              F.col("own_offset"), F.col("log_end_offset"))
    outcomes = (checked.join(own, on=REPLICA_KEY, how="left")
                .withColumn("truncate_to", F.when(F.col("outcome") == "diverging", offset)
                            .when(F.col("outcome") == "out_of_range", F.least("log_end_offset", "leader_leo")))
                .withColumn("completed", F.when(F.col("outcome") == "diverging", completed).otherwise(F.lit(True)))
                .select(*REPLICA_KEY, "truncate_to", "completed")).localCheckpoint()
    leo = F.coalesce(F.least(F.col("truncate_to"), F.col("log_end_offset")), F.col("log_end_offset"))
    replicas = (
        flagged.join(outcomes, on=REPLICA_KEY, how="left")
        .withColumn("epoch_checked", F.col("completed").isNotNull())
        .withColumn("epoch_pending", F.coalesce(~F.col("completed"), F.lit(False)))
        .withColumn("log_end_offset", leo)
        .withColumn("high_watermark", F.least(F.col("high_watermark"), F.col("log_end_offset")))
        .withColumn("fetch_offset", F.least(F.col("fetch_offset"), F.col("log_end_offset")))
        .withColumn("validated_leader_epoch", F.when(F.coalesce(F.col("completed"), F.lit(False)), F.col("leader_epoch"))
                    .otherwise(F.col("validated_leader_epoch")))
        .drop("truncate_to", "completed")
    ).localCheckpoint()
    truncations = outcomes.join(need.select(*REPLICA_KEY, "log_end_offset"), on=REPLICA_KEY).filter(
        F.col("truncate_to") < F.col("log_end_offset")).select("broker", *PARTITION_KEY, "truncate_to").localCheckpoint()
    return replicas, truncations


def _read_inbox(spark: SparkSession, storage: Storage, last_version: int, version: int) -> tuple[DataFrame, int]:
    if version > last_version:
        inbox = storage.read_changes("inbox", last_version, version).drop("_change_type", "_commit_timestamp")
    else:
        inbox = storage.read("inbox").limit(0).withColumn("_commit_version", F.lit(0).cast("long"))
    return inbox, max(version, last_version)


def _log_start_requests(spark: SparkSession, storage: Storage, inputs: RoundInputs, serving: DataFrame,
                        state: DataFrame) -> tuple[DataFrame | None, int]:
    """Per partition, the log start offset asked for by new delete_records requests and, when the
    retention check is due, by retention.ms / retention.bytes where it moves the leader's log start
    (every partition's leader is checked then): (topic, partition, requested_lso)."""
    leaders = None
    if inputs.retention_due:
        leaders = (state.join(serving.filter((F.col("retention_ms") >= 0) | (F.col("retention_bytes") >= 0))
                              .select(*PARTITION_KEY, F.col("leader").alias("broker"), "retention_ms", "retention_bytes"),
                              on=["broker", *PARTITION_KEY], how="inner")
                   .select("broker", *PARTITION_KEY, "log_start_offset", "log_end_offset", "retention_ms",
                           "retention_bytes"))
    return log_start_requests(storage, inputs, leaders)


def log_start_requests(storage: Storage, inputs: RoundInputs, leaders: DataFrame | None
                       ) -> tuple[DataFrame | None, int]:
    """`_log_start_requests` given the leaders to check for retention (None: the check is not
    due): broker, topic, partition, log_start_offset, log_end_offset, retention_ms,
    retention_bytes of each serving leader under a retention limit. Also the admin version read."""
    version = inputs.admin_to_version
    asks = []
    if version > inputs.last_admin_version:
        asks.append(storage.read_changes("admin", inputs.last_admin_version, version)
                    .filter(F.col("kind") == "delete_records")
                    .select(*PARTITION_KEY, F.col("offset").alias("requested_lso")))
    if leaders is not None:
        logs = [storage.read_log(b).withColumn("broker", F.lit(b)) for b in _serving_brokers(inputs)]
        leader_logs = (reduce(DataFrame.unionByName, logs).join(leaders, on=["broker", *PARTITION_KEY])
                       .filter((F.col("offset") >= F.col("log_start_offset")) & (F.col("offset") < F.col("log_end_offset"))))
        asks.append(log_start.retention_log_start_offsets(leader_logs, inputs.now_ms)
                    .join(leaders.select(*PARTITION_KEY, "log_start_offset"), on=PARTITION_KEY, how="inner")
                    .filter(F.col("retention_start_offset") > F.col("log_start_offset"))
                    .select(*PARTITION_KEY, F.col("retention_start_offset").alias("requested_lso")))
    if not asks:
        return None, max(version, inputs.last_admin_version)
    requests = (reduce(DataFrame.unionByName, asks).groupBy(*PARTITION_KEY)
                .agg(F.max("requested_lso").alias("requested_lso"))).localCheckpoint()
    return requests, max(version, inputs.last_admin_version)


def _working_set(inputs: RoundInputs, carry: Carry | None, meta: DataFrame, changed: DataFrame | None,
                 inbox: DataFrame, pending: DataFrame, lso_requests: DataFrame | None) -> DataFrame | None:
    """topic, partition: the partitions this round can change, pinned; None: every partition.

    The last round's attention set (partitions it left unsettled, or with a follower that has not
    validated its leader's epoch), the partitions of new produce requests, of pending ones, of log
    start requests and of the controller's changes, and every partition a full fetch request
    carries. Any other partition is settled: its followers are at the leader's LEO, HW and log
    start, in the ISR and in the leader's session, so this round would leave it as it is (DESIGN.md
    "Incremental"). Every partition is in it when there is no carry (a process's first round, or
    another writer changed the metadata or the state), when the controller fences or unfences a
    broker, and when a broker's fetch limit changed (its sessions' cached max bytes all alter)."""
    decisions = inputs.controller or {}
    if (carry is None or carry.attention is None or inputs.restarted or decisions.get("fence")
            or decisions.get("unfence") or carry.throttles != inputs.throttles):
        return None
    keys = [carry.attention, inbox.select(*PARTITION_KEY), pending.select(*PARTITION_KEY)]
    keys += [df.select(*PARTITION_KEY) for df in (changed, lso_requests) if df is not None]
    full = [_fetch_pair(c) for c in inputs.contexts if c.kind in ("full", "sessionless")]
    if full:
        carried = reduce(lambda a, b: a | b, [(F.col("leader") == leader) & F.array_contains("replicas", follower)
                                              for follower, leader in full])
        keys.append(meta.filter(carried).select(*PARTITION_KEY))
    return pinned(reduce(DataFrame.unionByName, keys).distinct())


def _with_leader_log_start(replicas: DataFrame, requests: DataFrame | None) -> DataFrame:
    """`leader_lso`: the leader's log start offset after this round's requests."""
    if requests is None:
        return replicas.withColumn("leader_lso", F.col("leader_lso_before"))
    return (replicas.join(requests, on=PARTITION_KEY, how="left")
            .withColumn("leader_lso", log_start.next_leader_log_start_offset(
                F.col("leader_lso_before"), F.col("leader_hw_before"), F.col("requested_lso")))
            .drop("requested_lso"))


def _check_idempotent_producers(storage: Storage, validated: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(rows with sequence errors added and `is_duplicate`, the per-batch checks). A round without
    idempotent batches reads no producer state: its checks are empty (pruned by the optimizer)."""
    idempotent = validated.filter(F.col("error_code").isNull() & F.col("producer_id").isNotNull())
    stored = producer_state.batches_in_leader_log(
        storage.read("producers"), storage.read("elections").select(*PARTITION_KEY, "round_id", "start_offset")
    ).drop("round_id")
    if not idempotent.limit(1).collect():
        empty = producer_state.check_producer_sequences(producer_state.producer_batches(idempotent.limit(0)),
                                                        producer_state.retained_batches(stored.limit(0)))
        return validated.withColumn("is_duplicate", F.lit(False)), empty
    retained = producer_state.retained_batches(stored)
    batches = producer_state.producer_batches(idempotent)
    checks = producer_state.check_producer_sequences(batches, retained).localCheckpoint()
    rows = (
        validated.join(checks.select(*REQUEST_KEY, "outcome", F.col("error_code").alias("_seq_error")),
                       on=REQUEST_KEY, how="left")
        .withColumn("error_code", F.coalesce(F.col("error_code"), F.col("_seq_error")))
        .withColumn("is_duplicate", F.coalesce(F.col("outcome") == "duplicate", F.lit(False)))
        .drop("outcome", "_seq_error")
    ).localCheckpoint()
    return rows, checks


def _producer_state_rows(appended: DataFrame, checks: DataFrame, round_id: int) -> DataFrame:
    return (
        appended.filter(F.col("producer_id").isNotNull()).groupBy(*REQUEST_KEY)
        .agg(F.min("offset").alias("base_offset"), F.max("offset").alias("last_offset"))
        .join(checks.filter(F.col("outcome") == "append"), on=REQUEST_KEY, how="inner")
        .withColumn("round_id", F.lit(round_id).cast("long"))
        .select(*PRODUCERS_SCHEMA.fieldNames())
    )


def _duplicate_results(validated: DataFrame, checks: DataFrame, appended_results: DataFrame) -> DataFrame:
    """Retried batches: answered with the offsets of the batch they repeat (DUPLICATE_SEQUENCE_NUMBER
    is not an error to the caller)."""
    in_round = appended_results.select(F.col("request_id").alias("duplicate_of"), "topic", "partition",
                                       F.col("base_offset").alias("_b"), F.col("last_offset").alias("_l"))
    dups = (
        checks.filter(F.col("outcome") == "duplicate").join(in_round, on=["duplicate_of", "topic", "partition"],
                                                            how="left")
        .select(*REQUEST_KEY, F.coalesce("original_base_offset", "_b").alias("base_offset"),
                F.coalesce("original_last_offset", "_l").alias("last_offset"))
    )
    return (
        validated.filter(F.col("is_duplicate")).groupBy(*REQUEST_KEY, "acks").agg(F.count(F.lit(1)).alias("record_count"))
        .join(dups, on=REQUEST_KEY, how="inner")
        .withColumn("status", acks_rules.status_after_append(F.col("acks")))
        .withColumn("error_code", F.lit(None).cast("string"))
    )


STATUS_THROTTLED = "throttled"  # a produce request waiting in the inbox for its client's quota
_SENSOR_SCHEMA = ("user string, client_id string, sensor_user string, sensor_client string, quota long, "
                  "window_bytes long, window_ms long, throttled boolean")


@dataclass(frozen=True)
class QuotaStep:
    """What the client quotas made of a round's produce requests (see _client_quotas)."""

    held: DataFrame | None = None  # request_id, throttle_time_ms: requests served after waiting
    deferred: DataFrame | None = None  # inbox rows (and _deferred_since) of requests still waiting
    waiting_results: DataFrame | None = None  # result rows of requests that started waiting
    recorded: dict = field(default_factory=dict)  # sensor key -> (bytes served, quota)
    waiting: int = 0  # requests still waiting


def _client_quotas(spark: SparkSession, inbox: DataFrame, deferred: DataFrame | None,
                   inputs: RoundInputs) -> tuple[DataFrame, QuotaStep]:
    """The produce requests this round serves, of its new inbox rows and those that waited, under
    their clients' producer_byte_rate (quotas.admit_within_quota); nothing to do, and no Spark job,
    when no produce quota is configured and nothing waits."""
    if inputs.quota_sensors is None and deferred is None:
        return inbox, QuotaStep()
    now = inputs.now_ms
    candidates = inbox.withColumn("_deferred_since", F.lit(None).cast("long"))
    if deferred is not None:
        candidates = candidates.unionByName(deferred)
    candidates = candidates.localCheckpoint()
    requests = quotas.request_bytes(candidates, rules.record_size(F.col("key"), F.col("value"))).localCheckpoint()
    pairs = [(r["user"], r["client_id"]) for r in requests.select("user", "client_id").distinct().collect()]
    rows = inputs.quota_sensors(pairs) if inputs.quota_sensors is not None else []  # O(clients)
    decided = quotas.admit_within_quota(requests, spark.createDataFrame(rows, _SENSOR_SCHEMA)).localCheckpoint()
    recorded, waiting = {}, 0
    for r in decided.groupBy("sensor_user", "sensor_client", "quota", "admitted").agg(  # O(sensors)
            F.sum("bytes").alias("bytes"), F.count(F.lit(1)).alias("n")).collect():
        if not r["admitted"]:
            waiting += r["n"]
        elif r["sensor_user"] is not None:
            recorded[(r["sensor_user"], r["sensor_client"])] = (int(r["bytes"]), int(r["quota"]))
    if not waiting and deferred is None:
        return inbox, QuotaStep(recorded=recorded)
    admitted = decided.filter("admitted").select(
        "request_id", (F.lit(now) - F.col("_deferred_since")).alias("throttle_time_ms"))
    held = admitted.filter(F.col("throttle_time_ms").isNotNull()).localCheckpoint()
    served = candidates.join(admitted.select("request_id"), on="request_id", how="left_semi").drop("_deferred_since")
    if not waiting:
        return served, QuotaStep(held=held, recorded=recorded)
    left = candidates.join(decided.filter(~F.col("admitted")).select("request_id"), on="request_id", how="left_semi")
    waiting_results = (
        left.filter(F.col("_deferred_since").isNull())
        .groupBy(*REQUEST_KEY, "acks").agg(F.count(F.lit(1)).alias("record_count"))
        .select(*REQUEST_KEY, F.lit(None).cast("long").alias("base_offset"), F.lit(None).cast("long").alias("last_offset"),
                "record_count", "acks", F.lit(STATUS_THROTTLED).alias("status"),
                F.lit(None).cast("string").alias("error_code"), F.lit(inputs.round_id).cast("long").alias("round_id"),
                F.lit(None).cast("long").alias("throttle_time_ms")))
    deferred_out = left.withColumn("_deferred_since", F.coalesce("_deferred_since", F.lit(now).cast("long")))
    return served, QuotaStep(held, pinned_without_history(deferred_out), waiting_results, recorded, waiting)


def _deferred_requests(storage: Storage, last_waiting: int | None) -> DataFrame | None:
    """The inbox rows of requests still waiting for their client's quota, from the tables (a new
    process, or a dropped carry): their newest result row says throttled, and the inbox versions of
    the round that wrote it hold their rows. None when the last round left none waiting."""
    if not last_waiting:
        return None
    waiting = (current_rows(storage.read("results"), REQUEST_KEY).filter(F.col("status") == STATUS_THROTTLED)
               .select("request_id", "round_id").distinct())
    rounds = storage.read("rounds").select(
        "round_id", "now_ms", "inbox_version",
        F.coalesce(F.lag("inbox_version").over(Window.orderBy("round_id")), F.lit(0)).alias("from_version"))
    spans = waiting.join(rounds, on="round_id", how="inner").localCheckpoint()
    bounds = spans.agg(F.min("from_version").alias("lo"), F.max("inbox_version").alias("hi")).first()
    if bounds["lo"] is None:
        return None
    return (storage.read_changes("inbox", bounds["lo"], bounds["hi"]).drop("_change_type", "_commit_timestamp")
            .join(spans.select("request_id", F.col("now_ms").alias("_deferred_since")), on="request_id", how="inner")
            .localCheckpoint())


def _pending_results(storage: Storage, last_pending: int | None) -> DataFrame:
    """Requests still waiting for their acks (the newest result row of each is pending); none to
    read when the last round left none pending."""
    results = storage.read("results")
    if last_pending == 0:
        results = results.limit(0)
    return current_rows(results, REQUEST_KEY).filter(F.col("status") == acks_rules.STATUS_PENDING).drop("round_id")


def _old_leader_records(storage: Storage, needs_df: DataFrame, brokers: list[int]) -> DataFrame | None:
    """Leader log rows older than this round's append, for followers that lag behind it."""
    bounds = needs_df.agg(F.count(F.lit(1)).alias("n"), F.min("fetch_offset").alias("lo")).first()
    if not bounds["n"]:
        return None
    logs = [storage.read_log(b).filter(F.col("offset") >= F.lit(bounds["lo"])).withColumn("broker", F.lit(b))
            for b in brokers]
    wanted = needs_df.select(*PARTITION_KEY, F.col("leader").alias("broker"), "leader_leo_before").distinct()
    return (reduce(DataFrame.unionByName, logs)
            .join(small_side(wanted), on=["broker", *PARTITION_KEY], how="inner")
            .filter(F.col("offset") < F.col("leader_leo_before"))
            .drop("leader_leo_before")).localCheckpoint()


# -- the steps -----------------------------------------------------------------------------

def _leader_append(validated: DataFrame, replicas: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(appended log rows, replicas with `leader_leo` after the append)."""
    leaders = replicas.filter("is_leader").select(
        *PARTITION_KEY, "leader", "leader_epoch", F.col("log_end_offset").alias("leader_leo"))
    appended = rules.assign_offsets(
        validated.filter(F.col("error_code").isNull() & ~F.col("is_duplicate")).drop("leader", "leader_epoch"),
        leaders).localCheckpoint()
    counts = appended.groupBy(*PARTITION_KEY).agg(F.count(F.lit(1)).alias("appended"))
    replicas = (
        replicas.join(counts, on=PARTITION_KEY, how="left")
        .withColumn("appended", F.coalesce(F.col("appended"), F.lit(0)).cast("long"))
        .withColumn("leader_leo", F.col("leader_leo_before") + F.col("appended"))
    ).localCheckpoint()
    return appended, replicas


@per_partition_step
def _fetch(replicas: DataFrame, now: int, restarted: bool) -> DataFrame:
    """Every follower of a live leader; those whose broker fetches update the leader's view. In a
    process's first round the leaders first reset their followers' state (a paused fetcher stays
    paused across the restart, so its follower gets no reset)."""
    followers = replicas.filter(~F.col("is_leader") & (F.col("leader") != NO_LEADER))
    if restarted:
        followers = rules.reset_follower_state_on_restart(followers.filter(~F.col("is_paused")), now).unionByName(
            followers.filter(F.col("is_paused")))
    followers = rules.with_effective_fetch_state(followers)
    fetching = (~F.col("is_paused") & ~F.col("epoch_pending")
                & F.coalesce(F.col("fetch_kind").isin(*_FETCH_KINDS), F.lit(False)))
    # (one projection, each value from the row before it: the LEO and HW from the new log start)
    lso = log_start.follower_log_start_offset(F.col("log_start_offset"), F.col("leader_lso"))
    leo = F.greatest(F.col("log_end_offset"), lso)
    fetched = rules.update_follower_fetch_state(
        followers.filter(fetching).withColumns({
            "log_start_offset": lso, "log_end_offset": leo,
            "high_watermark": F.greatest(F.col("high_watermark"), lso), "fetch_offset": leo}), now)
    return (fetched.withColumn("fetched", F.lit(True))
            .unionByName(followers.filter(~fetching).withColumn("fetched", F.lit(False)))).localCheckpoint()


@per_partition_step
def _isr_changes(meta: DataFrame, followers: DataFrame, now: int) -> DataFrame:
    """Partitions whose ISR changes: expansion checked against the HW before this fetch."""
    joining = isr_rules.maybe_expand_isr(followers.filter("fetched").withColumn("leader_hw", F.col("leader_hw_before")))
    leaving = isr_rules.out_of_sync_followers(followers, now)
    moves = (
        joining.withColumn("_in", F.lit(True)).unionByName(leaving.withColumn("_in", F.lit(False)))
        .groupBy(*PARTITION_KEY).agg(
            F.collect_list(F.when(F.col("_in"), F.col("broker"))).alias("_joining"),
            F.collect_list(F.when(~F.col("_in"), F.col("broker"))).alias("_leaving"))
    )
    return (
        meta.join(moves, on=PARTITION_KEY, how="inner")
        .withColumns({
            "isr": isr_rules.isr_in_replica_order(
                F.col("replicas"), F.array_union(F.array_except(F.col("isr"), F.col("_leaving")), F.col("_joining"))),
            "isr_expands": F.size(F.col("_joining")).cast("long"),
            "isr_shrinks": F.size(F.col("_leaving")).cast("long"),
            "partition_epoch": F.col("partition_epoch") + 1})
        .drop("_joining", "_leaving")
    ).localCheckpoint()


def _with_isr(df: DataFrame, isr_changed: DataFrame) -> DataFrame:
    new_isr = isr_changed.select(*PARTITION_KEY, F.col("isr").alias("_new_isr"))
    return (df.join(new_isr, on=PARTITION_KEY, how="left")
            .withColumn("isr", F.coalesce(F.col("_new_isr"), F.col("isr"))).drop("_new_isr"))


@per_partition_step
def _high_watermark(replicas: DataFrame, followers: DataFrame, isr_changed: DataFrame, now: int,
                    down: list[int], start: DataFrame | None = None) -> DataFrame:
    """The leaders' HW after the followers' fetches, from the HW before the round or, after the
    follow-up fetch, from `start` (topic, partition, high_watermark: the HW after the first)."""
    leader = replicas.filter("is_leader").withColumn("fetch_offset", F.col("leader_leo"))
    every = leader.unionByName(followers.drop("fetched"), allowMissingColumns=True)
    hw_input = _with_isr(every, isr_changed).withColumn("high_watermark", F.col("leader_hw_before"))
    if start is not None:
        hw_input = (hw_input.join(start.select(*PARTITION_KEY, F.col("high_watermark").alias("_start")),
                                  on=PARTITION_KEY, how="left")
                    .withColumn("high_watermark", F.coalesce(F.col("_start"), F.col("high_watermark"))).drop("_start"))
    return rules.maybe_increment_leader_hw(hw_input, now, down).localCheckpoint()


def _results(validated: DataFrame, appended: DataFrame, pending: DataFrame, partitions_now: DataFrame,
             checks: DataFrame, round_id: int, new_leaders: DataFrame | None = None,
             held: DataFrame | None = None) -> DataFrame:
    """Result rows written this round: new appends, rejections, and pending requests answered
    (those waiting on a partition that has a new leader fail: controller.fail_on_leader_change).
    `held`: request_id, throttle_time_ms of requests a client quota held back (0 for the others)."""
    appended_results = (
        appended.groupBy(*REQUEST_KEY, "acks").agg(
            F.min("offset").alias("base_offset"), F.max("offset").alias("last_offset"),
            F.count(F.lit(1)).alias("record_count"))
        .withColumns({"status": acks_rules.status_after_append(F.col("acks")),
                      "error_code": F.lit(None).cast("string")})
    )
    rejected = (
        validated.filter(F.col("error_code").isNotNull())
        .groupBy(*REQUEST_KEY, "acks", "error_code").agg(F.count(F.lit(1)).alias("record_count"))
        .withColumns({"base_offset": F.lit(None).cast("long"), "last_offset": F.lit(None).cast("long"),
                      "status": F.lit(acks_rules.STATUS_ERROR)})
    )
    appended_results = appended_results.unionByName(_duplicate_results(validated, checks, appended_results))
    appended_results, rejected = (_with_throttle_time(appended_results, held), _with_throttle_time(rejected, held))
    failed = None
    if new_leaders is not None:
        failed = acks_rules.fail_on_leader_change(pending, new_leaders)
        pending = pending.join(failed.select(*REQUEST_KEY), on=REQUEST_KEY, how="left_anti")
    waiting = pending.unionByName(appended_results.filter(F.col("status") == acks_rules.STATUS_PENDING))
    answered = acks_rules.resolve_pending_acks(waiting, partitions_now)
    if failed is not None:
        answered = answered.unionByName(failed.select(*answered.columns))
    # a request appended and answered in the same round is written once, answered
    return (
        appended_results.join(answered.select(*REQUEST_KEY), on=REQUEST_KEY, how="left_anti")
        .unionByName(rejected).unionByName(answered)
        .withColumn("round_id", F.lit(round_id).cast("long"))
        .select(*RESULTS_SCHEMA.fieldNames())
    ).localCheckpoint()


def _with_throttle_time(results: DataFrame, held: DataFrame | None) -> DataFrame:
    if held is None:
        return results.withColumn("throttle_time_ms", F.lit(0).cast("long"))
    return (results.join(F.broadcast(held), on="request_id", how="left")
            .withColumn("throttle_time_ms", F.coalesce("throttle_time_ms", F.lit(0)).cast("long")))


@per_partition_step
def _state_rows(replicas: DataFrame, hw: DataFrame, followers: DataFrame, followers_after: DataFrame,
                round_id: int) -> DataFrame:
    """Replica-state rows that changed: leaders that appended or moved their HW; followers whose
    offsets moved or that are not quiescent (their fetch times matter for the lag rule); and
    non-fetching followers of partitions that just left quiescence, whose fetch state until now
    was only implied by their broker's last fetch (so the lag is measured from it)."""
    cols = [c for c in REPLICA_STATE_SCHEMA.fieldNames() if c != "round_id"]
    # (and those that truncated a diverging suffix but must ask again before fetching)
    implied = followers.filter(~F.col("fetched") & (((F.col("appended") > 0)
                                                     & (F.col("fetch_offset") >= F.col("leader_leo_before")))
                                                    | F.col("epoch_checked")))
    leaders = (
        replicas.filter("is_leader").join(hw.select(*PARTITION_KEY, F.col("high_watermark").alias("_hw")),
                                          on=PARTITION_KEY, how="left")
        .filter((F.col("appended") > 0) | (F.col("_hw") != F.col("leader_hw_before"))
                | (F.col("leader_lso") != F.col("leader_lso_before")))
        .withColumns({"log_end_offset": F.col("leader_leo"), "fetch_offset": F.col("leader_leo"),
                      "log_start_offset": F.col("leader_lso"), "high_watermark": F.col("_hw")})
    )
    return (
        leaders.select(*cols)
        .unionByName(followers_after.filter(~F.col("is_settled") | F.col("moved")).select(*cols))
        .unionByName(implied.select(*cols))
        .withColumn("round_id", F.lit(round_id).cast("long"))
    ).localCheckpoint()


def _session_requests(inputs: RoundInputs, replicas: DataFrame, fetching: DataFrame,
                      dropped: DataFrame | None = None) -> DataFrame:
    """The partitions each fetch request carries: session_id, topic, partition, change. A full
    request carries every partition ('full'); an incremental one only those added, altered or
    removed against the leader's cache (KIP-227), which sits in the follower rows of replica_state
    (and in the rows of `dropped`, replicas a reassignment removed this round: removed)."""
    full = fetching.filter(F.col("fetch_kind") != "incremental").select(
        F.col("request_session_id").alias("session_id"), *PARTITION_KEY, F.lit("full").alias("change"))
    ids = [c.session_id for c in inputs.contexts if c.kind == "incremental"]
    if not ids:
        return full
    wanted = fetching.filter(F.col("fetch_kind") == "incremental").select(
        F.col("request_session_id").alias("session_id"), *PARTITION_KEY, "fetch_offset", "log_start_offset",
        F.col("partition_max_bytes").alias("max_bytes"))
    columns = ["session_id", *PARTITION_KEY, "fetch_offset", F.col("log_start_offset").alias("fetcher_log_start_offset"),
               F.col("session_max_bytes").alias("max_bytes")]
    cached = replicas.filter(~F.col("is_leader") & F.col("session_id").isin(ids)).select(*columns)
    if dropped is not None:
        cached = cached.unionByName(dropped.filter(F.col("session_id").isin(ids)).select(*columns))
    return full.unionByName(sessions.incremental_request(wanted, cached))


@per_partition_step
def _followers_after(fetching: DataFrame, response: DataFrame, hw: DataFrame, replicas: DataFrame,
                     round_id: int) -> DataFrame:
    """Followers after the response. `responded`: whether the response carried the partition
    (always in a full response; in an incremental one per KIP-227's rule, a partition new to the
    session counting as cached with HW -1). A partition left out keeps what its follower had. The
    session columns become the leader's cache entry after responding (none without a session)."""
    unknown = F.lit(-1).cast("long")
    in_cache = F.col("session_id") == F.col("request_session_id")
    cached_hw = F.when(in_cache, F.col("session_high_watermark")).otherwise(unknown)
    cached_lso = F.when(in_cache, F.col("session_leader_log_start_offset")).otherwise(unknown)
    responded = F.when(F.col("fetch_kind") != "incremental", F.lit(True)).otherwise(sessions.must_respond(
        F.col("records_received"), F.col("_leader_hw"), cached_hw, F.col("leader_lso"), cached_lso,
        F.lit(None).cast("string")))
    cached = (F.col("request_session_id") != sessions.INVALID_SESSION_ID) & F.col("fetch_kind").isin("full", "incremental")
    before = ["session_id", "session_max_bytes", "session_high_watermark", "session_leader_log_start_offset"]
    return (
        rules.follower_log_end(fetching, response, hw)
        .join(hw.select(*PARTITION_KEY, F.col("high_watermark").alias("_leader_hw")), on=PARTITION_KEY, how="left")
        .join(replicas.select(*REPLICA_KEY, F.col("log_end_offset").alias("_leo0"), F.col("fetch_offset").alias("_fo0"),
                              F.col("high_watermark").alias("_hw0"), F.col("log_start_offset").alias("_lso0"),
                              F.struct(*before).alias("_session0")),
              on=REPLICA_KEY, how="left")
        .withColumns({
            "responded": responded,
            "high_watermark": F.when(responded, F.col("high_watermark")).otherwise(F.col("_hw0")),
            "last_data_round": F.when(F.col("records_received") > 0, F.lit(round_id).cast("long"))
            .otherwise(F.col("last_data_round"))})
        .select("*", F.when(cached, F.col("request_session_id")).otherwise(0).alias("_sid"),
                F.when(cached, F.col("partition_max_bytes")).otherwise(0).alias("_smb"),
                F.when(cached & F.col("responded"), sessions.cached_high_watermark(F.col("_leader_hw"), F.lit(None)))
                .when(cached, cached_hw).otherwise(unknown).alias("_shw"),
                F.when(cached & F.col("responded"), F.col("leader_lso")).when(cached, cached_lso)
                .otherwise(unknown).alias("_slso"))
        .drop(*before)
        .withColumnsRenamed(dict(zip(["_sid", "_smb", "_shw", "_slso"], before)))
        .withColumns({
            "is_settled": _settled("leader_leo", "_leader_hw"),
            "moved": (F.col("_leo0") != F.col("log_end_offset")) | (F.col("_fo0") != F.col("fetch_offset"))
            | (F.col("_hw0") != F.col("high_watermark")) | (F.col("_lso0") != F.col("log_start_offset"))
            | (F.col("_session0") != F.struct(*before)) | F.col("epoch_checked")})
    ).localCheckpoint()


@per_partition_step
def _follow_up_fetch(replicas: DataFrame, followers: DataFrame, followers_after: DataFrame,
                     isr_changed: DataFrame, hw: DataFrame, now: int, down: list[int]
                     ) -> tuple[DataFrame, DataFrame, DataFrame]:
    """A Kafka fetcher sends its next fetch as soon as it has appended a response; its fetch offset
    (its new LEO) tells the leader what it wrote, and the leader's HW moves on at once
    (Partition.updateFollowerFetchState, then maybeIncrementLeaderHW). Here the followers that
    received records this round send that fetch in the same round, at the same time: the leader
    updates their fetch state (Replica.updateFetchState), recomputes the HW, and its response
    carries the new HW (in a session, the partition is in the incremental response when the HW
    changed), so the follower sets its HW to min(leader HW, own LEO). A follower that received no
    records from a leader sends it nothing more this round (Kafka's leader holds such a fetch until
    replica.fetch.wait.max.ms), and learns a new HW in the next round.

    Returns (followers after the round, the leaders' HW after it, the follow-up rows: broker,
    leader, topic, partition, fetch_kind, request_session_id, requested: true, responded: the HW
    moved). Its response's records are _follow_up_response's."""
    received = followers_after.filter(F.col("records_received") > 0)
    fetched = rules.update_follower_fetch_state(received.withColumn("fetch_offset", F.col("log_end_offset")), now)
    updated = ["fetch_offset", "last_caught_up_time_ms", "last_fetch_leader_leo", "last_fetch_time_ms"]
    changes = fetched.select(*REPLICA_KEY, *[F.col(c).alias(f"_new_{c}") for c in updated],
                             F.lit(True).alias("_new_followed_up"))

    def with_changes(df: DataFrame, flagged: bool = False) -> DataFrame:
        """`df` with the follow-up's fetch state where there was one (flagged: and `followed_up`)."""
        taken = [*updated, "followed_up"] if flagged else updated
        df = df.withColumn("followed_up", F.lit(False)) if flagged else df
        return (df.join(changes, on=REPLICA_KEY, how="left")
                .withColumns({c: F.coalesce(F.col(f"_new_{c}"), F.col(c)) for c in taken})
                .drop(*[f"_new_{c}" for c in [*updated, "followed_up"]]))

    hw_after = _high_watermark(replicas, with_changes(followers), isr_changed, now, down, start=hw)
    new_hw = hw_after.select(*PARTITION_KEY, F.col("high_watermark").alias("_hw2"))
    in_session = F.col("session_id") != sessions.INVALID_SESSION_ID
    follow_up = F.col("followed_up")
    after = (
        with_changes(followers_after, flagged=True).join(new_hw, on=PARTITION_KEY, how="left")
        .withColumns({  # (from the values before: _hw_moved compares with the HW before the follow-up)
            "high_watermark": F.when(follow_up, F.least(F.col("_hw2"), F.col("log_end_offset")))
            .otherwise(F.col("high_watermark")),
            "session_high_watermark": F.when(follow_up & in_session, F.col("_hw2"))
            .otherwise(F.col("session_high_watermark")),
            "_hw_moved": F.col("_hw2") != F.col("_leader_hw"),
            "_leader_hw": F.col("_hw2")})
        .withColumn("is_settled", _settled("leader_leo", "_leader_hw"))
        .drop("_hw2")
    ).localCheckpoint()
    follow_ups = after.filter("followed_up").select(
        "broker", "leader", *PARTITION_KEY, "fetch_kind", "request_session_id", F.lit(True).alias("requested"),
        F.col("_hw_moved").alias("responded"))
    return after.drop("followed_up", "_hw_moved"), hw_after, follow_ups


def _follow_up_response(followers_after: DataFrame, follow_ups: DataFrame, response: DataFrame,
                        records: DataFrame, slowed: list[int]) -> DataFrame | None:
    """The records the follow-up fetch's response carries (None: none). The follow-up is the next
    request of each (follower, leader) pair that received records, so it asks for every partition
    of the pair the follower fetched this round and is still behind on: from its new fetch offset,
    with the same limits, the partitions that returned records in the first response at the back
    (their `last_data_round` is this round's), and a replication quota's budget less what the
    first responses drew on it. `records`: the leader log rows the first response was read from
    (this round's appends and the older records of lagging followers), which hold every offset
    the follow-up can ask for. `slowed`: brokers whose fetcher Cluster.throttle_fetcher holds to
    its bytes per partition per round, which the first response spent: their follow-ups carry no
    records. A round whose first responses took everything runs one Spark job here and no more."""
    pairs = follow_ups.filter(~F.col("broker").isin(*slowed)).select("broker", "leader").distinct()
    behind = (followers_after.join(pairs, on=["broker", "leader"], how="left_semi")
              .filter(F.col("log_end_offset") < F.col("leader_leo")))
    if behind.limit(1).count() == 0:
        return None
    quota = ["leader_throttled", "follower_throttled", "leader_budget", "follower_budget"] \
        if "leader_throttled" in followers_after.columns else []
    request = behind.select("broker", "leader", *PARTITION_KEY, "fetch_offset", "partition_max_bytes",
                            "response_max_bytes", F.col("last_data_round").alias("fetch_order"), *quota)
    if quota:  # the budgets are the round's, shared with the first responses
        drawn = response.select("leader", "broker", "leader_throttled", "follower_throttled",
                                rules.record_size(F.col("key"), F.col("value")).alias("_size"))
        for side, by in (("leader", "leader"), ("follower", "broker")):
            used = drawn.filter(F.col(f"{side}_throttled")).groupBy(by).agg(F.sum("_size").alias("_used"))
            request = (request.join(F.broadcast(used), on=by, how="left")
                       .withColumn(f"{side}_budget", F.col(f"{side}_budget") - F.coalesce(F.col("_used"), F.lit(0)))
                       .drop("_used"))
    return rules.fetch_response_records(request, records).localCheckpoint()


@per_partition_step
def _after_follow_up_response(followers_after: DataFrame, follow_ups: DataFrame, more: DataFrame,
                              round_id: int) -> tuple[DataFrame, DataFrame]:
    """Followers after appending the follow-up's records: the LEO past the last record, the HW
    min(the leader's HW in the response, the new LEO), and the session's cached HW for a partition
    in the response. The leader learns the new LEO from the next round's fetch. Also the follow-up
    rows with `responded` where the response carried records (a partition of the pair the
    follow-up request did not carry, as its fetch offset had not moved, is in the response only)."""
    got = more.groupBy("broker", *PARTITION_KEY).agg(F.count(F.lit(1)).alias("_n2"),
                                                    F.max("offset").alias("_last2"))
    received = F.col("_n2").isNotNull()
    leo = F.when(received, F.greatest(F.col("log_end_offset"), F.col("_last2") + 1)).otherwise(F.col("log_end_offset"))
    in_session = F.col("session_id") != sessions.INVALID_SESSION_ID
    after = (
        followers_after.join(got, on=REPLICA_KEY, how="left")
        .withColumns({
            "log_end_offset": leo,
            "high_watermark": F.when(received, F.least(F.col("_leader_hw"), leo)).otherwise(F.col("high_watermark")),
            "session_high_watermark": F.when(received & in_session, F.col("_leader_hw"))
            .otherwise(F.col("session_high_watermark")),
            "records_received": F.col("records_received") + F.coalesce(F.col("_n2"), F.lit(0)),
            "last_data_round": F.when(received, F.lit(round_id).cast("long")).otherwise(F.col("last_data_round")),
            "moved": F.col("moved") | received})
        .withColumn("is_settled", _settled("leader_leo", "_leader_hw"))
        .drop("_n2", "_last2")
    ).localCheckpoint()
    carried = got.select(*REPLICA_KEY, F.lit(True).alias("_got"))
    rows = (
        follow_ups.join(carried, on=REPLICA_KEY, how="left")
        .withColumn("responded", F.col("responded") | F.coalesce(F.col("_got"), F.lit(False))).drop("_got")
        .unionByName(
            after.join(carried, on=REPLICA_KEY, how="left_semi").join(follow_ups, on=REPLICA_KEY, how="left_anti")
            .select("broker", "leader", *PARTITION_KEY, "fetch_kind", "request_session_id",
                    F.lit(False).alias("requested"), F.lit(True).alias("responded")))
    ).localCheckpoint()
    return after, rows


def _settled(leader_leo: str, leader_hw: str) -> Any:
    """An in-sync follower at the leader's LEO, HW and log start, known to the leader: nothing to
    replicate. (A follower outside the ISR is never settled: it has to fetch its way back in.)"""
    at_leader = (F.col("fetch_offset") == F.col("log_end_offset")) & (F.col("log_end_offset") == F.col(leader_leo))
    return (at_leader & (F.col("high_watermark") == F.col(leader_hw))
            & (F.col("log_start_offset") == F.col("leader_lso")) & F.array_contains(F.col("isr"), F.col("broker")))


def _settlement(followers: DataFrame, followers_after: DataFrame, hw: DataFrame) -> DataFrame:
    """Every follower of a live leader after the round: topic, partition, leader_leo,
    log_end_offset, is_settled (_settled; a follower that did not fetch, against the new HW)."""
    return followers_after.select(*PARTITION_KEY, "leader_leo", "log_end_offset", "is_settled").unionByName(
        followers.filter(~F.col("fetched")).join(hw.select(*PARTITION_KEY, F.col("high_watermark").alias("_h")),
                                                 on=PARTITION_KEY, how="left")
        .select(*PARTITION_KEY, "leader_leo", "log_end_offset", _settled("leader_leo", "_h").alias("is_settled")))


def _attention(followers: DataFrame, followers_after: DataFrame, hw: DataFrame) -> DataFrame:
    """topic, partition: the partitions the next round must look at again: a follower not settled,
    or one that has not validated its leader's epoch (it checks it by fetching: Kafka's
    lastFetchedEpoch), even with nothing to replicate."""
    unvalidated = F.coalesce(F.col("validated_leader_epoch"), F.lit(0)) < F.col("leader_epoch")
    return (_settlement(followers, followers_after, hw).filter(~F.col("is_settled")).select(*PARTITION_KEY)
            .unionByName(followers.filter(unvalidated).select(*PARTITION_KEY)).distinct())


# the partition counts of the rounds row (Kafka's gauges)
GAUGES = ("under_replicated_partitions", "under_min_isr_partitions", "at_min_isr_partitions", "offline_partitions")


def _gauge_rows(partitions: DataFrame, sign: int) -> DataFrame:
    """Each partition's contribution to GAUGES (sign -1: taken back, for a partition's row before
    the round)."""
    def flag(condition: Any, name: str) -> Any:
        return (condition.cast("long") * sign).alias(name)
    # (Kafka's isUnderReplicated: the ISR is smaller than the replication factor, which during a
    # reassignment is the target's: the replicas less those being removed)
    target = F.size("replicas") - F.size(F.coalesce(F.col("removing_replicas"), F.array().cast("array<int>")))
    return partitions.select(flag(F.size("isr") < target, "under_replicated"),
                             flag(F.size("isr") < F.col("min_isr"), "under_min_isr"),
                             flag(F.size("isr") == F.col("min_isr"), "at_min_isr"),
                             flag(F.col("leader") == NO_LEADER, "offline"))


def _summary(appended, response, followers, followers_after, isr_changed, hw, partitions_now,
             results, pending_after, state_out, prefixes, producers_out, requested, extra,
             before: DataFrame | None = None) -> dict[str, Any]:
    """Every figure the round needs on the driver, in one Spark job with one aggregation over the
    union of the steps' outputs (O(1) values, not per partition). Each step contributes columns of
    its own; the others are null in its rows, and every aggregate skips nulls. With `before` (the
    working set's partitions as the round found them) the partition counts are what the round
    changed them by."""
    key = F.concat_ws("/", F.col("topic"), F.col("partition").cast("string"))
    unsettled = _settlement(followers, followers_after, hw)
    status = F.col("status")
    rows = [
        appended.select(F.col("broker").alias("appended_broker")),
        response.select(F.col("broker").alias("response_broker")),
        *([response.filter(F.col("leader_throttled") | F.col("follower_throttled"))
           .groupBy("leader", "broker", "leader_throttled", "follower_throttled")
           .agg(F.sum(rules.record_size(F.col("key"), F.col("value"))).alias("bytes"))
           .select(F.struct("leader", "broker", "leader_throttled", "follower_throttled", "bytes")
                   .alias("throttled_bytes"))] if "leader_throttled" in response.columns else []),
        requested.select(F.lit(1).alias("requested")),
        followers_after.filter("responded").select(F.lit(1).alias("responded")),
        requested.filter(F.col("change").isin("added", "removed")).groupBy("session_id").agg(
            F.sum(F.when(F.col("change") == "added", 1).otherwise(-1)).alias("size_delta"))
        .select(F.struct("session_id", "size_delta").alias("session_size_delta")),
        isr_changed.select("isr_shrinks", "isr_expands"),
        _gauge_rows(partitions_now, 1),
        *([] if before is None else [_gauge_rows(before, -1)]),
        unsettled.select((F.col("leader_leo") - F.col("log_end_offset")).alias("lag"),
                         F.when(~F.col("is_settled"), key).alias("unsettled")),
        results.select((status == acks_rules.STATUS_ACKED).cast("long").alias("acked"),
                       (status == acks_rules.STATUS_ERROR).cast("long").alias("failed"),
                       F.lit(1).alias("result_row")),
        pending_after.select(F.lit(1).alias("pending")),
        state_out.select(F.lit(1).alias("state_row")),
        prefixes.select(F.col("broker").alias("prefix_broker")),
        producers_out.select(F.lit(1).alias("producer_batch")),
        *extra,
    ]
    union = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), rows)
    # the union has a task per partition of every step's output (41 tasks in a round of 1,000
    # records into 100 partitions); the aggregate needs no more tasks than the round's shuffles.
    # Side by side (two clusters, rounds interleaved in one process, a soak beside them), the
    # summary phase's median: 0.62 s against 0.91 s (P = 100, 12 rounds each), 0.86 s against
    # 1.03 s (P = 10,000, 6 each); bulk rounds of 400,000 records: 3.19 / 1.96 / 1.33 s against
    # 3.68 / 2.15 / 1.85 s
    union = union.coalesce(int(union.sparkSession.conf.get(_SHUFFLE_PARTITIONS)))
    zero = F.lit(0).cast("long")
    agg = union.agg(
        F.count("appended_broker").alias("records_appended"),
        F.collect_set("appended_broker").alias("leader_brokers"),
        F.count("response_broker").alias("records_replicated"),
        F.collect_set("response_broker").alias("follower_brokers"),
        (F.count("requested") + F.count("follow_up_requested")).alias("fetch_request_partitions"),
        (F.count("responded") + F.count("follow_up_responded")).alias("fetch_response_partitions"),
        F.collect_set("followed_up_session").alias("followed_up_sessions"),
        F.collect_list("session_size_delta").alias("session_size_deltas"),
        (F.collect_list("throttled_bytes") if "throttled_bytes" in union.columns
         else F.array()).alias("throttled_byte_rows"),
        F.coalesce(F.sum("isr_shrinks"), zero).alias("isr_shrinks"),
        F.coalesce(F.sum("isr_expands"), zero).alias("isr_expands"),
        F.coalesce(F.sum("under_replicated"), zero).alias("under_replicated_partitions"),
        F.coalesce(F.sum("under_min_isr"), zero).alias("under_min_isr_partitions"),
        F.coalesce(F.sum("at_min_isr"), zero).alias("at_min_isr_partitions"),
        F.coalesce(F.sum("offline"), zero).alias("offline_partitions"),
        F.coalesce(F.max("lag"), zero).alias("max_lag"),
        F.count_distinct("unsettled").alias("active_partitions"),
        F.coalesce(F.sum("acked"), zero).alias("requests_acked"),
        F.coalesce(F.sum("failed"), zero).alias("requests_failed"),
        F.count("result_row").alias("result_rows"),
        F.count("pending").alias("pending_requests"),
        F.count("state_row").alias("state_rows"),
        F.collect_set("prefix_broker").alias("prefix_brokers"),
        F.count("producer_batch").alias("producer_batches"),
        F.count("partition_change").alias("partition_changes") if "partition_change" in union.columns
        else F.lit(0).alias("partition_changes"),
        (F.count("election_row") if "election_row" in union.columns else F.lit(0)).alias("election_rows"),
        (F.collect_set("truncated_broker") if "truncated_broker" in union.columns
         else F.array().cast("array<int>")).alias("truncated_brokers"),
        (F.count("dropped_replica") if "dropped_replica" in union.columns else F.lit(0)).alias("dropped_replicas"),
    )
    row = agg.first().asDict()
    return {k: (v if v is not None else 0) for k, v in row.items()}


# -- the round -------------------------------------------------------------------------------

def table_versions(storage: Storage) -> tuple[int, ...]:
    return tuple(storage.version(t) for t in CARRIED_TABLES)


def _rows_changed(storage: Storage, carried: tuple[int, ...], seen: tuple[int, ...]) -> bool:
    """Whether another writer changed the rows of a carried table since the carry's versions. A
    commit that changes no rows (a maintenance pass's compaction or properties) keeps the carry:
    at P = 100,000 a round without one reads every partition again (33-53 s)."""
    return any(c != s and storage.rows_changed(t, c, s) for t, c, s in zip(CARRIED_TABLES, carried, seen))


@per_partition_step
def _carry_out(storage: Storage, seen: tuple[int, ...], wrote: dict[str, int], meta_rows: Keyed,
               state_rows: Keyed, isr_changed: DataFrame, pending_after: DataFrame,
               figures: dict[str, Any], attention: DataFrame, throttles: dict[int, int],
               state_table_rows: int, deferred: DataFrame | None) -> Carry | None:
    """The carry for the next round (`state_rows`: the replica state after this round), or None
    when another writer committed to a carried table during this round (its versions moved by
    more than this round's own commits)."""
    versions = table_versions(storage)
    if any(v != s + wrote[t] for t, v, s in zip(CARRIED_TABLES, versions, seen)):
        return None
    meta_rows = meta_rows.updated(isr_changed, figures["isr_shrinks"] + figures["isr_expands"])
    return Carry(versions, meta_rows, state_rows, pinned_without_history(pending_after),
                 pinned_without_history(attention), {g: int(figures[g]) for g in GAUGES}, dict(throttles),
                 state_table_rows, deferred)


# A round's shuffles carry its working set, so one partition suits it (pipeline/spark.py); a round
# whose inbox holds a backlog gets one shuffle partition per this many new records, as one task
# sorting a 5,000,000-record inbox ran out of execution memory at 2 GB of driver memory
BULK_ROWS_PER_SHUFFLE_PARTITION = 500_000
_SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
# Interpreted expressions suit small rounds (no compiles); a bulk round (this many new inbox records,
# or followers that fetched this many in the last round and may still be behind) compiles them:
# 1,000,000 records, 100 partitions, rounds 1-3 took 61.8 / 28.1 / 24.4 s interpreted and
# 41.5 / 22.3 / 17.0 s compiled (jobs/benchmark.py --scenario throughput --max-rounds 3). It also
# broadcasts the per-partition side of its joins with records (pipeline/spark.py), which a small
# round does not: a broadcast is a job of its own. Its steps over per-partition rows still
# interpret theirs (@per_partition_step)
BULK_ROWS_FOR_CODEGEN = 100_000
_BULK = {**COMPILED_EXPRESSIONS, BROADCAST_SMALL_SIDES: "true"}


def shuffle_partitions_for(new_records: int, configured: int) -> int:
    """The round's shuffle partitions: the session's own, or more for a backlog of new records."""
    return max(configured, -(-new_records // BULK_ROWS_PER_SHUFFLE_PARTITION))


def run_round(spark: SparkSession, storage: Storage, inputs: RoundInputs,
              carry: Carry | None = None) -> tuple[RoundReport, Carry | None]:
    """One fetch round: leader append, follower fetch, ISR, high watermark, acks, metrics. Returns
    its report and what it carries to the next round (`carry` is the previous round's). A bulk
    round's Spark settings (shuffle partitions, code generation, broadcast joins) hold for that round
    only."""
    with settings_restored(spark, (_SHUFFLE_PARTITIONS, *_BULK)) as configured:
        return _run_round(spark, storage, inputs, carry, int(configured[_SHUFFLE_PARTITIONS]))


def _bulk_settings(spark: SparkSession, new_records: int, last_replicated: int, shuffle_partitions: int) -> None:
    spark.conf.set(_SHUFFLE_PARTITIONS, shuffle_partitions_for(new_records, shuffle_partitions))
    if max(new_records, last_replicated) >= BULK_ROWS_FOR_CODEGEN:
        apply_settings(spark, _BULK)


def _run_round(spark: SparkSession, storage: Storage, inputs: RoundInputs, carry: Carry | None,
               shuffle_partitions: int) -> tuple[RoundReport, Carry | None]:
    started = time.perf_counter()
    now, round_id = inputs.now_ms, inputs.round_id

    watch = _Stopwatch(spark)
    inputs = with_input_versions(storage, inputs)
    seen = table_versions(storage)
    if carry is not None and _rows_changed(storage, carry.versions, seen):
        carry = None
    meta_before, state_rows = _read_meta_state(storage, inputs, carry)
    meta_rows, state_rows, step = _controller_step(storage, inputs, meta_before, state_rows)  # 1. controller
    changed, state_changed, elections = step.changed, step.state_changed, step.elections
    watch.lap("read meta and state, controller")
    lso_requests, admin_version = _log_start_requests(spark, storage, inputs, _serving(meta_rows.all(), inputs),
                                                      state_rows.all())
    watch.lap("log start requests")
    inbox, inbox_version = _read_inbox(spark, storage, inputs.last_inbox_version, inputs.inbox_to_version)
    deferred = carry.deferred if carry is not None else _deferred_requests(storage, inputs.last_throttled_requests)
    inbox, quota = _client_quotas(spark, inbox, deferred, inputs)                # client quotas
    inbox = inbox.localCheckpoint()
    _bulk_settings(spark, inbox.count() if inbox_version > inputs.last_inbox_version else 0,
                   inputs.last_records_replicated, shuffle_partitions)
    pending = carry.pending if carry is not None else \
        _pending_results(storage, inputs.last_pending_requests).localCheckpoint()
    watch.lap("read inbox and pending results")
    # the partitions this round can change (None: all); every step below sees only those
    work = _working_set(inputs, carry, meta_rows.all(), changed, inbox, pending, lso_requests)
    meta = pinned(meta_rows.within(work))
    serving = _serving(meta, inputs)
    replicas = _with_leader_log_start(_read_replicas(spark, inputs, serving, state_rows.within(work)), lso_requests)
    watch.lap("working set, read replicas")
    validated = rules.validate_produce_requests(
        inbox, serving.select(*PARTITION_KEY, "leader", "leader_epoch", "isr", "min_isr", "message_max_bytes", "compact")
    ).localCheckpoint()
    watch.lap("validate inbox")
    validated, producer_checks = _check_idempotent_producers(storage, validated)

    watch.lap("producer state")
    appended, replicas = _leader_append(validated, replicas)                       # 2. leader append
    replicas, truncations = _epoch_checks(storage, inputs, replicas)
    if step.dropped is not None:  # a reassignment deletes a dropped replica's log, and empties a new one's
        emptied = (step.dropped.select("broker", *PARTITION_KEY).unionByName(step.added.select("broker", *PARTITION_KEY))
                   .withColumn("truncate_to", F.lit(0).cast("long")))
        truncations = emptied if truncations is None else truncations.unionByName(emptied)
    followers = _fetch(replicas, now, inputs.restarted)                            # 3. fetch
    isr_changed = _isr_changes(meta, followers, now)                               # 5. ISR
    hw = _high_watermark(replicas, followers, isr_changed, now, (inputs.controller or {}).get("down") or [])

    fetching = followers.filter("fetched")                                         # 4. response
    requested = _session_requests(inputs, replicas, fetching, step.dropped)
    old = _old_leader_records(storage, fetching.filter(F.col("fetch_offset") < F.col("leader_leo_before")),
                              _serving_brokers(inputs))
    source = appended.select(*LOG_SCHEMA.fieldNames(), "broker")
    source = source if old is None else source.unionByName(old)
    response = rules.fetch_response_records(fetching.withColumnRenamed("last_data_round", "fetch_order"),
                                            source).localCheckpoint()
    followers_after = _followers_after(fetching, response, hw, replicas, round_id)
    followers_after, hw, follow_ups = _follow_up_fetch(                             # 3-4 again: follow-up
        replicas, followers, followers_after, isr_changed, hw, now, (inputs.controller or {}).get("down") or [])
    more = _follow_up_response(followers_after, follow_ups, response, source,
                               sorted(b for b, limit in inputs.throttles.items() if limit))
    if more is not None:  # the follow-up's response carried records too
        followers_after, follow_ups = _after_follow_up_response(followers_after, follow_ups, more, round_id)
        response = response.unionByName(more)

    partitions_now = _with_isr(meta, isr_changed).join(hw, on=PARTITION_KEY, how="left")   # 6. acks
    new_leaders = None if elections is None else \
        elections.filter(F.col("leader") != F.col("previous_leader")).select(*PARTITION_KEY).distinct()
    results = _results(validated, appended, pending, partitions_now, producer_checks, round_id, new_leaders,
                       quota.held)
    if quota.waiting_results is not None:
        results = results.unionByName(quota.waiting_results).localCheckpoint()
    producers_out = _producer_state_rows(appended, producer_checks, round_id)
    pending_after = pending.unionByName(
        results.filter(F.col("status") == acks_rules.STATUS_PENDING).drop("round_id")
    ).join(results.filter(F.col("status") != acks_rules.STATUS_PENDING), on=REQUEST_KEY, how="left_anti")
    state_out = _state_rows(replicas, hw, followers, followers_after, round_id)
    if state_changed is not None:  # the controller's rows, where the round did not rewrite them
        state_out = state_out.unionByName(
            state_changed.join(state_out.select(*REPLICA_KEY), on=REPLICA_KEY, how="left_anti")
            .withColumn("round_id", F.lit(round_id).cast("long")).select(*state_out.columns)).localCheckpoint()
    partition_rows = isr_changed.select(*meta.columns)
    if changed is not None:
        partition_rows = changed.join(isr_changed.select(*PARTITION_KEY), on=PARTITION_KEY, how="left_anti") \
            .unionByName(partition_rows)
    prefixes = state_out.join(replicas.select(*REPLICA_KEY, F.col("log_start_offset").alias("_lso0")),
                              on=REPLICA_KEY, how="inner").filter(F.col("log_start_offset") > F.col("_lso0"))
    watch.lap("plan and old records")
    extra = [partition_rows.select(F.lit(1).alias("partition_change"))]
    if elections is not None:
        extra.append(elections.select(F.lit(1).alias("election_row")))
    if truncations is not None:
        extra.append(truncations.select(F.col("broker").alias("truncated_broker")))
    if step.dropped is not None:
        extra.append(step.dropped.select(F.lit(1).alias("dropped_replica")))
    extra += _follow_up_rows(fetching, follow_ups)
    figures = _summary(appended, response, followers, followers_after, isr_changed, hw, partitions_now,
                       results, pending_after, state_out, prefixes, producers_out, requested, extra,
                       before=None if work is None else meta if meta_rows is meta_before
                       else meta_before.within(work))
    if work is not None:  # the counts over the working set moved the last round's
        figures.update({g: carry.gauges[g] + figures[g] for g in GAUGES})

    # commits: a diverging suffix goes before appending; the ISR changes before the HW they allow
    # (DESIGN.md: persisted before they take effect); then each broker's log once (its leader and
    # follower appends together), elections, replica state, producers and results, at once; the
    # prefixes below new log start offsets after the appends; the rounds row last (recovery.py)
    watch.lap("compute (summary job)")
    for broker in sorted(figures["truncated_brokers"]):
        if not storage.path_exists(f"{storage.log_path(broker)}/_delta_log"):
            continue  # a stopped broker's lost log directory: it restarts empty (Cluster.start_broker)
        storage.truncate_logs(broker, truncations.filter(F.col("broker") == broker).drop("broker"), round_id)
    if figures["partition_changes"]:
        storage.upsert(partition_rows.withColumn("round_id", F.lit(round_id).cast("long"))
                       .select(*PARTITIONS_SCHEMA.fieldNames()), "partitions", PARTITION_KEY, round_id)
    watch.lap("commit truncations and ISR")
    log_rows = appended.select(*LOG_SCHEMA.fieldNames(), "broker").unionByName(response.select(
        *LOG_SCHEMA.fieldNames(), "broker"))
    appends = [(log_rows.filter(F.col("broker") == broker).select(*LOG_SCHEMA.fieldNames()), storage.log_path(broker))
               for broker in sorted(set(figures["leader_brokers"]) | set(figures["follower_brokers"]))]
    appends += [(df, storage.path(table)) for df, table, rows in (
        (elections, "elections", figures["election_rows"]), (producers_out, "producers", figures["producer_batches"]))
        if rows]
    # the HW (replica_state) and the acks it allows (results) only once the records below it are in
    # every log: the follow-up fetch moves the HW over records this round appends, and a reader of
    # replog.committed must never find the HW past what the leader's log shows
    answers = [(df, storage.path(table)) for df, table, rows in (
        (state_out, "replica_state", figures["state_rows"]), (results, "results", figures["result_rows"])) if rows]
    if appends:
        storage.append_all(appends, round_id)
        watch.lap("commit logs, elections, producers")
    storage.append_all(answers, round_id)
    watch.lap("commit state, results")
    for broker in sorted(figures["prefix_brokers"]):
        storage.delete_log_prefixes(broker, prefixes.filter(F.col("broker") == broker)
                                    .select(*PARTITION_KEY, "log_start_offset"), round_id)
    if figures["dropped_replicas"]:  # after the appends: the rows of replicas a reassignment removed
        storage.delete_replicas(step.dropped.select(*REPLICA_KEY), round_id)
    watch.lap("commit prefixes")
    deltas = {d["session_id"]: d["size_delta"] for d in figures["session_size_deltas"]}
    after = [replace(s, size=s.size + deltas.get(s.session_id, 0)) for s in inputs.sessions_after]
    after, handles = sessions.follow_up(after, inputs.handles_after, set(figures["followed_up_sessions"]))
    report = RoundReport(
        round_id=round_id, now_ms=now, inbox_version=inbox_version, admin_version=admin_version,
        retention_checked_ms=now if inputs.retention_due else inputs.last_retention_check_ms,
        **{f: int(figures[f]) for f in RoundReport.__dataclass_fields__ if f in figures},
        duration_ms=int((time.perf_counter() - started) * 1000), batch_id=inputs.batch_id,
        **_session_figures(inputs, after, handles), throttled_bytes=_throttled_bytes(figures["throttled_byte_rows"]),
        throttled_requests=quota.waiting, client_quota_bytes=quota.recorded,
    )
    storage.append_table(spark.createDataFrame([tuple(report.as_dict().values())], ROUNDS_SCHEMA), "rounds", round_id)
    watch.lap("commit rounds row")
    # replica_state's rows: as many current ones as replicas, and the table's (counted from its
    # files' statistics when not carried)
    table_rows = (carry.state_table_rows if carry is not None else storage.read("replica_state").count())
    state_after = state_rows.updated(state_out.drop("round_id"), figures["state_rows"])
    own_state_commits = int(bool(figures["state_rows"])) + int(bool(figures["dropped_replicas"]))
    table_rows, compacted = _compact_state_if_due(
        storage, state_rows.base_rows, table_rows + figures["state_rows"], round_id, state_after,
        seen[CARRIED_TABLES.index("replica_state")] + own_state_commits)
    wrote = {"replica_state": own_state_commits + int(compacted),
             "topics": 0, "results": int(bool(figures["result_rows"])),
             "partitions": int(bool(figures["partition_changes"]))}
    carry_out = _carry_out(storage, seen, wrote, meta_rows, state_after, isr_changed, pending_after,
                           figures, _attention(followers, followers_after, hw), inputs.throttles, table_rows,
                           quota.deferred)
    watch.lap("carry")
    watch.stop()
    return report, carry_out


def _follow_up_rows(fetching: DataFrame, follow_ups: DataFrame) -> list[DataFrame]:
    """The follow-up fetches' rows for the summary. In a session the follow-up is incremental: it
    carries the partitions whose fetch offset moved, and its response those whose HW moved
    (KIP-227). Without one (replication.fetch.mode=full, or no room in the cache) it is a full
    request again: every partition the follower fetches from that leader, in request and response."""
    in_session = F.col("fetch_kind").isin("full", "incremental") & (
        F.col("request_session_id") != sessions.INVALID_SESSION_ID)
    pairs = follow_ups.filter(~in_session).select("broker", "leader").distinct()
    full = (fetching.filter(~in_session).join(pairs, on=["broker", "leader"], how="left_semi")
            .select(F.lit(1).alias("follow_up_requested"), F.lit(1).alias("follow_up_responded")))
    incremental = follow_ups.filter(in_session)
    return [full,
            incremental.select(F.when(F.col("requested"), F.lit(1)).alias("follow_up_requested"),
                               F.when(F.col("responded"), F.lit(1)).alias("follow_up_responded"),
                               F.col("request_session_id").alias("followed_up_session"))]


def _throttled_bytes(rows: list) -> dict[tuple[str, int], int]:
    """The summary's throttled bytes as ("leader" | "follower", broker) -> bytes."""
    spent: dict[tuple[str, int], int] = {}
    for r in rows:
        for side, flag, broker in (("leader", "leader_throttled", "leader"), ("follower", "follower_throttled", "broker")):
            if r[flag]:
                spent[(side, r[broker])] = spent.get((side, r[broker]), 0) + int(r["bytes"])
    return spent


def _session_figures(inputs: RoundInputs, after: list, handles: list) -> dict[str, Any]:
    return {"incremental_fetch_sessions": len(after),
            "incremental_fetch_partitions_cached": sum(s.size for s in after),
            "fetch_session_evictions": inputs.session_evictions,
            "fetch_sessions": sessions.sessions_to_json(after, handles, inputs.contexts)}


def idle_round(spark: SparkSession, storage: Storage, inputs: RoundInputs, previous: RoundReport) -> RoundReport:
    """A round with nothing to do (no new produce, every partition settled, no pending request, no
    broker change): it writes only its metrics row, carrying the cluster's health over."""
    started = time.perf_counter()
    storage.round_inputs = f"now={inputs.now_ms}"
    report = replace(
        previous, round_id=inputs.round_id, now_ms=inputs.now_ms, inbox_version=inputs.last_inbox_version,
        fetch_request_partitions=0, fetch_response_partitions=0, records_appended=0, records_replicated=0,
        requests_acked=0, requests_failed=0, isr_shrinks=0, isr_expands=0, batch_id=inputs.batch_id,
        throttled_bytes={}, client_quota_bytes={},
        duration_ms=int((time.perf_counter() - started) * 1000),
        **_session_figures(inputs, inputs.sessions_after, inputs.handles_after))
    storage.append_table(spark.createDataFrame([tuple(report.as_dict().values())], ROUNDS_SCHEMA), "rounds",
                         inputs.round_id)
    return report
