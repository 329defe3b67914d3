"""The controller's wave of a v2 round: elections, and followers validating a new leader epoch.

A v2 round runs it before its control job, and only when there is something to do: a broker to
fence or unfence (Kafka's controller elects leaders without it, then with it back), a preferred
leader election asked, or a follower that fetches this round and has not checked its log against
its leader's current epoch. The rules are the controller's and the leader epoch's
(pipeline/control/controller.py), on the replica rows of the tables; the wave hands the control job the
partition state after them.

A follower's check follows Kafka's fetcher: it sends the epoch of its last record, the leader
answers where that epoch ends for it, and the follower truncates its log there
(AbstractFetcherThread.truncateOnFetchResponse). A follower that knows only an older epoch than the
answer truncates to its own end of that one and asks again (KIP-279); Kafka's fetcher asks in its
next iteration before fetching any record, and so does the wave, within the round, until every
fetching follower has a log that is a prefix of its leader's. Followers that do not fetch this
round (paused, stopped, refused a session) keep their old validated epoch and check when they fetch.

Reassignments (KIP-455) start and complete in the wave too: a replica a reassignment adds starts
with an empty log at the partition's log start offset and fetches as a follower, out of the ISR
until it catches up (the control job expands the ISR as for any follower); one it drops loses its
log and its replica row.

The wave's commits come first in the round: each follower's diverging suffix and the logs of
replicas a reassignment adds or drops, then the partitions the controller changed (before any HW
they allow) with its election rows, then the dropped replicas' rows."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import reduce

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipeline.control import controller as ctl
from pipeline.round.carry import pinned, pinned_without_history
from pipeline.control.controller import NO_LEADER
from pipeline.round.inputs import RoundInputs
from pipeline.round.reads import fetch_pairs, partition_meta, read_replicas, serving, serving_brokers
from pipeline.schemas import ELECTIONS_SCHEMA, PARTITION_KEY, PARTITIONS_SCHEMA, REPLICA_KEY, REPLICA_STATE_SCHEMA
from pipeline.storage import Storage

__all__ = ["ControllerWave", "controller_wave", "unvalidated_brokers", "controller_requests_asked", "controller_step",
           "ControllerStep"]

_FETCH_KINDS = ("full", "sessionless", "incremental")  # fetch contexts that serve data (not "error")


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

def controller_step(storage: Storage, inputs: RoundInputs, meta: DataFrame, state: DataFrame
                    ) -> tuple[DataFrame, DataFrame, ControllerStep]:
    """Fences the brokers whose session ended and unfences the restarted ones, as Kafka's controller
    does in two steps (handleBrokerFenced, then handleBrokerUnfenced): the first election runs
    without the fenced and restarting brokers, the second with the restarting ones back. Then
    preferred leader elections, new reassignments and reassignments that can complete (KIP-455).

    meta: every partition with its topic's settings; state: every replica's row (both pinned).
    Returns (meta, state, what changed), pinned. A new leader starts at the partition's HW
    (controller.new_leader_high_watermark), a new leader epoch starts at its leader's LEO (kept in
    the partition's leader_epoch_start_offset), and a new leader resets its followers."""
    decisions = inputs.controller or {}
    preferred = _preferred_election_requests(storage, inputs)
    reassign = _reassignment_requests(storage, inputs)
    if not (decisions.get("fence") or decisions.get("unfence")) and preferred is None and reassign is None \
            and not inputs.reassigning:
        return meta, state, ControllerStep()
    after, steps, moves = _decisions(meta, inputs, preferred, reassign)
    changed_keys = pinned(reduce(DataFrame.unionByName, [s.select(*PARTITION_KEY) for s in steps]).distinct())
    if not changed_keys.limit(1).collect():  # (a reassignment still catching up)
        return meta, state, ControllerStep()
    state, dropped, added = _moved_replicas(state, moves, after, inputs.now_ms)
    offsets = state.groupBy(*PARTITION_KEY).agg(F.max("high_watermark").alias("partition_hw"))
    leos = state.select(*PARTITION_KEY, F.col("broker").alias("leader"), F.col("log_end_offset").alias("leader_leo"))
    changed, led = _changed_partitions(meta, after, changed_keys, offsets, leos)
    state_changed = _new_leaders_replicas(state, led, added, inputs.now_ms)
    state = (state.join(state_changed.select(*REPLICA_KEY), on=REPLICA_KEY, how="left_anti")
             .unionByName(state_changed))
    elections = pinned(reduce(DataFrame.unionByName, [_election_rows(s, offsets, leos, inputs) for s in steps])
                       .select(*ELECTIONS_SCHEMA.fieldNames()))
    return (_apply_changes(meta, changed), pinned_without_history(state),
            ControllerStep(changed, state_changed, elections, dropped, added))


def _decisions(meta: DataFrame, inputs: RoundInputs, preferred: DataFrame | None, reassign: DataFrame | None
               ) -> tuple[DataFrame, list[DataFrame], list[DataFrame]]:
    """The controller's decisions in Kafka's order: fence then unfence (two elections), preferred
    leader elections, new reassignments, completed ones. Returns the partitions after them, each
    step's changed partitions, and the reassignments' moves (with the brokers they add and drop)."""
    decisions = inputs.controller or {}
    live = decisions.get("live", inputs.brokers)
    steps, moves = [], []
    after = meta
    if decisions.get("fence") or decisions.get("unfence"):
        first = ctl.elect_leaders(meta, decisions["live_before_start"], decisions["lost_log"]).localCheckpoint()
        middle = _apply_changes(meta, first)
        second = ctl.elect_leaders(middle, decisions["live"]).localCheckpoint()
        after = _apply_changes(middle, second)
        steps += [first, second]
    if preferred is not None:  # kafka-leader-election --election-type PREFERRED
        named = (after.join(preferred.filter(F.col("partition") >= 0), on=PARTITION_KEY, how="left_semi")
                 .unionByName(after.join(preferred.filter(F.col("partition") < 0).select("topic"), on="topic",
                                         how="left_semi")))
        third = ctl.elect_preferred_leaders(named.dropDuplicates(PARTITION_KEY), live).localCheckpoint()
        after = _apply_changes(after, third)
        steps.append(third)
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
    return after, steps, moves


def _moved_replicas(state: DataFrame, moves: list[DataFrame], after: DataFrame, now_ms: int
                    ) -> tuple[DataFrame, DataFrame | None, DataFrame | None]:
    """The replica rows after the reassignments' moves: the dropped replicas' rows gone, the added
    ones' new (bootstrapping from the leader's log start). Returns (state, dropped, added)."""
    if not moves:
        return state, None, None

    def brokers(column: str) -> DataFrame:
        return reduce(DataFrame.unionByName, [
            m.select(*PARTITION_KEY, F.explode(column).alias("broker"), "leader_epoch") for m in moves])
    dropped = pinned(state.join(brokers("dropped").select(*REPLICA_KEY), on=REPLICA_KEY, how="left_semi"))
    added = brokers("added").join(after.select(*PARTITION_KEY, F.col("leader_epoch").alias("epoch_after")),
                                  on=PARTITION_KEY).select(*REPLICA_KEY, F.col("epoch_after").alias("leader_epoch"))
    added = pinned(_added_replica_rows(added, state, now_ms).select(*state.columns))
    state = (state.join(dropped.select(*REPLICA_KEY), on=REPLICA_KEY, how="left_anti")
             .join(added.select(*REPLICA_KEY), on=REPLICA_KEY, how="left_anti").unionByName(added))
    return state, dropped, added


def _changed_partitions(meta: DataFrame, after: DataFrame, changed_keys: DataFrame, offsets: DataFrame,
                        leos: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(the changed partitions' rows, pinned, a new leader epoch starting at its leader's LEO;
    those with a new leader, with the partition's HW and the leader's LEO)."""
    before = meta.select(*PARTITION_KEY, F.col("leader").alias("old_leader"), F.col("leader_epoch").alias("old_epoch"))
    moved = (after.join(changed_keys, on=PARTITION_KEY, how="left_semi").join(before, on=PARTITION_KEY)
             .join(offsets, on=PARTITION_KEY, how="left").join(leos, on=[*PARTITION_KEY, "leader"], how="left"))
    led = moved.filter((F.col("leader") != F.col("old_leader")) & (F.col("leader") != NO_LEADER))
    # a new leader epoch (a new leader, or a completed reassignment) starts at its leader's LEO
    changed = (moved.withColumn("leader_epoch_start_offset", F.when(
        (F.col("leader_epoch") != F.col("old_epoch")) & (F.col("leader") != NO_LEADER), F.col("leader_leo"))
        .otherwise(F.col("leader_epoch_start_offset")))
        .select(*meta.columns)).localCheckpoint()
    return changed, led


def _new_leaders_replicas(state: DataFrame, led: DataFrame, added: DataFrame | None, now_ms: int) -> DataFrame:
    """The replica rows the controller changed, pinned: each new leader at the partition's HW
    (new_leader_high_watermark), its followers reset, and the added replicas."""
    new_hw = ctl.new_leader_high_watermark(F.col("partition_hw"), F.col("leader_leo"))
    part = led.select(*PARTITION_KEY, "leader", "isr", "leader_leo", "partition_hw")
    rows = state.join(part, on=PARTITION_KEY, how="inner")
    leaders = (rows.filter(F.col("broker") == F.col("leader"))
               .withColumn("high_watermark", new_hw).withColumn("fetch_offset", F.col("log_end_offset")))
    followers = ctl.reset_followers_for_new_leader(rows.filter(F.col("broker") != F.col("leader")), now_ms)
    changed = leaders.unionByName(followers).select(*state.columns)
    if added is not None:
        changed = added.join(changed.select(*REPLICA_KEY), on=REPLICA_KEY, how="left_anti").unionByName(changed)
    return pinned(changed)


def _election_rows(step: DataFrame, offsets: DataFrame, leos: DataFrame, inputs: RoundInputs) -> DataFrame:
    """The elections table's rows of one step's leader changes."""
    e = (step.filter(F.col("election").isNotNull()).join(offsets, on=PARTITION_KEY, how="left")
         .join(leos, on=[*PARTITION_KEY, "leader"], how="left"))
    led = F.col("leader") != NO_LEADER
    return e.select(F.lit(inputs.round_id).cast("long").alias("round_id"),
                    F.lit(inputs.now_ms).cast("long").alias("now_ms"), *PARTITION_KEY, "election",
                    "previous_leader", "leader", "leader_epoch",
                    F.when(led, F.col("leader_leo")).alias("start_offset"),
                    F.when(led, ctl.new_leader_high_watermark(F.col("partition_hw"), F.col("leader_leo")))
                    .alias("high_watermark"),
                    F.when(led, F.greatest(F.col("partition_hw") - F.col("leader_leo"), F.lit(0))).otherwise(F.lit(0))
                    .cast("long").alias("offsets_lost"), "isr")


def _apply_changes(meta: DataFrame, changes: DataFrame) -> DataFrame:
    return pinned(meta.join(changes.select(*PARTITION_KEY), on=PARTITION_KEY, how="left_anti")
                .unionByName(changes.select(*meta.columns)))

def epoch_checks(storage: Storage, inputs: RoundInputs, replicas: DataFrame) -> tuple[DataFrame, DataFrame | None]:
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
    checked, follower_cache = _leaders_answers(storage, inputs, need)
    outcomes = _truncations_asked(checked, follower_cache)
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


def _leaders_answers(storage: Storage, inputs: RoundInputs, need: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Each checking follower's lastFetchedEpoch (the epoch of its last record, from its log's
    epoch cache) and its leader's answer (OffsetsForLeaderEpoch: the end epoch and offset its cache
    has for it), with the outcome (diverging, out_of_range or None); and the followers' caches."""
    logs = reduce(DataFrame.unionByName, [storage.read_log(b).withColumn("broker", F.lit(b))
                                          for b in serving_brokers(inputs)])
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
    return checked, follower_cache


def _truncations_asked(checked: DataFrame, follower_cache: DataFrame) -> DataFrame:
    """Where each checked follower truncates (truncate_to; None: nowhere) and whether its check is
    complete (AbstractFetcherThread.truncateOnFetchResponse), pinned."""
    own = (ctl.end_offset_for_epoch(
        checked.filter(F.col("outcome") == "diverging").select(
            *REPLICA_KEY, F.col("end_epoch").alias("requested_epoch"), "log_end_offset", "log_start_offset"),
        follower_cache)
        .select(*REPLICA_KEY, F.col("end_epoch").alias("own_epoch"), F.col("end_offset").alias("own_offset")))
    offset, completed = ctl.truncation_offset(F.col("end_epoch"), F.col("end_offset"), F.col("own_epoch"),
                                              F.col("own_offset"), F.col("log_end_offset"))
    return (checked.join(own, on=REPLICA_KEY, how="left")
            .withColumn("truncate_to", F.when(F.col("outcome") == "diverging", offset)
                        .when(F.col("outcome") == "out_of_range", F.least("log_end_offset", "leader_leo")))
            .withColumn("completed", F.when(F.col("outcome") == "diverging", completed).otherwise(F.lit(True)))
            .select(*REPLICA_KEY, "truncate_to", "completed")).localCheckpoint()


# rounds of epoch checks within one round before giving up on a follower (each asks for an older
# epoch of the follower's own log, so a log with fewer epochs than this is always done)
MAX_EPOCH_CHECKS = 32


@dataclass(frozen=True)
class ControllerWave:
    """What the wave leaves to the round: every partition with its topic's settings after the
    controller (round._partition_meta's columns, pinned), every replica's row after the elections
    and truncations (REPLICA_STATE_SCHEMA, round_id the round's, pinned), the partitions whose
    replica rows the wave changed (the round persists them even if its control job does not change
    them again), the partitions with a new leader (their pending acks=all requests fail) and the
    brokers whose replicas still have an epoch to validate; and per fetch session the partitions
    a reassignment took out of it (their replica left the follower's broker)."""

    meta: DataFrame
    replica_rows: DataFrame
    touched: DataFrame
    new_leaders: DataFrame | None
    unvalidated: frozenset[int]
    sessions_removed: dict = field(default_factory=dict)
    # the round's inputs with its fetch sessions planned for the leaders after the elections
    inputs: RoundInputs | None = None


def _unvalidated(rows: DataFrame) -> DataFrame:
    """Follower rows (with the partition's leader and leader_epoch) that have not validated it."""
    return rows.filter((F.col("broker") != F.col("leader")) & (F.col("leader") != NO_LEADER)
                       & (F.coalesce(F.col("validated_leader_epoch"), F.lit(0)) < F.col("leader_epoch")))


def unvalidated_brokers(state: DataFrame, partitions: DataFrame) -> frozenset[int]:
    """The brokers with a follower replica that has not validated its partition's leader epoch
    (state: replica rows; partitions: topic, partition, leader, leader_epoch): one Spark job, an
    O(brokers) collect."""
    rows = state.join(partitions.select(*PARTITION_KEY, "leader", "leader_epoch"), on=PARTITION_KEY)
    return frozenset(r["broker"] for r in _unvalidated(rows).select("broker").distinct().collect())


def controller_requests_asked(storage: Storage, inputs: RoundInputs) -> bool:
    """Whether the round's new admin requests ask the controller for something: a preferred leader
    election or a reassignment (read only when commits to the admin table changed rows: a
    maintenance pass's change none)."""
    if not (inputs.admin_to_version > inputs.last_admin_version
            and storage.rows_changed("admin", inputs.last_admin_version, inputs.admin_to_version)):
        return False
    return bool(storage.read_changes("admin", inputs.last_admin_version, inputs.admin_to_version)
                .filter(F.col("kind").isin("elect_preferred", "reassign")).limit(1).count())


def delete_strays(storage: Storage, inputs: RoundInputs, state: DataFrame, round_id: int) -> None:
    """A restarted broker, in the round that unfences it and before it fetches, removes the records
    of its log that no replica of it holds (state: the replica rows after the controller's step):
    those of replicas a reassignment dropped or added while the broker was down, which the controller
    could not remove then. Kafka's broker deletes such stray replicas' logs as it starts
    (KAFKA-14616). One MERGE per restarted broker whose log was kept (a lost log restarts empty)."""
    decisions = inputs.controller or {}
    for broker in sorted(set(decisions.get("unfence") or []) - set(decisions.get("lost_log") or [])):
        kept = state.filter(F.col("broker") == broker).select(*PARTITION_KEY, "log_start_offset", "log_end_offset")
        storage.delete_stray_records(broker, kept, round_id)


def controller_wave(spark: SparkSession, storage: Storage, inputs: RoundInputs) -> ControllerWave:
    """The round's elections and epoch checks on the tables (`inputs` with its versions fixed), with
    their commits: truncated logs, then the partitions the controller changed and its elections."""
    meta_df, state, step = controller_step(
        storage, inputs, pinned_without_history(partition_meta(storage, inputs.cluster_config)),
        pinned_without_history(storage.replica_state().drop("round_id")))
    # the partitions whose leader the round's elections changed (one pass, before anything is written)
    new_leaders = None if step.elections is None else (
        step.elections.filter(F.col("leader") != F.col("previous_leader")).select(*PARTITION_KEY).distinct()
        .localCheckpoint())
    if new_leaders is not None and inputs.plan_sessions is not None and not new_leaders.isEmpty():
        # a follower fetches from its new leader in the round that elected it (before its epoch check)
        inputs = replace(inputs, **inputs.plan_sessions(fetch_pairs(meta_df)))
    replicas = read_replicas(spark, inputs, serving(meta_df, inputs), state)
    # (the check uses the leader's log as it is before the round appends to it)
    replicas = replicas.withColumns({"leader_leo": F.col("leader_leo_before"), "leader_lso": F.col("leader_lso_before")})
    truncations, checked = [], None
    for _ in range(MAX_EPOCH_CHECKS):
        replicas, truncated = epoch_checks(storage, inputs, replicas)
        if truncated is None:  # no fetching follower left to check
            break
        truncations.append(truncated)
        done = replicas.filter(F.col("epoch_checked")).select(*PARTITION_KEY)
        checked = done if checked is None else checked.unionByName(done)

    round_id = inputs.round_id
    if step.dropped is not None:  # a reassignment empties the logs of the replicas it drops and adds
        truncations.append(step.dropped.select("broker", *PARTITION_KEY).unionByName(
            step.added.select("broker", *PARTITION_KEY)).withColumn("truncate_to", F.lit(0).cast("long")))
    if truncations:  # a follower's diverging suffix goes before anything is appended to its log
        ends = reduce(DataFrame.unionByName, [t.select("broker", *PARTITION_KEY, "truncate_to")
                                              for t in truncations]).groupBy("broker", *PARTITION_KEY).agg(
            F.min("truncate_to").alias("truncate_to")).localCheckpoint()
        # a down broker's log is not written: it drops its stray records when it starts (below)
        down = set((inputs.controller or {}).get("down") or [])
        for r in ends.select("broker").distinct().collect():  # (O(brokers))
            if r["broker"] not in down and storage.path_exists(f"{storage.log_path(r['broker'])}/_delta_log"):
                # (a lost log restarts empty)
                storage.truncate_logs(r["broker"], ends.filter(F.col("broker") == r["broker"]).drop("broker"), round_id)
    delete_strays(storage, inputs, state, round_id)
    if step.changed is not None:  # before the HW they allow, as the ISR's changes are
        storage.upsert(step.changed.withColumn("round_id", F.lit(round_id).cast("long"))
                       .select(*PARTITIONS_SCHEMA.fieldNames()), "partitions", PARTITION_KEY, round_id)
        storage.append_all([(step.elections, storage.path("elections"))], round_id)
    else:
        new_leaders = None
    removed = {}
    if step.dropped is not None:  # the rows of the replicas a reassignment dropped go, after the partitions
        storage.delete_replicas(step.dropped.select(*REPLICA_KEY), round_id)
        removed = {r["session_id"]: r["count"] for r in step.dropped.filter(F.col("session_id") != 0)
                   .groupBy("session_id").count().collect()}  # (O(sessions))
    touched = [d for d in (checked, None if step.state_changed is None else step.state_changed.select(*PARTITION_KEY))
               if d is not None]
    rows = replicas.select(*[F.lit(round_id).cast("long").alias(f.name) if f.name == "round_id" else F.col(f.name)
                             for f in REPLICA_STATE_SCHEMA.fields]).localCheckpoint()
    empty = spark.createDataFrame([], "topic string, partition int")
    return ControllerWave(
        meta=meta_df, replica_rows=rows,
        touched=reduce(DataFrame.unionByName, touched).distinct().localCheckpoint() if touched else empty,
        new_leaders=new_leaders, unvalidated=unvalidated_brokers(rows, meta_df), sessions_removed=removed,
        inputs=inputs)
