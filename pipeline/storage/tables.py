"""Where a root's Delta tables live and how they are read and committed: paths (a local path or a
URI of any store Spark can reach, each broker's log at its own location), reads, versions from
the Delta log with no Spark job, and the round's tagged commits. Table creation and upgrades are
in layout.py, history reads and undo writes in history.py (both mixed into Storage)."""

from __future__ import annotations

import os
import re
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterable, Iterator

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from pipeline import schemas
from pipeline.errors import ErrorCode, ReplogError
from pipeline.runtime import settings_restored
from pipeline.storage.committers import COMMITTERS, wait_all
from pipeline.storage.failures import unwritable_error
from pipeline.storage.history import History, commit_tag, parse_tag
from pipeline.storage.layout import Layout

__all__ = ["Storage", "is_uri", "current_rows", "current_rows_sql"]


def current_rows(df: DataFrame, keys: list[str]) -> DataFrame:
    """The newest row of each key by `round_id`, of a table that is written by appending rows
    (replica_state: a round appends the rows it changed; see Storage.replica_state)."""
    newest = Window.partitionBy(*keys).orderBy(F.col("round_id").desc())
    return df.withColumn("_newest", F.row_number().over(newest)).filter(F.col("_newest") == 1).drop("_newest")


def current_rows_sql(table_sql: str, keys: list[str]) -> str:
    """current_rows in Spark SQL, for the views: a subquery of `table_sql`'s newest row per key."""
    return (f"(SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY {', '.join(keys)} "
            f"ORDER BY round_id DESC) AS _newest FROM {table_sql}) WHERE _newest = 1)")


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


def is_uri(root: str) -> bool:
    """s3a://..., abfss://..., gs://..., file:///... (or file:/...): a root Hadoop's FileSystem resolves."""
    return bool(_URI.match(root))


class Storage(Layout, History):
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


    def overwrite_table(self, df: DataFrame, table: str) -> None:
        df.write.format("delta").mode("overwrite").save(self.path(table))


    # -- reads -------------------------------------------------------------------------------
    def read(self, table: str) -> DataFrame:
        return self.spark.read.format("delta").load(self.path(table))


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
        wait_all([COMMITTERS.submit(self.append, df, path, round_id) for df, path in appends])

    def commit_round_row(self, row: DataFrame, outputs: list[tuple[DataFrame, str]], round_id: int) -> None:
        """A round's last commit wave: its outputs (df, table name) and its rounds row `row` at
        once, one commit each, from threads (append_all). The row's commit names the others' tables
        (`WRITTEN_WITH`): the round is complete when all of them landed (recovery.py). So an output
        with no rows still records its commit here (Delta skips recording an empty one by default)."""
        tables = tuple(table for _, table in outputs)
        appends = [(df, self.path(table)) for df, table in outputs]
        with self._session_conf("spark.databricks.delta.skipRecordingEmptyCommits", "false"):
            wait_all([COMMITTERS.submit(self.append, df, path, round_id) for df, path in appends]
                      + [COMMITTERS.submit(self.append, row, self.path("rounds"), round_id, "", tables)])


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

    def _merge_delete(self, path: str, df: DataFrame, condition: str, round_id: int | None = None,
                      step: str = "", user_metadata: str | None = None, unmatched: bool = False) -> None:
        """One MERGE that deletes rows of the table at `path` (t) against `df` (s) in one commit:
        the rows `condition` matches, or with `unmatched` the rows it matches in no row of `df`.
        Tagged with the round (and `step`) or with `user_metadata`; a write the file system refuses
        raises KAFKA_STORAGE_ERROR (unwritable_error), as the round's appends do."""
        if user_metadata is not None:
            tagged = self._metadata(user_metadata)
            refused = unwritable_error(path, self.broker_of_log(path))
        else:
            tagged, refused = self._tagged(round_id, path, step), nullcontext()
        with tagged, refused:
            merge = DeltaTable.forPath(self.spark, path).alias("t").merge(df.alias("s"), condition)
            (merge.whenNotMatchedBySourceDelete() if unmatched else merge.whenMatchedDelete()).execute()

    def truncate_logs(self, broker: int, ends_df: DataFrame, round_id: int) -> None:
        """Removes a broker's records at and above each partition's truncation offset (ends_df:
        topic, partition, truncate_to), in one commit: a follower's diverging suffix."""
        self._merge_delete(self.log_path(broker), ends_df,
                           "t.topic = s.topic AND t.partition = s.partition AND t.offset >= s.truncate_to",
                           round_id, "truncate")

    def delete_log_prefixes(self, broker: int, starts_df: DataFrame, round_id: int) -> None:
        """Physically removes a broker's records below each partition's new log start offset
        (starts_df: topic, partition, log_start_offset), in one commit."""
        self._merge_delete(self.log_path(broker), starts_df,
                           "t.topic = s.topic AND t.partition = s.partition AND t.offset < s.log_start_offset",
                           round_id, "log-start")

    def delete_stray_records(self, broker: int, kept_df: DataFrame, round_id: int) -> None:
        """Removes every record of a broker's log outside the offsets its replicas hold (kept_df:
        topic, partition, log_start_offset, log_end_offset), in one commit: the records of replicas
        that were moved off the broker, or re-added to it, while it was down (Kafka's stray replicas)."""
        self._merge_delete(self.log_path(broker), kept_df,
                           "t.topic = s.topic AND t.partition = s.partition AND t.offset >= s.log_start_offset "
                           "AND t.offset < s.log_end_offset", round_id, "stray", unmatched=True)

    def delete_replicas(self, keys_df: DataFrame, round_id: int) -> None:
        """Deletes every row (the superseded ones too) of the replicas in keys_df (topic, partition,
        broker) from replica_state, in one commit: replicas a reassignment removed."""
        self._merge_delete(self.path("replica_state"), keys_df,
                           " AND ".join(f"t.{k} = s.{k}" for k in schemas.REPLICA_KEY), round_id, "reassign")

    def delete_log_records(self, broker: int, removed_df: DataFrame, user_metadata: str) -> None:
        """Removes single records of a broker's log (removed_df: topic, partition, offset), in one
        commit tagged `user_metadata`: the log cleaner's compaction."""
        self._merge_delete(self.log_path(broker), removed_df,
                           "t.topic = s.topic AND t.partition = s.partition AND t.offset = s.offset",
                           user_metadata=user_metadata)


