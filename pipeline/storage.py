"""Infrastructure: where the Delta tables live, how they are created, read and committed.

Every commit a round makes carries the round id, its step and the round's inputs in the commit's
userMetadata (`replog-round=<id>;step=<step>;now=<ms>;inbox=<v>;admin=<v>;restarted=<0|1>`), so
recovery (pipeline/recovery.py) can tell from a table's history which commits of an interrupted
round landed, undo them, and replay the round with the same inputs. Not Delta's
txnAppId/txnVersion: checking it makes every commit rebuild the table's full snapshot state (three
Spark jobs per commit, measured in jobs/profile_round.py).
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from pipeline import schemas
from pipeline.errors import ErrorCode, LogDirFailure, ReplogError
from pipeline.spark import settings_restored

__all__ = ["Storage", "TXN_APP_ID", "is_concurrent_conflict", "RECOVERY_APP_ID", "is_uri", "parse_tag", "current_rows", "current_rows_sql",
           "all_null", "added_rows", "table_properties", "log_stamp"]

TXN_APP_ID = "replog-round"
RECOVERY_APP_ID = "replog-recovery"
WRITTEN_WITH = "with"  # the commit tag's field naming the tables a rounds row was committed with


def commit_tag(round_id: int, step: str = "", inputs: str = "", written_with: tuple[str, ...] = ()) -> str:
    """The userMetadata of a round's commit to one table (`inputs`: the round's replay inputs;
    `written_with`: the tables committed at once with this one, which the rounds row's commit names)."""
    return (f"{TXN_APP_ID}={round_id};step={step or 'main'}" + (f";{WRITTEN_WITH}={','.join(written_with)}"
                                                               if written_with else "") + (f";{inputs}" if inputs else ""))


def parse_tag(user_metadata: str | None) -> dict[str, str]:
    """The fields of a commit's userMetadata written by commit_tag or a recovery ({} for others)."""
    if not user_metadata or not user_metadata.startswith((TXN_APP_ID + "=", RECOVERY_APP_ID + "=")):
        return {}
    return dict(part.split("=", 1) for part in user_metadata.split(";") if "=" in part)

def current_rows(df: DataFrame, keys: list[str]) -> DataFrame:
    """The newest row of each key by `round_id`, of a table that is written by appending rows
    (replica_state: a round appends the rows it changed; see Storage.replica_state)."""
    newest = Window.partitionBy(*keys).orderBy(F.col("round_id").desc())
    return df.withColumn("_newest", F.row_number().over(newest)).filter(F.col("_newest") == 1).drop("_newest")


def current_rows_sql(table_sql: str, keys: list[str]) -> str:
    """current_rows in Spark SQL, for the views: a subquery of `table_sql`'s newest row per key."""
    return (f"(SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY {', '.join(keys)} "
            f"ORDER BY round_id DESC) AS _newest FROM {table_sql}) WHERE _newest = 1)")


# the threads that commit a round's appends at once (Storage.append_all)
_COMMITTERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="replog-commit")

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
_LOG_PROPS = {**_PROPS, "delta.dataSkippingStatsColumns": "topic,partition,offset,timestamp"}
# a log's stamp: the cluster and the broker it belongs to (Kafka's meta.properties in a log dir)
LOG_CLUSTER_PROPERTY = "replog.cluster.id"
LOG_BROKER_PROPERTY = "replog.broker.id"

# The cluster table's property naming the layout of the root's tables. Raise LAYOUT whenever a
# release adds a cluster table or a column: a root whose cluster table says less (a root made
# before the property existed says nothing: 0) is brought up to date once, by Storage.upgrade.
LAYOUT_PROPERTY = "replog.layout"
# 2: statistics on the columns reads skip by, of the logs, replica_state and results; 3: each log
# stamped with its cluster and broker, and the brokers table's default locations relative to the root
LAYOUT = 3
# the tables later releases added: a root made before one lacks it, and every open creates it then
LATER_TABLES = ("group_offsets", "elections", "lease", "cleaner", "cleaner_runs", "client_quotas")


def _table_props(name: str) -> dict[str, str]:
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


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")
# what a local or Hadoop file system says when it refuses a write (read-only, full, permissions)
_IO_FAILURE = re.compile(r"(java\.io\.\w*(?:IOException|FileNotFoundException)|java\.nio\.file\.\w+Exception"
                         r"|org\.apache\.hadoop\.security\.AccessControlException): ([^\n]*)")


@contextmanager
def unwritable_error(path: str, broker: int | None = None) -> Iterator[None]:
    """A write to `path` that the file system refuses (a read-only directory, a full disk, missing
    permissions) raises KAFKA_STORAGE_ERROR (LogDirFailure), Kafka's error for a log directory that
    failed, naming `broker`'s log (or the table) and what the file system said. A round that meets
    it on a broker's log halts that broker (Cluster.run_round); its commits that landed before are
    undone by the next round (recovery.py)."""
    from py4j.protocol import Py4JJavaError
    try:
        yield
    except Py4JJavaError as err:
        found = _IO_FAILURE.search(str(err))
        if found is None:
            raise
        what = f"the log of broker {broker}" if broker is not None else "the table"
        remedy = (f"A round halts broker {broker} for it (a failed log directory); start_broker({broker}) "
                  "restarts it once its location can be written again, or is replaced by an empty one"
                  if broker is not None else "Make the directory writable (or free space); the next round "
                  "then completes this one, losing nothing")
        raise LogDirFailure(f"{what} at {path} cannot be written: {found.group(2).strip()} ({found.group(1)})",
                            remedy, broker) from None


# Delta's commit-conflict exceptions (io.delta.exceptions): another writer committed first
_CONFLICTS = ("DeltaConcurrentModificationException", "ConcurrentWriteException", "MetadataChangedException",
              "ProtocolChangedException", "ConcurrentAppendException", "ConcurrentDeleteReadException",
              "ConcurrentDeleteDeleteException", "ConcurrentTransactionException")


def is_concurrent_conflict(error: BaseException) -> bool:
    """Whether `error` is Delta's refusal of a commit that conflicts with another writer's: the
    Python class delta-spark converts it to, or a Py4J error naming the Java one."""
    text = str(error)
    return type(error).__name__ in _CONFLICTS or any(f"io.delta.exceptions.{n}" in text for n in _CONFLICTS)



def _wait_all(futures: list) -> None:
    """Waits for every one of `futures` (work on _COMMITTERS); then raises the first failure, if any."""
    errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error


def all_null(file_stats: list[dict] | None, column: str) -> bool | None:
    """Whether every row of the files whose statistics are `file_stats` (Storage.added_file_stats)
    has `column` null; None when they are unknown or do not count that column's nulls."""
    if file_stats is None:
        return None
    for stats in file_stats:
        nulls = stats.get("nullCount", {}).get(column)
        if nulls is None:
            return None
        if nulls < stats["numRecords"]:
            return False
    return True


def added_rows(file_stats: list[dict] | None) -> int | None:
    """The rows of the files whose statistics are `file_stats` (Storage.added_file_stats); None
    when they are unknown."""
    return None if file_stats is None else sum(stats["numRecords"] for stats in file_stats)


def table_properties(snapshot, *keys: str) -> tuple[str | None, ...]:
    """Delta table properties from a table's snapshot (Storage.snapshot; None where unset)."""
    conf = snapshot.metadata().configuration()
    return tuple(str(conf.apply(k)) if conf.contains(k) else None for k in keys)


def log_stamp(snapshot) -> tuple[str | None, str | None]:
    """(cluster id, broker id) a log was stamped with, from its snapshot (None: a log made before
    the stamp, or a table of no cluster)."""
    return table_properties(snapshot, LOG_CLUSTER_PROPERTY, LOG_BROKER_PROPERTY)  # type: ignore[return-value]


def is_uri(root: str) -> bool:
    """s3a://..., abfss://..., gs://..., file:///... (or file:/...): a root Hadoop's FileSystem resolves."""
    return bool(_URI.match(root))


class Storage:
    """Paths and I/O of one cluster root: a local path or a URI of any store Spark can reach."""

    def __init__(self, spark: SparkSession, root: str):
        self.spark = spark
        # a URI (s3a://bucket/replog, abfss://..., file:///data/replog) goes through Hadoop's
        # FileSystem as it is; a plain path is made absolute
        self.uri = is_uri(root)
        self.root = self._qualified(root.rstrip("/")) if self.uri else os.path.abspath(root)
        # a round's commits: its replay inputs (tagged on each commit), a check run before each
        # (the one-writer lease) and a callback after each (tests inject crashes there)
        self.round_inputs = ""
        self.before_commit: Callable[[], None] | None = None
        self.after_commit: Callable[[str, str], None] | None = None
        # the brokers whose storage location is not the default <root>/brokers/<id> (Kafka's
        # log.dirs, one location per broker), from the brokers table (set_broker_dirs)
        self.broker_dirs: dict[int, str] = {}
        self.cluster_id: str | None = None  # the cluster table's id, stamped on the logs made

    def _qualified(self, uri: str) -> str:
        """The URI as Hadoop and Delta spell it (file:///x is file:/x), so table locations match."""
        hadoop_path = self.spark._jvm.org.apache.hadoop.fs.Path(uri)
        return str(hadoop_path.getFileSystem(self.spark._jsc.hadoopConfiguration()).makeQualified(hadoop_path).toString())

    # -- paths -------------------------------------------------------------------------------
    def join(self, *parts: str) -> str:
        """A path under the root ("/"-joined for a URI)."""
        return "/".join([self.root, *parts]) if self.uri else os.path.join(self.root, *parts)

    def path(self, table: str) -> str:
        return self.join("cluster", table)

    def location(self, given: str) -> str:
        """A broker location as given by a user (a path, or a URI Spark can write), spelled as
        this class spells paths: absolute, or qualified as Hadoop qualifies it."""
        given = str(given).rstrip("/") or "/"
        return self._qualified(given) if is_uri(given) else os.path.abspath(os.path.expanduser(given))

    def default_broker_root(self, broker: int) -> str:
        return self.join("brokers", str(broker))

    def broker_root(self, broker: int) -> str:
        """The broker's storage location (Kafka's log.dirs): the one it was given, or
        <root>/brokers/<id>."""
        return self.broker_dirs.get(broker) or self.default_broker_root(broker)

    def log_path(self, broker: int) -> str:
        where = self.broker_root(broker)
        return f"{where}/log" if is_uri(where) else os.path.join(where, "log")

    def broker_of_log(self, path: str) -> int | None:
        """The broker whose log is at `path` (None: no broker's)."""
        path = path.rstrip("/")
        given = [b for b in self.broker_dirs if self.log_path(b) == path]
        if given:
            return given[0]
        default = re.fullmatch(re.escape(self.join("brokers", "")) + r"(\d+)" + re.escape(os.sep if not self.uri else "/")
                               + "log", path)
        return int(default.group(1)) if default and int(default.group(1)) not in self.broker_dirs else None

    def stored_location(self, broker: int) -> str:
        """The brokers table's `path` of a broker: its location, or, for the default one, the path
        relative to the root ("brokers/<id>"), so a root copied or moved keeps its brokers."""
        return self.broker_dirs.get(broker) or f"brokers/{broker}"

    def set_broker_dirs(self, stored: Iterable[tuple[int, str]]) -> None:
        """The brokers' locations from the brokers table's (broker, path) rows: a relative path is
        the default under the root."""
        self.broker_dirs = {b: path for b, path in stored if path and (is_uri(path) or os.path.isabs(path))}

    def path_exists(self, path: str) -> bool:
        """Whether `path` exists, by Hadoop's FileSystem for a URI (any store Spark can reach)."""
        if not is_uri(path):
            return os.path.exists(path)
        jvm = self.spark._jvm
        hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
        return bool(hadoop_path.getFileSystem(self.spark._jsc.hadoopConfiguration()).exists(hadoop_path))

    def _is_table(self, path: str) -> bool:
        return self.path_exists(f"{path}/_delta_log")

    def exists(self) -> bool:
        return self._is_table(self.path("cluster"))

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
        made = [_COMMITTERS.submit(self._create, self.path(name), schema, _table_props(name))
                for name, schema in CLUSTER_TABLES.items() if name != "cluster"]
        made += [_COMMITTERS.submit(self.create_log, broker) for broker in brokers]
        _wait_all(made)

    def create_cluster_table(self) -> None:
        """The cluster table, last: its presence marks a complete cluster, of this release's layout."""
        self._create(self.path("cluster"), schemas.CLUSTER_SCHEMA, _table_props("cluster"))

    def ensure(self, table: str) -> bool:
        """Creates a cluster table that is missing (a root made by a release before the table);
        whether it had to. A check of the file system, no Delta log read."""
        if self._is_table(self.path(table)):
            return False
        self._create(self.path(table), CLUSTER_TABLES[table], _table_props(table))
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
                changes += self.ensure_properties(self.path(name), _table_props(name))
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

    def overwrite_table(self, df: DataFrame, table: str) -> None:
        df.write.format("delta").mode("overwrite").save(self.path(table))

    def remove_log(self, broker: int) -> None:
        """Deletes what is left of a broker's log directory (a lost or corrupted disk)."""
        path = self.log_path(broker)
        if not self.path_exists(path):
            return
        jvm = self.spark._jvm
        hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
        hadoop_path.getFileSystem(self.spark._jsc.hadoopConfiguration()).delete(hadoop_path, True)

    def _log_props(self, broker: int) -> dict[str, str]:
        """A log's Delta properties, with its stamp: the cluster's id and the broker's (Kafka's
        meta.properties), so a location another cluster's broker uses is told."""
        stamp = {LOG_CLUSTER_PROPERTY: self.cluster_id, LOG_BROKER_PROPERTY: str(broker)} if self.cluster_id else {}
        return {**_LOG_PROPS, **stamp}

    def create_log(self, broker: int) -> None:
        """An empty log for `broker` at its location, stamped (_log_props)."""
        self._create(self.log_path(broker), schemas.LOG_SCHEMA, self._log_props(broker))

    # -- reads -------------------------------------------------------------------------------
    def read(self, table: str) -> DataFrame:
        return self.spark.read.format("delta").load(self.path(table))

    def rows_changed(self, table: str, after: int, upto: int) -> bool:
        """Whether a commit to `table` after version `after`, up to `upto`, may have changed its
        rows: one that adds or removes a file with Delta's `dataChange` flag (a compaction's files
        and a change of properties have none) or writes change data. A commit file that is gone
        (Delta's log retention) counts as a change, as does a version that went back."""
        if upto <= after:
            return upto != after
        for version in range(after + 1, upto + 1):  # (read on the driver: no Spark job)
            actions = self._commit_actions(self.path(table), version)
            if actions is None or any("cdc" in a or a.get(kind, {}).get("dataChange", kind in a)
                                      for a in actions for kind in ("add", "remove")):
                return True
        return False

    def replica_state(self) -> DataFrame:
        """Every replica's current row. replica_state only grows: a round appends the rows it
        changed (an append costs the same at any size, where a MERGE scans the whole table), and
        a row supersedes the older rows of its replica by its larger round_id. compact_replica_state
        rewrites it to the current rows once the superseded ones are as many."""
        return current_rows(self.read("replica_state"), schemas.REPLICA_KEY)

    def compact_replica_state(self, round_id: int, rows: DataFrame | None = None, version: int | None = None) -> bool:
        """Rewrites replica_state as its current rows at its newest version (one commit, tagged with
        the round that asked for it); whether the table now holds them. Raises Delta's
        concurrent-modification error when another writer commits while the overwrite is written.

        `rows`: the table's current rows at `version`, which the caller already holds (a round's
        carry), written instead of reading the table again when it is still at `version`.

        Delta checks an overwrite only against commits after its transaction began, which is when
        the write starts, after the current rows were computed. A commit of another writer in
        between (a new topic's rows, from another process) would be replaced with the rest. So
        the overwrite's commit is checked for the version it replaced: when that is not the version
        the rows came from, the table is restored to the version it replaced (every row, the other
        writer's too) and is not compact (False); a later round compacts it. If yet another commit
        followed the overwrite, restoring would undo that one: KAFKA_STORAGE_ERROR is raised instead."""
        path = self.path("replica_state")
        newest = self.table_version(path)
        if rows is not None and version == newest:
            current = rows.select(*schemas.REPLICA_STATE_SCHEMA.fieldNames())
        else:
            version = newest
            current = current_rows(self.read_version(path, version), schemas.REPLICA_KEY).localCheckpoint()
        with self._tagged(round_id, path, "compact"):
            current.write.format("delta").mode("overwrite").save(path)
        newest = committed = self.table_version(path)
        while committed > version:  # the overwrite's commit: the newest, unless others followed it
            info = self.commit_info(path, committed) or {}
            tag = parse_tag(info.get("userMetadata"))
            if tag.get("replog-round") == str(round_id) and tag.get("step") == "compact":
                break
            committed -= 1
        else:  # the overwrite's commit was not found
            info = {}
        replaced = info.get("readVersion")
        if replaced == version:
            return True
        if committed == newest and replaced is not None:
            self.restore(path, replaced, commit_tag(round_id, "compact-undone", self.round_inputs))
            return False
        raise ReplogError(
            ErrorCode.KAFKA_STORAGE_ERROR,
            f"replica_state at {path} was compacted (version {committed}) from its rows at version {version}, "
            f"while another writer committed versions up to {replaced}, whose rows the compaction replaced, "
            f"and commits followed it. Stop the other writers, RESTORE the table to version {replaced} "
            "(RESTORE TABLE delta.`<path>` TO VERSION AS OF ...) and run a round.")

    def reset_replica_state(self, broker: int, columns: dict[str, str]) -> None:
        """Sets `columns` (SQL expressions) in every row of `broker`'s replicas in replica_state,
        the superseded rows too, so the current row of each holds them (one commit)."""
        DeltaTable.forPath(self.spark, self.path("replica_state")).update(
            condition=F.col("broker") == broker, set=columns)

    def delete_rows(self, path: str, condition: str, user_metadata: str) -> None:
        """Deletes the rows matching `condition` (SQL) from the table at `path`, in one commit tagged
        `user_metadata`."""
        with self._metadata(user_metadata):
            DeltaTable.forPath(self.spark, path).delete(condition)

    def read_log(self, broker: int) -> DataFrame:
        return self.spark.read.format("delta").load(self.log_path(broker))

    def version(self, table: str) -> int:
        """The table's newest version, from the Delta log's listing (no Spark job: Delta's own
        DeltaLog.update, ~4 ms, where `DeltaTable.history(1)` runs a job, ~230 ms, measured on 2 cores)."""
        return self._newest_version(self.path(table))

    def snapshot(self, path: str):
        """Delta's current snapshot (a JVM object) of the table at `path`, brought up to date from
        its log's listing, with no Spark job. Delta's internal API: `_newest_version` falls back to
        the public one when a release changes it."""
        jvm = self.spark._jvm
        none = jvm.scala.Option.empty()
        log = getattr(jvm.org.apache.spark.sql.delta, "DeltaLog").forTable(self.spark._jsparkSession, path)
        return log.update(False, none, none)

    def unwritten(self, table: str, version: int | None = None) -> bool:
        """Whether the table has had no commit since it was made (its version, or `version` when
        the caller has it, is 0): `_create` makes every table empty, so it holds no rows, known with
        no Spark job."""
        return (self.version(table) if version is None else version) == 0

    def schema_at(self, path: str) -> StructType:
        """The schema of the Delta table at `path`: a read's plan, which loads the Delta log and
        runs no Spark job (reading a row ran one, ~0.3-2 s in a process's first round). Raises
        what Delta raises for a log it cannot load."""
        return self.spark.read.format("delta").load(path).schema

    def _newest_version(self, path: str) -> int:
        try:
            return int(self.snapshot(path).version())
        except Exception:  # a Delta release without this internal signature: the public API
            return DeltaTable.forPath(self.spark, path).history(1).collect()[0]["version"]

    def read_changes(self, table: str, after_version: int, to_version: int) -> DataFrame:
        """Rows appended in versions (after_version, to_version] of an append-only CDF table."""
        return (
            self.spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", after_version + 1)
            .option("endingVersion", to_version)
            .load(self.path(table))
        )

    # -- writes ------------------------------------------------------------------------------
    def append(self, df: DataFrame, path: str, round_id: int | None = None, step: str = "",
               written_with: tuple[str, ...] = ()) -> None:
        """Append; with a round id, the commit is tagged with it (see `commit_tag`). A write the
        file system refuses raises KAFKA_STORAGE_ERROR (unwritable_error)."""
        writer = df.write.format("delta").mode("append")
        if round_id is None:
            with unwritable_error(path, self.broker_of_log(path)):
                writer.save(path)
            return
        with self._round_commit(path, step):
            with unwritable_error(path, self.broker_of_log(path)):
                writer.option("userMetadata", commit_tag(round_id, step, self.round_inputs, written_with)).save(path)

    def append_table(self, df: DataFrame, table: str, round_id: int | None = None) -> None:
        self.append(df, self.path(table), round_id)

    def append_all(self, appends: list[tuple[DataFrame, str]], round_id: int | None) -> None:
        """Appends to several tables (df, path) at once, one commit each, from threads of their own:
        a commit is mostly waiting (its write job, the log file, the snapshot update), so
        independent ones overlap (5 commits on 2 cores: 0.73 s one after another, 0.50 s at once).
        Waits for all of them; then raises the first failure, if any."""
        if len(appends) <= 1:
            for df, path in appends:
                self.append(df, path, round_id)
            return
        _wait_all([_COMMITTERS.submit(self.append, df, path, round_id) for df, path in appends])

    def commit_round_row(self, row: DataFrame, outputs: list[tuple[DataFrame, str]], round_id: int) -> None:
        """A round's last commit wave: its outputs (df, table name) and its rounds row `row` at
        once, one commit each, from threads (append_all). The row's commit names the others' tables
        (`WRITTEN_WITH`): the round is complete when all of them landed (recovery.py). So an output
        with no rows still records its commit here (Delta skips recording an empty one by default)."""
        tables = tuple(table for _, table in outputs)
        appends = [(df, self.path(table)) for df, table in outputs]
        with self._session_conf("spark.databricks.delta.skipRecordingEmptyCommits", "false"):
            _wait_all([_COMMITTERS.submit(self.append, df, path, round_id) for df, path in appends]
                      + [_COMMITTERS.submit(self.append, row, self.path("rounds"), round_id, "", tables)])

    def committed_by(self, table: str, round_id: int) -> bool:
        """Whether round `round_id` committed to `table`: its commits are read back from the
        newest until one by an earlier round or a recovery (one small log file each, on the driver)."""
        path = self.path(table)
        for version in range(self.table_version(path), -1, -1):
            info = self.commit_info(path, version)
            if info is None:
                return False
            fields = parse_tag(info.get("userMetadata"))
            if RECOVERY_APP_ID in fields:
                return False
            if TXN_APP_ID in fields and int(fields[TXN_APP_ID]) <= round_id:
                return int(fields[TXN_APP_ID]) == round_id
        return False

    @contextmanager
    def _session_conf(self, key: str, value: str) -> Iterator[None]:
        with settings_restored(self.spark, [key]):
            self.spark.conf.set(key, value)
            yield

    @contextmanager
    def _round_commit(self, path: str, step: str) -> Iterator[None]:
        if self.before_commit is not None:
            self.before_commit()
        yield
        if self.after_commit is not None:
            self.after_commit(path, step or "main")

    @contextmanager
    def _metadata(self, user_metadata: str) -> Iterator[None]:
        with self._session_conf("spark.databricks.delta.commitInfo.userMetadata", user_metadata):
            yield

    @contextmanager
    def _tagged(self, round_id: int | None, path: str, step: str = "") -> Iterator[None]:
        if round_id is None:
            with unwritable_error(path, self.broker_of_log(path)):
                yield
            return
        with self._round_commit(path, step), self._metadata(commit_tag(round_id, step, self.round_inputs)), \
                unwritable_error(path, self.broker_of_log(path)):
            yield

    def upsert(self, df: DataFrame, table: str, keys: list[str], round_id: int | None = None,
               columns: list[str] | None = None) -> None:
        """MERGE rows by key: update all columns (or only `columns`) when matched, insert otherwise."""
        condition = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        target = DeltaTable.forPath(self.spark, self.path(table))
        with self._tagged(round_id, self.path(table)):
            merge = target.alias("t").merge(df.alias("s"), condition)
            merge = merge.whenMatchedUpdateAll() if columns is None else \
                merge.whenMatchedUpdate(set={f"`{c}`": f"s.`{c}`" for c in columns})
            merge.whenNotMatchedInsertAll().execute()

    def update_if(self, df: DataFrame, table: str, keys: list[str], only_if: str, insert: bool = False) -> int:
        """MERGE rows by key, updating a matched row only when `only_if` (SQL on t = the table's
        row) holds: a compare-and-set against a concurrent writer; `insert`: unmatched rows too.
        Returns the rows it updated or inserted (Delta's MERGE metrics, read with no Spark job)."""
        condition = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        merge = (DeltaTable.forPath(self.spark, self.path(table)).alias("t").merge(df.alias("s"), condition)
                 .whenMatchedUpdateAll(condition=only_if))
        metrics = (merge.whenNotMatchedInsertAll() if insert else merge).execute()
        return int(metrics.first()["num_affected_rows"])

    def truncate_logs(self, broker: int, ends_df: DataFrame, round_id: int) -> None:
        """Removes a broker's records at and above each partition's truncation offset (ends_df:
        topic, partition, truncate_to), in one commit: a follower's diverging suffix."""
        target = DeltaTable.forPath(self.spark, self.log_path(broker))
        condition = "t.topic = s.topic AND t.partition = s.partition AND t.offset >= s.truncate_to"
        with self._tagged(round_id, self.log_path(broker), "truncate"):
            target.alias("t").merge(ends_df.alias("s"), condition).whenMatchedDelete().execute()

    def delete_log_prefixes(self, broker: int, starts_df: DataFrame, round_id: int) -> None:
        """Physically removes a broker's records below each partition's new log start offset
        (starts_df: topic, partition, log_start_offset), in one commit."""
        target = DeltaTable.forPath(self.spark, self.log_path(broker))
        condition = "t.topic = s.topic AND t.partition = s.partition AND t.offset < s.log_start_offset"
        with self._tagged(round_id, self.log_path(broker), "log-start"):
            target.alias("t").merge(starts_df.alias("s"), condition).whenMatchedDelete().execute()

    def delete_replicas(self, keys_df: DataFrame, round_id: int) -> None:
        """Deletes every row (the superseded ones too) of the replicas in keys_df (topic, partition,
        broker) from replica_state, in one commit: replicas a reassignment removed."""
        target = DeltaTable.forPath(self.spark, self.path("replica_state"))
        condition = " AND ".join(f"t.{k} = s.{k}" for k in schemas.REPLICA_KEY)
        with self._tagged(round_id, self.path("replica_state"), "reassign"):
            target.alias("t").merge(keys_df.alias("s"), condition).whenMatchedDelete().execute()

    def delete_log_records(self, broker: int, removed_df: DataFrame, user_metadata: str) -> None:
        """Removes single records of a broker's log (removed_df: topic, partition, offset), in one
        commit tagged `user_metadata`: the log cleaner's compaction."""
        target = DeltaTable.forPath(self.spark, self.log_path(broker))
        condition = "t.topic = s.topic AND t.partition = s.partition AND t.offset = s.offset"
        with self._metadata(user_metadata):
            target.alias("t").merge(removed_df.alias("s"), condition).whenMatchedDelete().execute()

    # -- history and recovery ----------------------------------------------------------------
    def table_version(self, path: str) -> int:
        """The newest version of the table at `path` (see `version`), -1 when there is none."""
        return self._newest_version(path) if self._is_table(path) else -1

    def _commit_actions(self, path: str, version: int) -> list[dict] | None:
        """The actions of one commit of the table at `path`, read from its Delta log file on the
        driver (no Spark job); None when that file is gone (cleaned up after a checkpoint)."""
        jvm = self.spark._jvm
        file = jvm.org.apache.hadoop.fs.Path(f"{path}/_delta_log/{version:020d}.json")
        fs = file.getFileSystem(self.spark._jsc.hadoopConfiguration())
        if not fs.exists(file):
            return None
        stream = fs.open(file)
        try:
            text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def version_of_own_commits(self, table: str, after: int, round_id: int) -> int | None:
        """The table's newest version when every commit to it after version `after` is round
        `round_id`'s (its commit tag), else None: another writer committed meanwhile. Counting a
        round's own commits instead would be wrong when it appended no rows: Delta records no
        commit for that (its skipRecordingEmptyCommits)."""
        newest = self.version(table)
        path = self.path(table)
        for version in range(after + 1, newest + 1):  # (one small log file each, on the driver)
            info = self.commit_info(path, version)
            if info is None or parse_tag(info.get("userMetadata")).get(TXN_APP_ID) != str(round_id):
                return None
        return newest

    def commit_info(self, path: str, version: int) -> dict | None:
        """The commitInfo action of one commit of the table at `path` (see _commit_actions)."""
        actions = self._commit_actions(path, version)
        if actions is None:
            return None
        return next((a["commitInfo"] for a in actions if "commitInfo" in a), {})

    def added_file_stats(self, table: str, after_version: int, to_version: int) -> list[dict] | None:
        """The statistics of every file the commits after `after_version` up to `to_version` added
        (Delta's numRecords and nullCount per file), read from their log files on the driver (no
        Spark job). None when a commit's log file or a file's statistics are missing: only reading
        the rows can tell then."""
        path, stats = self.path(table), []
        for version in range(after_version + 1, to_version + 1):
            actions = self._commit_actions(path, version)
            if actions is None:
                return None
            for add in (a["add"] for a in actions if "add" in a and a["add"].get("dataChange", True)):
                file_stats = json.loads(add.get("stats") or "{}")
                if "numRecords" not in file_stats:
                    return None
                stats.append(file_stats)
        return stats

    def restore(self, path: str, version: int, user_metadata: str) -> None:
        """Delta RESTORE of the table at `path` to `version`, in one commit tagged `user_metadata`."""
        with self._metadata(user_metadata):
            self.spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF {version}")

    def read_version(self, path: str, version: int) -> DataFrame:
        return self.spark.read.format("delta").option("versionAsOf", version).load(path)

    def merge_back(self, path: str, old: DataFrame, keys: list[str], condition: str, user_metadata: str) -> None:
        """Rows matching `condition` (SQL on the table's row t) go back to their `old` row by key,
        or are deleted where `old` has none (old: the keys, `_old` true where a row existed, and
        the table's columns)."""
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        columns = [c for c in old.columns if c != "_old"]
        with self._metadata(user_metadata):
            (DeltaTable.forPath(self.spark, path).alias("t").merge(old.alias("s"), on)
             .whenMatchedUpdate(condition=f"({condition}) AND s._old", set={c: f"s.`{c}`" for c in columns})
             .whenMatchedDelete(condition=f"({condition}) AND NOT s._old").execute())
