"""The controller's wave of a v2 round: elections, and followers validating a new leader epoch.

A v2 round runs it before its control job, and only when there is something to do: a broker to
fence or unfence (Kafka's controller elects leaders without it, then with it back), a preferred
leader election asked, or a follower that fetches this round and has not checked its log against
its leader's current epoch. The rules are the controller's and the leader epoch's
(pipeline/controller.py), on the replica rows of the tables; the wave hands the control job the
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

from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline import round as round_v1
from pipeline.carry import Keyed
from pipeline.controller import NO_LEADER
from pipeline.round import RoundInputs
from pipeline.schemas import PARTITION_KEY, PARTITIONS_SCHEMA, REPLICA_KEY, REPLICA_STATE_SCHEMA
from pipeline.storage import Storage

__all__ = ["ControllerWave", "controller_wave", "unvalidated_brokers", "controller_requests_asked"]

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


def controller_wave(spark: SparkSession, storage: Storage, inputs: RoundInputs) -> ControllerWave:
    """The round's elections and epoch checks on the tables (`inputs` with its versions fixed), with
    their commits: truncated logs, then the partitions the controller changed and its elections."""
    meta, state, step = round_v1._controller_step(
        storage, inputs, Keyed.of(round_v1._partition_meta(storage, inputs.cluster_config), PARTITION_KEY),
        Keyed.of(storage.replica_state().drop("round_id"), REPLICA_KEY))
    meta_df = meta.all()
    replicas = round_v1._read_replicas(spark, inputs, round_v1._serving(meta_df, inputs), state.all())
    # (the check uses the leader's log as it is before the round appends to it)
    replicas = replicas.withColumns({"leader_leo": F.col("leader_leo_before"), "leader_lso": F.col("leader_lso_before")})
    truncations, checked = [], None
    for _ in range(MAX_EPOCH_CHECKS):
        replicas, truncated = round_v1._epoch_checks(storage, inputs, replicas)
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
        for r in ends.select("broker").distinct().collect():  # (O(brokers))
            if storage.path_exists(f"{storage.log_path(r['broker'])}/_delta_log"):  # (a lost log restarts empty)
                storage.truncate_logs(r["broker"], ends.filter(F.col("broker") == r["broker"]).drop("broker"), round_id)
    new_leaders = None
    if step.changed is not None:  # before the HW they allow, as the ISR's changes are
        storage.upsert(step.changed.withColumn("round_id", F.lit(round_id).cast("long"))
                       .select(*PARTITIONS_SCHEMA.fieldNames()), "partitions", PARTITION_KEY, round_id)
        storage.append_all([(step.elections, storage.path("elections"))], round_id)
        new_leaders = (step.elections.filter(F.col("leader") != F.col("previous_leader"))
                       .select(*PARTITION_KEY).distinct().localCheckpoint())
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
        new_leaders=new_leaders, unvalidated=unvalidated_brokers(rows, meta_df), sessions_removed=removed)
