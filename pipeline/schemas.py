"""Table schemas (the contracts between the rules and the Delta tables) and column names."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

__all__ = [
    "LOG_SCHEMA",
    "INBOX_SCHEMA",
    "TOPICS_SCHEMA",
    "PARTITIONS_SCHEMA",
    "REPLICA_STATE_SCHEMA",
    "RESULTS_SCHEMA",
    "ROUNDS_SCHEMA",
    "BROKER_GAUGES",
    "BROKERS_SCHEMA",
    "ELECTIONS_SCHEMA",
    "LEASE_SCHEMA",
    "ADMIN_SCHEMA",
    "PRODUCERS_SCHEMA",
    "CLUSTER_SCHEMA",
    "CLIENT_SESSIONS_SCHEMA",
    "GROUP_OFFSETS_SCHEMA",
    "CONSUMER_POSITIONS_SCHEMA",
    "CLEANER_SCHEMA",
    "CLEANER_RUNS_SCHEMA",
    "STREAM_BATCHES_SCHEMA",
    "CLIENT_QUOTAS_SCHEMA",
    "NO_LEADER",
    "PARTITION_KEY",
    "REPLICA_KEY",
    "ACKS_ALL",
]

NO_LEADER = -1
ACKS_ALL = -1
# the keys every frame of the round is keyed by
PARTITION_KEY = ["topic", "partition"]
REPLICA_KEY = ["topic", "partition", "broker"]


def _s(*fields: tuple) -> StructType:
    return StructType([StructField(name, dtype, nullable) for name, dtype, nullable in fields])


# One table per broker: every replica that broker hosts (leader or follower).
LOG_SCHEMA = _s(
    ("topic", StringType(), False),
    ("partition", IntegerType(), False),
    ("offset", LongType(), False),
    ("leader_epoch", IntegerType(), False),
    ("timestamp", LongType(), False),
    ("key", BinaryType(), True),
    ("value", BinaryType(), True),
    ("producer_id", LongType(), True),
    ("producer_epoch", IntegerType(), True),
    ("sequence", IntegerType(), True),
)

# Append-only produce inbox: many producers append, only the round assigns offsets.
INBOX_SCHEMA = _s(
    ("request_id", StringType(), False),
    ("record_index", LongType(), False),
    ("topic", StringType(), False),
    ("partition", IntegerType(), True),
    ("key", BinaryType(), True),
    ("value", BinaryType(), True),
    ("acks", IntegerType(), False),
    ("timestamp", LongType(), False),
    ("producer_id", LongType(), True),
    ("producer_epoch", IntegerType(), True),
    ("sequence", IntegerType(), True),
    # who sent it (client quotas, pipeline/control/quotas.py): Kafka's client.id and authenticated user
    ("client_id", StringType(), True),
    ("user", StringType(), True),
)

TOPICS_SCHEMA = _s(
    ("topic", StringType(), False),
    ("partitions", IntegerType(), False),
    ("replication_factor", IntegerType(), False),
    ("config", StringType(), False),  # JSON of the topic's overrides
    ("created_ms", LongType(), False),
)

# Controller metadata: rewritten only for partitions whose leader or ISR changed.
PARTITIONS_SCHEMA = _s(
    ("topic", StringType(), False),
    ("partition", IntegerType(), False),
    ("leader", IntegerType(), False),
    ("leader_epoch", IntegerType(), False),
    ("partition_epoch", IntegerType(), False),
    ("replicas", ArrayType(IntegerType(), False), False),
    ("isr", ArrayType(IntegerType(), False), False),
    ("leader_epoch_start_offset", LongType(), False),
    ("round_id", LongType(), False),
    # KIP-455: a reassignment in progress (replicas is then the target followed by the replicas
    # leaving); empty or null (a root made before reassignments): none
    ("adding_replicas", ArrayType(IntegerType(), True), True),
    ("removing_replicas", ArrayType(IntegerType(), True), True),
)

# One row per replica: the replica's own log offsets, and the leader's view of it as a follower
# (Kafka's ReplicaState: fetch_offset is the follower LEO the leader last saw).
REPLICA_STATE_SCHEMA = _s(
    ("topic", StringType(), False),
    ("partition", IntegerType(), False),
    ("broker", IntegerType(), False),
    ("log_start_offset", LongType(), False),
    ("log_end_offset", LongType(), False),
    ("high_watermark", LongType(), False),
    ("fetch_offset", LongType(), False),
    ("last_fetch_time_ms", LongType(), False),
    ("last_fetch_leader_leo", LongType(), False),
    ("last_caught_up_time_ms", LongType(), False),
    ("last_data_round", LongType(), False),  # a follower's last round that received records: fetch order
    # KIP-227: the leader's fetch session cache entry for this follower partition (its CachedPartition;
    # the cached fetch offset and fetcher log start offset are fetch_offset and log_start_offset)
    ("session_id", IntegerType(), False),  # 0: in no session
    ("session_max_bytes", LongType(), False),
    ("session_high_watermark", LongType(), False),  # the HW last sent; -1: none (or an error)
    ("session_leader_log_start_offset", LongType(), False),  # the leader log start offset last sent
    # the leader epoch whose leader last confirmed this replica's log does not diverge from its own
    # (Kafka's lastFetchedEpoch check, KIP-320): below the partition's leader epoch, the next fetch
    # checks first and truncates a diverging suffix (null, on a root made before elections: 0)
    ("validated_leader_epoch", IntegerType(), True),
    ("round_id", LongType(), False),
)

# Append-only: one row per (request, partition) each time its status changes; the newest wins.
RESULTS_SCHEMA = _s(
    ("request_id", StringType(), False),
    ("topic", StringType(), False),
    ("partition", IntegerType(), True),
    ("base_offset", LongType(), True),
    ("last_offset", LongType(), True),
    ("record_count", LongType(), False),
    ("acks", IntegerType(), False),
    ("status", StringType(), False),
    ("error_code", StringType(), True),
    ("round_id", LongType(), False),
    # how long the client's produce quota held the request back (null: written before quotas)
    ("throttle_time_ms", LongType(), True),
)

# Kafka's per-broker replica-manager gauges (kafka.server:type=ReplicaManager) and the fetcher
# manager's MaxLag (type=ReplicaFetcherManager), as each round's row keeps them (`broker_gauges`)
BROKER_GAUGES = ("PartitionCount", "LeaderCount", "UnderReplicatedPartitions", "UnderMinIsrPartitionCount",
                 "AtMinIsrPartitionCount", "MaxLag")

ROUNDS_SCHEMA = _s(
    ("round_id", LongType(), False),
    ("now_ms", LongType(), False),
    ("inbox_version", LongType(), False),
    ("fetch_request_partitions", LongType(), False),
    ("fetch_response_partitions", LongType(), False),
    ("records_appended", LongType(), False),
    ("records_replicated", LongType(), False),
    ("requests_acked", LongType(), False),
    ("requests_failed", LongType(), False),
    ("isr_shrinks", LongType(), False),
    ("isr_expands", LongType(), False),
    ("under_replicated_partitions", LongType(), False),
    ("under_min_isr_partitions", LongType(), False),
    ("at_min_isr_partitions", LongType(), False),
    ("offline_partitions", LongType(), False),
    ("max_lag", LongType(), False),
    ("active_partitions", LongType(), False),
    ("pending_requests", LongType(), False),
    ("admin_version", LongType(), False),
    ("retention_checked_ms", LongType(), False),
    ("duration_ms", LongType(), False),
    ("batch_id", LongType(), True),  # the streaming job's micro-batch that ran the round
    ("incremental_fetch_sessions", LongType(), False),
    ("incremental_fetch_partitions_cached", LongType(), False),
    ("fetch_session_evictions", LongType(), False),
    ("fetch_sessions", StringType(), True),  # JSON: every leader's session cache and every fetcher's handle
    ("throttled_requests", LongType(), True),  # produce requests waiting for their client's quota
    ("hw_advances", LongType(), True),  # partitions whose leader's HW moved up (null: written before it was kept)
    # JSON: each broker's BROKER_GAUGES after the round (pipeline/round/figures.py)
    ("broker_gauges", StringType(), True),
)


# Append-only: the batches of idempotent producers the leaders appended (the last 5 per producer and
# partition are read back to detect retries).
PRODUCERS_SCHEMA = _s(
    ("topic", StringType(), False),
    ("partition", IntegerType(), False),
    ("producer_id", LongType(), False),
    ("producer_epoch", IntegerType(), True),
    ("base_sequence", IntegerType(), False),
    ("last_sequence", IntegerType(), False),
    ("base_offset", LongType(), False),
    ("last_offset", LongType(), False),
    ("round_id", LongType(), False),
)

# Append-only admin requests the round applies: delete_records, elect_preferred, reassign.
ADMIN_SCHEMA = _s(
    ("request_id", StringType(), False),
    ("kind", StringType(), False),
    ("topic", StringType(), False),
    ("partition", IntegerType(), False),
    ("offset", LongType(), False),
    ("timestamp", LongType(), False),
    ("replicas", ArrayType(IntegerType(), False), True),  # reassign: the target replicas
)

BROKERS_SCHEMA = _s(
    ("broker", IntegerType(), False),
    # its storage location (Kafka's log.dirs): a path or URI, or "brokers/<id>" under the root (the default)
    ("path", StringType(), False),
    ("fetcher_paused", BooleanType(), False),
    ("fetch_max_bytes_per_round", LongType(), True),
    ("changed_ms", LongType(), False),
    # the broker's process: running | stopped (crashed, not yet fenced) | fenced (its session expired:
    # out of every ISR it is not the last member of, and of leadership) | starting (restarted: the
    # next round fences its old session and unfences it). Null (a root made before): running.
    ("state", StringType(), True),
    # its last heartbeat before it stopped (a running broker heartbeats at every round)
    ("last_heartbeat_ms", LongType(), True),
    # restarted without its log directory: it stays out of every ISR until it has fetched back in
    ("log_lost", BooleanType(), True),
    # decommission_broker: no new replica is placed on it, and its replicas are moving off it
    ("decommissioned", BooleanType(), True),
    # what a round found wrong with its storage location when it halted the broker (a failed log
    # directory: gone, unwritable, unreadable or another cluster's); null once it starts again
    ("log_dir_failure", StringType(), True),
)

# The replication lease (one row): the process that runs rounds on this root, and its job epoch.
LEASE_SCHEMA = _s(
    ("lease", StringType(), False),
    ("holder", StringType(), False),
    ("job_epoch", IntegerType(), False),
    ("acquired_ms", LongType(), False),
)

# Append-only: every leader change the controller made (Kafka's PartitionChangeRecord with a new
# leader), and so each leader's leader-epoch checkpoint entries: (leader, leader_epoch, start_offset).
ELECTIONS_SCHEMA = _s(
    ("round_id", LongType(), False),
    ("now_ms", LongType(), False),
    ("topic", StringType(), False),
    ("partition", IntegerType(), False),
    ("election", StringType(), False),  # clean | unclean | offline (no leader could be elected)
    ("previous_leader", IntegerType(), False),
    ("leader", IntegerType(), False),
    ("leader_epoch", IntegerType(), False),
    ("start_offset", LongType(), True),  # the new leader's LEO: its epoch's start offset
    ("high_watermark", LongType(), True),  # the partition's HW under its new leader
    ("offsets_lost", LongType(), False),  # unclean: committed offsets the new leader does not hold
    ("isr", ArrayType(IntegerType(), False), False),
)

# The log cleaner's checkpoint per compacted partition (Kafka's cleaner-offset-checkpoint, and the
# tombstone horizon of KIP-534 kept per partition instead of per batch): every replica of a partition
# is cleaned with the same bounds, so they keep the same offsets.
CLEANER_SCHEMA = _s(
    ("topic", StringType(), False),
    ("partition", IntegerType(), False),
    ("first_dirty_offset", LongType(), False),  # the end of the last clean: the next clean's dirty part starts here
    # tombstones below generation_end_offset were all compacted past by generation_ms; when
    # delete.retention.ms has passed since, they may go: tombstone_horizon_offset moves up to it
    ("generation_end_offset", LongType(), False),
    ("generation_ms", LongType(), False),
    ("tombstone_horizon_offset", LongType(), False),  # tombstones below it are removed
    ("last_clean_ms", LongType(), False),
)

# Append-only: one row per cleaner pass (the replog.metrics cleaner gauges read the newest).
CLEANER_RUNS_SCHEMA = _s(
    ("run_id", LongType(), False),
    ("now_ms", LongType(), False),
    ("compacted_partitions", LongType(), False),  # partitions of compacted topics with records
    ("partitions_cleaned", LongType(), False),
    ("replicas_cleaned", LongType(), False),
    ("records_removed", LongType(), False),
    ("clean_time_ms", LongType(), False),  # wall time of the pass
    ("max_compaction_delay_ms", LongType(), False),
    ("max_dirty_percent", LongType(), False),
    ("uncleanable_partitions", LongType(), False),  # replicas on a log the pass could not read or write
)

# Append-only: the ranges each micro-batch of a consumer's stream read (pipeline/consume/stream.py), so a
# batch Spark runs again reads the same records.
STREAM_BATCHES_SCHEMA = _s(
    ("consumer_id", StringType(), False),
    ("topic", StringType(), False),
    ("batch_id", LongType(), False),
    ("partition", IntegerType(), False),
    ("start_offset", LongType(), False),
    ("end_offset", LongType(), False),
)

CLUSTER_SCHEMA = _s(
    ("cluster_id", StringType(), False),
    ("brokers", IntegerType(), False),
    ("config", StringType(), False),
    ("created_ms", LongType(), False),
)

# KIP-227 sessions of consumers (unprivileged), kept apart from the round's follower sessions:
# kind 'session' (an entry of a leader's cache), 'handle' (the consumer's side: the session id and
# epoch of its next request) or 'evicted' (a follower session a consumer's new session evicted;
# the next round drops it from the cache, and that follower gets FETCH_SESSION_ID_NOT_FOUND).
CLIENT_SESSIONS_SCHEMA = _s(
    ("kind", StringType(), False),
    ("fetcher", StringType(), False),
    ("leader", IntegerType(), False),
    ("privileged", BooleanType(), False),
    ("session_id", IntegerType(), False),
    ("epoch", IntegerType(), False),
    ("created_ms", LongType(), False),
    ("last_used_ms", LongType(), False),
    ("size", IntegerType(), False),
)

# A consumer's position per partition (the next offset it reads) and the leader's cached entry
# of that partition in the consumer's session (session_id 0: not cached).
# Consumer groups' committed offsets (Kafka's __consumer_offsets): the next offset the group reads
GROUP_OFFSETS_SCHEMA = _s(
    ("group_id", StringType(), False),
    ("topic", StringType(), False),
    ("partition", IntegerType(), False),
    ("committed_offset", LongType(), False),
    ("metadata", StringType(), True),
    ("commit_ms", LongType(), False),
)

CONSUMER_POSITIONS_SCHEMA = _s(
    ("consumer_id", StringType(), False),
    ("topic", StringType(), False),
    ("partition", IntegerType(), False),
    ("position", LongType(), False),
    ("session_id", IntegerType(), False),
    ("cached_high_watermark", LongType(), False),
    ("cached_log_start_offset", LongType(), False),
    ("updated_ms", LongType(), False),
)

# client quotas (kafka-configs --entity-type users|clients): one row per entity; user / client_id
# a name, "<default>", or null (not part of the entity); a null quota is not set
CLIENT_QUOTAS_SCHEMA = _s(
    ("user", StringType(), True),
    ("client_id", StringType(), True),
    ("producer_byte_rate", LongType(), True),
    ("consumer_byte_rate", LongType(), True),
    ("updated_ms", LongType(), False),
)
