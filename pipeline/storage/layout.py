"""The root's tables: their schemas and Delta properties, their creation, and the upgrade of a
root an older release made (LAYOUT)."""

from __future__ import annotations

from typing import Iterable

from delta.tables import DeltaTable
from pyspark.sql.types import StructType

from pipeline import schemas
from pipeline.storage.committers import COMMITTERS, wait_all
from pipeline.storage.failures import is_concurrent_conflict

__all__ = ["CLUSTER_TABLES", "TABLE_DOCS", "LAYOUT", "LAYOUT_PROPERTY", "LATER_TABLES", "LOG_CLUSTER_PROPERTY", "LOG_BROKER_PROPERTY",
           "LOG_PROPS", "table_props", "table_properties", "log_stamp", "Layout"]

CLUSTER_TABLES = {
    "cluster": schemas.CLUSTER_SCHEMA,
    "brokers": schemas.BROKERS_SCHEMA,
    "topics": schemas.TOPICS_SCHEMA,
    "partitions": schemas.PARTITIONS_SCHEMA,
    "replica_state": schemas.REPLICA_STATE_SCHEMA,
    "inbox": schemas.INBOX_SCHEMA,
    "admin": schemas.ADMIN_SCHEMA,
    "producers": schemas.PRODUCERS_SCHEMA,
    "results": schemas.RESULTS_SCHEMA,
    "rounds": schemas.ROUNDS_SCHEMA,
    "client_sessions": schemas.CLIENT_SESSIONS_SCHEMA,
    "consumer_positions": schemas.CONSUMER_POSITIONS_SCHEMA,
    "group_offsets": schemas.GROUP_OFFSETS_SCHEMA,
    "elections": schemas.ELECTIONS_SCHEMA,
    "lease": schemas.LEASE_SCHEMA,
    "cleaner": schemas.CLEANER_SCHEMA,
    "cleaner_runs": schemas.CLEANER_RUNS_SCHEMA,
    "stream_batches": schemas.STREAM_BATCHES_SCHEMA,
    "client_quotas": schemas.CLIENT_QUOTAS_SCHEMA,
}

# what a row of each table is (docs/design.md's table of tables is generated from these)
TABLE_DOCS = {
    "cluster": "the cluster: its id, broker count, configs (JSON) and creation time",
    "brokers": "a broker: its location (Kafka's log.dirs), state, heartbeat, paused fetcher, lost log, halt reason",
    "topics": "a topic: partition count, replication factor, config overrides (JSON)",
    "partitions": "a partition's controller metadata: leader, epochs, replicas, ISR, reassignment",
    "replica_state": "a replica's state as of a round (append-only; the newest round_id wins): LEO, HW, "
                     "log start, fetch times, lag",
    "inbox": "a produced record, appended by producers (append-only, change data feed)",
    "admin": "an admin request: delete_records, elect_preferred, reassign (append-only, change data feed)",
    "producers": "an idempotent producer's batch a leader remembers (the last 5 per producer and partition)",
    "results": "a produce request's status in a partition as of a round: offsets, error, throttle time",
    "rounds": "a round: its inputs' versions and its RoundReport (the commit point of a round)",
    "client_sessions": "a consumer's KIP-227 fetch session with a leader",
    "consumer_positions": "a consumer's next offset per partition (read_incremental)",
    "group_offsets": "a consumer group's committed offset per partition (OffsetCommit)",
    "elections": "a leader change: clean, unclean or offline, with the offsets an unclean one lost",
    "lease": "the one-writer replication lease: its holder and job epoch",
    "cleaner": "the log cleaner's checkpoint per partition (Kafka's cleaner-offset-checkpoint)",
    "cleaner_runs": "a log cleaner pass and its gauges",
    "stream_batches": "a streaming consumer's micro-batch and its positions (cluster.stream)",
    "client_quotas": "a client quota entity (user, client-id) and its byte rates",
    "log": "a record of one replica: topic, partition, offset, leader epoch, timestamp, key, value, producer fields",
}


_PROPS = {
    "delta.autoOptimize.optimizeWrite": "false",
    "delta.checkpointInterval": "20",
}


_INBOX_PROPS = {**_PROPS, "delta.enableChangeDataFeed": "true", "delta.appendOnly": "true"}


# Statistics (min, max, nulls) on the columns a table's reads skip files by, not on Delta's
# default first 32: replica_state's topic, partition and broker, results' request_id, topic and
# partition; a log's topic, partition and offset (a follower's catch-up read) and timestamp (the
# retention check: no file older than the cutoff, no log read). Under the round's interpreted
# expressions, statistics on every column doubled a replica_state append (jobs/bench_stats.py)
_KEYED = {"delta.dataSkippingNumIndexedCols": "3"}


_STATE_PROPS = {**_PROPS, "delta.enableDeletionVectors": "true"}


LOG_PROPS = {**_PROPS, "delta.dataSkippingStatsColumns": "topic,partition,offset,timestamp"}


# a log's stamp: the cluster and the broker it belongs to (Kafka's meta.properties in a log dir)
LOG_CLUSTER_PROPERTY = "replog.cluster.id"


LOG_BROKER_PROPERTY = "replog.broker.id"


# The cluster table's property naming the layout of the root's tables. Raise LAYOUT whenever a
# release adds a cluster table or a column: a root whose cluster table says less (a root made
# before the property existed says nothing: 0) is brought up to date once, by Storage.upgrade.
LAYOUT_PROPERTY = "replog.layout"


# 2: statistics on the columns reads skip by, of the logs, replica_state and results; 3: each log
# stamped with its cluster and broker, and the brokers table's default locations relative to the root;
# 4: the rounds table's hw_advances and broker_gauges
LAYOUT = 4


# the tables later releases added: a root made before one lacks it, and every open creates it then
LATER_TABLES = ("group_offsets", "elections", "lease", "cleaner", "cleaner_runs", "client_quotas")


def table_props(name: str) -> dict[str, str]:
    """The Delta properties a cluster table is created with."""
    if name in ("inbox", "admin"):
        return _INBOX_PROPS
    if name == "replica_state":
        return {**_STATE_PROPS, **_KEYED}
    if name == "partitions":
        return _STATE_PROPS
    if name == "results":
        return {**_PROPS, **_KEYED}
    if name == "cluster":
        return {LAYOUT_PROPERTY: str(LAYOUT)}
    return _PROPS


def table_properties(snapshot, *keys: str) -> tuple[str | None, ...]:
    """Delta table properties from a table's snapshot (Storage.snapshot; None where unset)."""
    conf = snapshot.metadata().configuration()
    return tuple(str(conf.apply(k)) if conf.contains(k) else None for k in keys)


def log_stamp(snapshot) -> tuple[str | None, str | None]:
    """(cluster id, broker id) a log was stamped with, from its snapshot (None: a log made before
    the stamp, or a table of no cluster)."""
    return table_properties(snapshot, LOG_CLUSTER_PROPERTY, LOG_BROKER_PROPERTY)  # type: ignore[return-value]



class Layout:
    """Storage's creation and upgrade of tables (a mixin of Storage: it uses path, log_path,
    snapshot, schema_at, _is_table and the committer threads)."""

    # -- creation ----------------------------------------------------------------------------
    def _create(self, path: str, schema: StructType, props: dict[str, str]) -> None:
        builder = DeltaTable.createIfNotExists(self.spark).location(path).addColumns(schema)
        for key, value in props.items():
            builder = builder.property(key, value)
        builder.execute()

    def create_tables(self, brokers: list[int]) -> None:
        """The cluster's tables and the brokers' logs, empty, made at once from threads of their own
        (a creation is one small commit, mostly waiting: 21 of them took 0.65x the time of one
        after another, jobs/bench_create.py). The cluster table is not among them: it is made last
        (create_cluster_table), and its presence marks a complete cluster."""
        made = [COMMITTERS.submit(self._create, self.path(name), schema, table_props(name))
                for name, schema in CLUSTER_TABLES.items() if name != "cluster"]
        made += [COMMITTERS.submit(self.create_log, broker) for broker in brokers]
        wait_all(made)

    def create_cluster_table(self) -> None:
        """The cluster table, last: its presence marks a complete cluster, of this release's layout."""
        self._create(self.path("cluster"), schemas.CLUSTER_SCHEMA, table_props("cluster"))

    def ensure(self, table: str) -> bool:
        """Creates a cluster table that is missing (a root made by a release before the table);
        whether it had to. A check of the file system, no Delta log read."""
        if self._is_table(self.path(table)):
            return False
        self._create(self.path(table), CLUSTER_TABLES[table], table_props(table))
        return True

    def ensure_columns(self, table: str) -> list[str]:
        """Adds the columns of the table's schema that a root made by an older release lacks
        (nullable, at the end: every reader selects by name); the names it added."""
        have = set(self.schema_at(self.path(table)).fieldNames())
        missing = [f for f in CLUSTER_TABLES[table].fields if f.name not in have]
        if missing:
            cols = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
            self.spark.sql(f"ALTER TABLE delta.`{self.path(table)}` ADD COLUMNS ({cols})")
        return [f.name for f in missing]

    def layout(self) -> int:
        """The layout the root's tables have (LAYOUT_PROPERTY; 0 for a root made before it)."""
        value = self.cluster_property(LAYOUT_PROPERTY)
        return int(value) if value is not None else 0

    def ensure_properties(self, path: str, props: dict[str, str]) -> list[str]:
        """Sets the Delta properties `props` that the table at `path` lacks or holds another value
        of (a table made by an older release; one commit when any); the keys it set."""
        have = self.spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()
        current = {r["key"]: r["value"] for r in have}
        missing = {k: v for k, v in props.items() if current.get(k) != v}
        if missing:
            pairs = ", ".join(f"'{k}' = '{v}'" for k, v in missing.items())
            self.spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({pairs})")
        return sorted(missing)

    def upgrade(self, brokers: Iterable[int] = ()) -> dict[str, list[str]]:
        """Brings the root to this release's layout: the LATER_TABLES it lacks are created (a
        check of the file system, on every call), and, when the cluster table says an older
        layout, every table gets the columns and Delta properties it lacks, and so does each of
        `brokers`' logs, and the property then says LAYOUT. The check loads each table's Delta log
        (~0.15 s a table), which a root at LAYOUT skips. Returns table -> what it added
        (["<table>"] for a created table, else column names and property keys; a log is
        "log <broker>")."""
        added = {name: ["<table>"] for name in LATER_TABLES if self.ensure(name)}
        layout = self.layout()
        if layout >= LAYOUT:
            return added
        for name in CLUSTER_TABLES:
            if name in added or not self._is_table(self.path(name)):
                continue
            changes = self.ensure_columns(name)
            if name != "cluster":  # (its layout property is set last)
                changes += self.ensure_properties(self.path(name), table_props(name))
            if changes:
                added[name] = changes
        if layout < 3:  # every broker had the default location: the path relative to the root
            self.spark.sql(f"UPDATE delta.`{self.path('brokers')}` SET path = concat('brokers/', CAST(broker AS STRING))")
        for broker in brokers:
            if self._is_table(self.log_path(broker)):
                keys = self.ensure_properties(self.log_path(broker), self._log_props(broker))
                if keys:
                    added[f"log {broker}"] = keys
        self.set_cluster_property(LAYOUT_PROPERTY, str(LAYOUT))  # (a conflict: the next open checks again)
        return added

    def cluster_property(self, key: str) -> str | None:
        """A Delta table property of the cluster table, from its snapshot (no Spark job)."""
        return table_properties(self.snapshot(self.path("cluster")), key)[0]

    def set_cluster_property(self, key: str, value: str) -> bool:
        """Sets a property of the cluster table (one commit); False when another writer's commit
        to it conflicted (alter_configs at that moment), and nothing was set."""
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import AnalysisException
        try:
            self.spark.sql(f"ALTER TABLE delta.`{self.path('cluster')}` SET TBLPROPERTIES ('{key}' = '{value}')")
            return True
        except (Py4JJavaError, AnalysisException) as err:
            if is_concurrent_conflict(err):
                return False
            raise

    def _log_props(self, broker: int) -> dict[str, str]:
        """A log's Delta properties, with its stamp: the cluster's id and the broker's (Kafka's
        meta.properties), so a location another cluster's broker uses is told."""
        stamp = {LOG_CLUSTER_PROPERTY: self.cluster_id, LOG_BROKER_PROPERTY: str(broker)} if self.cluster_id else {}
        return {**LOG_PROPS, **stamp}

    def create_log(self, broker: int) -> None:
        """An empty log for `broker` at its location, stamped (_log_props)."""
        self._create(self.log_path(broker), schemas.LOG_SCHEMA, self._log_props(broker))

    def remove_log(self, broker: int) -> None:
        """Deletes what is left of a broker's log directory (a lost or corrupted disk)."""
        path = self.log_path(broker)
        if not self.path_exists(path):
            return
        jvm = self.spark._jvm
        hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
        hadoop_path.getFileSystem(self.spark._jsc.hadoopConfiguration()).delete(hadoop_path, True)
