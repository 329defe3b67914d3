"""Infrastructure: where the Delta tables live, how they are created, read and committed.

Every commit a round makes carries the round id and its step in the commit's userMetadata
(`replog-round=<id>;step=<step>`), so recovery can tell from a table's history which steps of an
interrupted round landed. Not Delta's txnAppId/txnVersion: checking it makes every commit rebuild
the table's full snapshot state (three Spark jobs per commit, measured in jobs/profile_round.py).
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from typing import Iterator

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from pipeline import schemas

__all__ = ["Storage", "TXN_APP_ID", "is_uri"]

TXN_APP_ID = "replog-round"


def commit_tag(round_id: int, step: str = "") -> str:
    """The userMetadata of a round's commit to one table."""
    return f"{TXN_APP_ID}={round_id};step={step or 'main'}"
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
}
_PROPS = {
    "delta.autoOptimize.optimizeWrite": "false",
    "delta.checkpointInterval": "20",
}
_INBOX_PROPS = {**_PROPS, "delta.enableChangeDataFeed": "true", "delta.appendOnly": "true"}
_STATE_PROPS = {**_PROPS, "delta.enableDeletionVectors": "true"}


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


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

    def broker_root(self, broker: int) -> str:
        return self.join("brokers", str(broker))

    def log_path(self, broker: int) -> str:
        return self.join("brokers", str(broker), "log")

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
        for name, schema in CLUSTER_TABLES.items():
            if name == "cluster":
                continue  # written last: its presence marks a complete cluster
            props = _INBOX_PROPS if name in ("inbox", "admin") else _STATE_PROPS if name in ("replica_state", "partitions") else _PROPS
            self._create(self.path(name), schema, props)
        for broker in brokers:
            self.create_log(broker)

    def ensure(self, table: str) -> None:
        """Creates a cluster table that a root made by an older release lacks."""
        if not self._is_table(self.path(table)):
            self._create(self.path(table), CLUSTER_TABLES[table], _PROPS)

    def ensure_columns(self, table: str) -> None:
        """Adds the columns of the table's schema that a root made by an older release lacks
        (nullable, at the end: every reader selects by name)."""
        have = set(self.read(table).columns)
        missing = [f for f in CLUSTER_TABLES[table].fields if f.name not in have]
        if missing:
            cols = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
            self.spark.sql(f"ALTER TABLE delta.`{self.path(table)}` ADD COLUMNS ({cols})")

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

    def create_log(self, broker: int) -> None:
        self._create(self.log_path(broker), schemas.LOG_SCHEMA, _PROPS)

    # -- reads -------------------------------------------------------------------------------
    def read(self, table: str) -> DataFrame:
        return self.spark.read.format("delta").load(self.path(table))

    def read_log(self, broker: int) -> DataFrame:
        return self.spark.read.format("delta").load(self.log_path(broker))

    def version(self, table: str) -> int:
        """The table's newest version, from the Delta log's listing (no Spark job: Delta's own
        DeltaLog.update, ~4 ms, where `DeltaTable.history(1)` runs a job, ~230 ms, measured on 2 cores)."""
        path = self.path(table)
        try:
            jvm = self.spark._jvm
            none = jvm.scala.Option.empty()
            log = getattr(jvm.org.apache.spark.sql.delta, "DeltaLog").forTable(self.spark._jsparkSession, path)
            return int(log.update(False, none, none).version())
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
    def append(self, df: DataFrame, path: str, round_id: int | None = None, step: str = "") -> None:
        """Append; with a round id, the commit is tagged with it (see `commit_tag`)."""
        writer = df.write.format("delta").mode("append")
        if round_id is not None:
            writer = writer.option("userMetadata", commit_tag(round_id, step))
        writer.save(path)

    def append_table(self, df: DataFrame, table: str, round_id: int | None = None) -> None:
        self.append(df, self.path(table), round_id)

    @contextmanager
    def _tagged(self, round_id: int | None, step: str = "") -> Iterator[None]:
        conf = self.spark.conf
        if round_id is None:
            yield
            return
        conf.set("spark.databricks.delta.commitInfo.userMetadata", commit_tag(round_id, step))
        try:
            yield
        finally:
            conf.unset("spark.databricks.delta.commitInfo.userMetadata")

    def upsert(self, df: DataFrame, table: str, keys: list[str], round_id: int | None = None) -> None:
        """MERGE rows by key: update all columns when matched, insert otherwise."""
        condition = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        target = DeltaTable.forPath(self.spark, self.path(table))
        with self._tagged(round_id):
            (target.alias("t").merge(df.alias("s"), condition)
             .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())

    def update_if(self, df: DataFrame, table: str, keys: list[str], only_if: str, insert: bool = False) -> None:
        """MERGE rows by key, updating a matched row only when `only_if` (SQL on t = the table's
        row) holds: a compare-and-set against a concurrent writer; `insert`: unmatched rows too."""
        condition = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        merge = (DeltaTable.forPath(self.spark, self.path(table)).alias("t").merge(df.alias("s"), condition)
                 .whenMatchedUpdateAll(condition=only_if))
        (merge.whenNotMatchedInsertAll() if insert else merge).execute()

    def truncate_logs(self, broker: int, ends_df: DataFrame, round_id: int) -> None:
        """Removes a broker's records at and above each partition's truncation offset (ends_df:
        topic, partition, truncate_to), in one commit: a follower's diverging suffix."""
        target = DeltaTable.forPath(self.spark, self.log_path(broker))
        condition = "t.topic = s.topic AND t.partition = s.partition AND t.offset >= s.truncate_to"
        with self._tagged(round_id, "-truncate"):
            target.alias("t").merge(ends_df.alias("s"), condition).whenMatchedDelete().execute()

    def delete_log_prefixes(self, broker: int, starts_df: DataFrame, round_id: int) -> None:
        """Physically removes a broker's records below each partition's new log start offset
        (starts_df: topic, partition, log_start_offset), in one commit."""
        target = DeltaTable.forPath(self.spark, self.log_path(broker))
        condition = "t.topic = s.topic AND t.partition = s.partition AND t.offset < s.log_start_offset"
        with self._tagged(round_id, "-log-start"):
            target.alias("t").merge(starts_df.alias("s"), condition).whenMatchedDelete().execute()
