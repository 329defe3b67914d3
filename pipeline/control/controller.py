"""Controller and leader-epoch rules as pure DataFrame transformations (no I/O).

A reader who knows Kafka finds: broker fencing by heartbeat (BrokerHeartbeatManager's session
check), leader election on a broker change (ReplicationControlManager.generateLeaderAndIsrUpdates
with PartitionChangeBuilder.electAnyLeader, eligible leader replicas disabled), the reset of the
followers' state a new leader makes (Replica.resetReplicaState with isNewLeader), and the
leader-epoch lookup and truncation of KIP-101/KIP-279/KIP-320 (LeaderEpochFileCache.endOffsetFor,
Partition's lastFetchedEpoch validation, AbstractFetcherThread.getOffsetTruncationState).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipeline.control.replication import reset_replica_state
from pipeline.schemas import NO_LEADER, PARTITION_KEY

__all__ = [
    "RUNNING", "STOPPED", "FENCED", "STARTING", "DOWN", "UNDEFINED_EPOCH", "UNDEFINED_EPOCH_OFFSET",
    "expired_broker_sessions", "elect_leaders", "elect_preferred_leaders", "reset_followers_for_new_leader", "new_leader_high_watermark",
    "epoch_cache", "end_offset_for_epoch", "diverging_epoch", "truncation_offset",
    "start_reassignments", "complete_reassignments", "reassignment_in_progress",
]

RUNNING, STOPPED, FENCED, STARTING = "running", "stopped", "fenced", "starting"
# the states of a broker that serves nothing: stopped (or halted), and fenced by the controller
DOWN = (STOPPED, FENCED)
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


# -- brokers -----------------------------------------------------------------------------------

def expired_broker_sessions(brokers_df: DataFrame, now_ms: int, session_timeout_ms: int) -> DataFrame:
    """Brokers the controller fences now: stopped ones whose last heartbeat plus
    `broker.session.timeout.ms` is before `now_ms` (Kafka: lastContact + timeout >= now is a valid
    session). brokers_df: broker, state, last_heartbeat_ms. Returns broker."""
    expired = F.col("last_heartbeat_ms") + F.lit(session_timeout_ms) < F.lit(now_ms)
    return brokers_df.filter((F.col("state") == STOPPED) & expired).select("broker")


# -- elections ---------------------------------------------------------------------------------

def _ints(values: list[int]) -> Column:
    return F.array(*[F.lit(int(v)) for v in values]).cast("array<int>") if values else F.array().cast("array<int>")


def elect_leaders(partitions_df: DataFrame, live_brokers: list[int], removed_brokers: list[int] | None = None) -> DataFrame:
    """The partition changes after the set of live (unfenced) brokers changed.

    The ISR loses every broker that is not live, except that a last ISR member stays (the partition
    is then leaderless until it returns: no committed record is on anyone else). `removed_brokers`
    (lost their log) leave the ISR even as its last member. The leader stays while it is live and in
    that ISR; otherwise the first replica, in replica order, that is live and in the ISR leads
    (clean); when there is none and the topic allows `unclean.leader.election.enable`, the first live
    replica leads and the ISR becomes just it (unclean); otherwise the partition has no leader
    (offline). A leader change bumps the leader epoch; any change bumps the partition epoch.

    partitions_df: topic, partition, leader, leader_epoch, partition_epoch, replicas, isr, unclean.
    Returns the changed partitions only, with the new leader, leader_epoch, partition_epoch, isr,
    `previous_leader` and `election` (clean | unclean | offline | null: only the ISR changed).
    """
    live = _ints(live_brokers)
    removed = _ints(removed_brokers or [])
    is_live = lambda b: F.array_contains(live, b)  # noqa: E731
    kept = F.filter(F.col("isr"), lambda b: is_live(b) & ~F.array_contains(removed, b))
    kept_or_last = F.filter(F.col("isr"), lambda b: ~F.array_contains(removed, b))
    target_isr = F.when(F.size(kept) > 0, kept).otherwise(kept_or_last)
    valid = lambda b: F.array_contains(F.col("_target_isr"), b) & is_live(b)  # noqa: E731
    clean = F.filter(F.col("replicas"), valid)
    # a replica a reassignment is adding is bootstrapping: it holds nothing to lead with (KIP-455)
    adding = F.coalesce(F.col("adding_replicas"), _ints([])) if "adding_replicas" in partitions_df.columns \
        else _ints([])
    unclean = F.filter(F.col("replicas"), lambda b: is_live(b) & ~F.array_contains(adding, b))
    leader_stays = (F.col("leader") != NO_LEADER) & valid(F.col("leader"))
    new_leader = (
        F.when(leader_stays, F.col("leader"))
        .when(F.size(clean) > 0, clean[0])
        .when(F.col("unclean") & (F.size(unclean) > 0), unclean[0])
        .otherwise(F.lit(NO_LEADER))
    )
    kind = (
        F.when(leader_stays, F.lit(None).cast("string"))
        .when(F.size(clean) > 0, F.lit("clean"))
        .when(F.col("unclean") & (F.size(unclean) > 0), F.lit("unclean"))
        .otherwise(F.lit("offline"))
    )
    leader_changed = F.col("_leader") != F.col("leader")
    # (the new leader picked out of the replicas: an array of non-null ints, as the table's)
    new_isr = F.when(F.col("_election") == "unclean", F.filter(F.col("replicas"), lambda r: r == F.col("_leader"))) \
        .otherwise(F.col("_target_isr"))
    return (
        partitions_df.withColumn("_target_isr", target_isr)
        .withColumn("_leader", new_leader.cast("int"))
        .withColumn("_election", kind)
        .withColumn("_isr", new_isr)
        .filter(leader_changed | (F.col("_isr") != F.col("isr")))
        .withColumn("previous_leader", F.col("leader"))
        .withColumn("election", F.when(leader_changed, F.col("_election")))
        .withColumn("leader_epoch", F.when(leader_changed, F.col("leader_epoch") + 1).otherwise(F.col("leader_epoch")))
        .withColumn("partition_epoch", F.col("partition_epoch") + 1)
        .withColumn("leader", F.col("_leader"))
        .withColumn("isr", F.col("_isr"))
        .drop("_target_isr", "_leader", "_election", "_isr")
    )


def elect_preferred_leaders(partitions_df: DataFrame, live_brokers: list[int]) -> DataFrame:
    """Kafka's preferred leader election (PartitionChangeBuilder.electPreferredLeader, as
    kafka-leader-election --election-type PREFERRED asks for it): the first replica leads when it
    is live and in the ISR and does not lead already; otherwise nothing changes. Leader epoch and
    partition epoch + 1. partitions_df: as elect_leaders. Returns the changed partitions, with
    `previous_leader` and `election` = 'preferred'."""
    preferred = F.col("replicas")[0]
    moves = (preferred != F.col("leader")) & F.array_contains(F.col("isr"), preferred) \
        & F.array_contains(_ints(live_brokers), preferred)
    return (partitions_df.filter(moves)
            .withColumn("previous_leader", F.col("leader"))
            .withColumn("election", F.lit("preferred"))
            .withColumn("leader", preferred)
            .withColumn("leader_epoch", F.col("leader_epoch") + 1)
            .withColumn("partition_epoch", F.col("partition_epoch") + 1))


# -- reassignments (KIP-455) ---------------------------------------------------------------------

def _no_ints() -> Column:
    return F.array().cast("array<int>")


def reassignment_in_progress(adding: Column, removing: Column) -> Column:
    """A partition's reassignment is in progress while it is adding or removing replicas."""
    return (F.size(F.coalesce(adding, _no_ints())) > 0) | (F.size(F.coalesce(removing, _no_ints())) > 0)


def _leader_among(replicas: Column, isr: Column, live: Column) -> Column:
    """The current leader while it is one of `replicas`, else the first of them that is live and in
    `isr` (NO_LEADER: none)."""
    candidates = F.filter(replicas, lambda b: F.array_contains(isr, b) & F.array_contains(live, b))
    stays = (F.col("leader") != NO_LEADER) & F.array_contains(replicas, F.col("leader"))
    return (F.when(stays, F.col("leader")).when(F.size(candidates) > 0, candidates[0])
            .otherwise(F.lit(NO_LEADER))).cast("int")


def start_reassignments(partitions_df: DataFrame, requests_df: DataFrame, live_brokers: list[int]) -> DataFrame:
    """Kafka's AlterPartitionReassignments (PartitionReassignmentReplicas): each requested
    partition's replicas grow to its target followed by the original replicas the target leaves
    out; the target's new replicas are `adding_replicas` (bootstrapping: out of the ISR until they
    catch up), the left-out ones `removing_replicas`. The original replicas are the current ones
    less those an earlier reassignment was still adding: a new target replaces it, and an adding
    replica it leaves out is dropped at once (a target equal to the original replicas cancels).
    The ISR keeps its members that stay replicas; a request that would leave it empty, or that
    changes nothing, is left out. Partition epoch + 1; the leader (and leader epoch) changes only
    when it is no longer a replica.

    partitions_df: topic, partition, leader, leader_epoch, partition_epoch, replicas, isr,
    adding_replicas, removing_replicas. requests_df: topic, partition, target (array<int>).
    Returns the changed partitions with `added` (brokers new to the partition), `dropped` (brokers
    no longer replicas), `previous_leader` and `election` ('reassignment' when the leader changed)."""
    adding = F.coalesce(F.col("adding_replicas"), _no_ints())
    removing = F.coalesce(F.col("removing_replicas"), _no_ints())
    original = F.col("_original")
    new_replicas = F.concat(F.col("target"), F.array_except(original, F.col("target")))
    changed = ((new_replicas != F.col("replicas")) | (F.array_except(F.col("target"), original) != adding)
               | (F.array_except(original, F.col("target")) != removing))
    return (
        partitions_df.join(requests_df.select(*PARTITION_KEY, "target"), on=PARTITION_KEY, how="inner")
        .withColumn("_original", F.array_except(F.col("replicas"), adding))
        .withColumn("_replicas", new_replicas)
        .withColumn("_isr", F.filter(F.col("isr"), lambda b: F.array_contains(F.col("_replicas"), b)))
        .filter(changed & (F.size(F.col("_isr")) > 0))
        .withColumn("added", F.array_except(F.col("_replicas"), F.col("replicas")))
        .withColumn("dropped", F.array_except(F.col("replicas"), F.col("_replicas")))
        .withColumn("adding_replicas", F.array_except(F.col("target"), original))
        .withColumn("removing_replicas", F.array_except(original, F.col("target")))
        .withColumn("previous_leader", F.col("leader"))
        .withColumn("replicas", F.col("_replicas"))
        .withColumn("isr", F.col("_isr"))
        .withColumn("leader", _leader_among(F.col("replicas"), F.col("isr"), _ints(live_brokers)))
        .withColumn("election", F.when(F.col("leader") != F.col("previous_leader"), F.lit("reassignment")))
        .withColumn("leader_epoch", F.when(F.col("leader") != F.col("previous_leader"), F.col("leader_epoch") + 1)
                    .otherwise(F.col("leader_epoch")))
        .withColumn("partition_epoch", F.col("partition_epoch") + 1)
        .drop("target", "_original", "_replicas", "_isr")
    )


def complete_reassignments(partitions_df: DataFrame, live_brokers: list[int]) -> DataFrame:
    """Kafka's completion of a reassignment (PartitionChangeBuilder with a target ISR that holds
    every adding replica): once every replica being added is in the ISR, the replicas become the
    target, the ISR loses the removed ones, the leader moves to the first live ISR member of the
    target if it is being removed, and the leader epoch and partition epoch go up by one. It waits
    while the partition has no leader, while the ISR would be left empty and while no live target
    ISR member could take over from a leader being removed.

    partitions_df: as start_reassignments. Returns the completed partitions with empty
    adding_replicas and removing_replicas, `added` (none), `dropped` (the removed replicas),
    `previous_leader` and `election` ('reassignment' when the leader changed)."""
    adding = F.coalesce(F.col("adding_replicas"), _no_ints())
    removing = F.coalesce(F.col("removing_replicas"), _no_ints())
    target = F.array_except(F.col("replicas"), removing)
    final_isr = F.filter(F.col("isr"), lambda b: ~F.array_contains(removing, b))
    caught_up = F.forall(adding, lambda b: F.array_contains(F.col("isr"), b))
    return (
        partitions_df.filter(reassignment_in_progress(F.col("adding_replicas"), F.col("removing_replicas"))
                             & caught_up & (F.col("leader") != NO_LEADER) & (F.size(final_isr) > 0))
        .withColumn("_leader", _leader_among(target, final_isr, _ints(live_brokers)))
        .filter(F.col("_leader") != NO_LEADER)
        .withColumn("added", _no_ints())
        .withColumn("dropped", removing)
        .withColumn("previous_leader", F.col("leader"))
        .withColumn("replicas", target)
        .withColumn("isr", final_isr)
        .withColumn("leader", F.col("_leader"))
        .withColumn("election", F.when(F.col("leader") != F.col("previous_leader"), F.lit("reassignment")))
        .withColumn("leader_epoch", F.col("leader_epoch") + 1)
        .withColumn("partition_epoch", F.col("partition_epoch") + 1)
        .withColumn("adding_replicas", _no_ints())
        .withColumn("removing_replicas", _no_ints())
        .drop("_leader")
    )


def new_leader_high_watermark(partition_hw: Column, leader_leo: Column) -> Column:
    """The HW a new leader starts from: the partition's HW, which a clean leader (an ISR member)
    holds every record below; an unclean one may hold less, and the HW goes back to its LEO."""
    return F.least(partition_hw, leader_leo)


def reset_followers_for_new_leader(followers_df: DataFrame, now_ms: int) -> DataFrame:
    """Kafka's Replica.resetReplicaState(isNewLeader = true) for the followers of a new leader: an
    ISR member counts as caught up now, any other replica as never (0), so the new leader neither
    shrinks its ISR at once nor lets an old replica back in by time; the last fetch is now (ISR) or
    never, at the leader's LEO. The follower's offset the leader knows becomes what it may rely on:
    no more than the partition's HW, which every ISR member holds (Kafka forgets it entirely).

    followers_df: follower rows with broker, isr (the new one), leader_leo (the new leader's LEO),
    fetch_offset, partition_hw."""
    return (reset_replica_state(followers_df, now_ms, F.col("leader_leo"))
            .withColumn("fetch_offset", F.least(F.col("fetch_offset"), F.col("partition_hw"))))


# -- leader epochs -----------------------------------------------------------------------------

def epoch_cache(log_df: DataFrame, current_epochs_df: DataFrame | None = None) -> DataFrame:
    """A replica's leader-epoch cache (Kafka's leader-epoch-checkpoint): the first offset of each
    epoch among its records, plus, for a leader, its current epoch at the offset it was elected at
    (an epoch may hold no records yet). An entry that starts after a later epoch's start is one a
    truncation removed (Kafka's assign drops it), so it is dropped.

    log_df: topic, partition, broker, offset, leader_epoch; current_epochs_df: topic, partition,
    broker, epoch, start_offset. Returns topic, partition, broker, epoch, start_offset.
    """
    key = [*PARTITION_KEY, "broker"]
    entries = log_df.groupBy(*key, F.col("leader_epoch").alias("epoch")).agg(F.min("offset").alias("start_offset"))
    if current_epochs_df is not None:
        entries = entries.unionByName(current_epochs_df.select(*key, "epoch", "start_offset"))
    entries = entries.groupBy(*key, "epoch").agg(F.min("start_offset").alias("start_offset"))
    later = Window.partitionBy(*key).orderBy(F.col("epoch").desc()).rowsBetween(Window.unboundedPreceding, -1)
    return (entries.withColumn("_later_start", F.min("start_offset").over(later))
            .filter(F.col("_later_start").isNull() | (F.col("start_offset") <= F.col("_later_start")))
            .drop("_later_start"))


def end_offset_for_epoch(requests_df: DataFrame, cache_df: DataFrame) -> DataFrame:
    """Kafka's LeaderEpochFileCache.endOffsetFor on each request's replica, after the cache was
    truncated to the replica's log start offset (entries at or below it collapse into one that
    starts there): the requested epoch itself when it is the latest (end = the LEO); else the
    largest epoch at or below it (or the requested one, when none is) and the start offset of the
    first epoch above it; undefined (-1, -1) when no epoch is above it, or for epoch -1.

    requests_df: topic, partition, broker (whose cache), requested_epoch, log_end_offset,
    log_start_offset, ...; cache_df: topic, partition, broker, epoch, start_offset.
    Returns requests_df with end_epoch and end_offset.
    """
    key = [*PARTITION_KEY, "broker"]
    starts = requests_df.select(*key, "log_start_offset").distinct()
    clamped = (cache_df.join(starts, on=key, how="inner")
               .withColumn("start_offset", F.greatest(F.col("start_offset"), F.col("log_start_offset"))))
    at_start = Window.partitionBy(*key, "start_offset")
    clamped = (clamped.withColumn("_top", F.max("epoch").over(at_start))
               .filter(F.col("epoch") == F.col("_top")).drop("_top", "log_start_offset"))
    req = F.col("requested_epoch")
    looked_up = (
        requests_df.join(clamped, on=key, how="left")
        .groupBy(*requests_df.columns)
        .agg(F.max("epoch").alias("_latest"),
             F.max(F.when(F.col("epoch") <= req, F.col("epoch"))).alias("_floor"),
             F.min_by("start_offset", F.when(F.col("epoch") > req, F.col("epoch"))).alias("_higher_start"),
             F.min(F.when(F.col("epoch") > req, F.col("epoch"))).alias("_higher"))
    )
    undefined = (req == UNDEFINED_EPOCH) | ((F.col("_latest") != req) & F.col("_higher").isNull()) \
        | F.col("_latest").isNull()
    latest = F.col("_latest") == req
    return (
        looked_up
        .withColumn("end_epoch", F.when(undefined, F.lit(UNDEFINED_EPOCH)).when(latest, req)
                    .otherwise(F.coalesce(F.col("_floor"), req)).cast("int"))
        .withColumn("end_offset", F.when(undefined, F.lit(UNDEFINED_EPOCH_OFFSET)).when(latest, F.col("log_end_offset"))
                    .otherwise(F.col("_higher_start")).cast("long"))
        .drop("_latest", "_floor", "_higher_start", "_higher")
    )


def diverging_epoch(last_fetched_epoch: Column, fetch_offset: Column, end_epoch: Column, end_offset: Column) -> Column:
    """Partition.fetchRecords' check of a follower's lastFetchedEpoch against the leader's
    endOffsetFor(lastFetchedEpoch): 'out_of_range' when the leader knows no such end (the follower
    is ahead of every epoch the leader knows), 'diverging' when the leader's epoch is older or its
    end offset is below the fetch offset (the response then carries that epoch and end offset and
    no records), else null."""
    return (
        F.when((end_epoch == UNDEFINED_EPOCH) | (end_offset == UNDEFINED_EPOCH_OFFSET), F.lit("out_of_range"))
        .when((end_epoch < last_fetched_epoch) | (end_offset < fetch_offset), F.lit("diverging"))
    )


def truncation_offset(leader_end_epoch: Column, leader_end_offset: Column, follower_end_epoch: Column,
                      follower_end_offset: Column, follower_leo: Column) -> tuple[Column, Column]:
    """AbstractFetcherThread.getOffsetTruncationState, for a diverging epoch (E, O) from the leader
    and the follower's own endOffsetFor(E) = (e, o): the follower knows E (e == E): truncate to
    min(O, o, LEO), done; it knows only an older epoch: truncate to min(o, LEO) and ask again with
    the epoch it now ends at; it knows none (undefined): truncate to min(O, LEO), done.
    Returns (offset, completed)."""
    knows_none = follower_end_epoch == UNDEFINED_EPOCH
    same = follower_end_epoch == leader_end_epoch
    offset = (
        F.when(knows_none, F.least(leader_end_offset, follower_leo))
        .when(same, F.least(leader_end_offset, follower_end_offset, follower_leo))
        .otherwise(F.least(follower_end_offset, follower_leo))
    )
    return offset.cast("long"), (knows_none | same)
