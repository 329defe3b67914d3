"""Delta table maintenance for a job that runs for days: compaction of the small files rounds leave,
VACUUM within a retention, and Delta log retention, on every cluster table and broker log.

Every round appends a few small files to the logs and the cluster tables, and commits a few JSON
files to their Delta logs. Left alone, a snapshot's file count and a `_delta_log` listing grow
with the number of rounds, and so does the cost of reading them. `maintain` keeps them bounded:

- compaction: a table whose snapshot holds at least `log.maintenance.min.files` files is
  OPTIMIZEd (Delta's bin-packing, one commit, no change to its rows);
- VACUUM: files no snapshot within `log.maintenance.file.retention.ms` needs are deleted
  (the table's `delta.deletedFileRetentionDuration`; Delta's default is 7 days);
- log retention: the tables the round writes keep `log.maintenance.log.retention.ms` of
  `_delta_log` history (`delta.logRetentionDuration`, cleaned up by Delta when it writes a
  checkpoint, every `delta.checkpointInterval` = 20 commits).

The inbox and admin tables keep Delta's defaults for both retentions (30 days of log, 7 days of
files) and are only compacted: the round reads them as a change feed from its last position,
which a stopped job may leave far behind, and Delta refuses a change-feed read of a version older
than the table's file retention (DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION_DURATION).
So a job stopped for longer than 7 days while producers wrote cannot resume from its position.

The replication job calls `Cluster.maintain_if_due` after each round: a pass when
`log.maintenance.interval.ms` (cluster clock) has passed since the last one, whichever job ran it
(its time is a property of the cluster table); `replog maintain` runs a pass by hand.
Maintenance never runs inside a round: its commits carry no round tag, and recovery
(recovery.py) only ever undoes commits of a round newer than the last complete one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Mapping

from delta.tables import DeltaTable

from pipeline.storage import CLUSTER_TABLES, Storage, is_concurrent_conflict, unwritable_error

__all__ = ["MaintenanceReport", "maintain", "table_paths", "wanted_properties", "CHANGE_FEED_TABLES", "last_pass_ms", "record_pass"]

# read as change feeds from the job's last position: their Delta log history stays at Delta's default
CHANGE_FEED_TABLES = ("inbox", "admin")


# a table property of the cluster table: the cluster-clock time of the last pass, so a job that
# starts (an Airflow run of --available-now) knows whether a pass is due
LAST_PASS_PROPERTY = "replog.maintenance.lastPassMs"


def last_pass_ms(storage: Storage) -> int | None:
    value = storage.cluster_property(LAST_PASS_PROPERTY)
    return int(value) if value is not None else None


def record_pass(storage: Storage, now_ms: int) -> bool:
    """Records a pass's time; False when another writer's commit to the cluster table conflicted
    (alter_configs at that moment): the time goes unrecorded, and the next pass records its own."""
    return storage.set_cluster_property(LAST_PASS_PROPERTY, str(int(now_ms)))


@dataclass
class MaintenanceReport:
    tables: int = 0  # tables and logs looked at
    compacted: list[str] = field(default_factory=list)  # those OPTIMIZEd
    files_removed: int = 0  # small files the compactions replaced
    files_added: int = 0  # the files they wrote
    files_vacuumed: int = 0  # files VACUUM deleted from storage
    properties_set: list[str] = field(default_factory=list)  # tables whose retention properties changed

    def __iadd__(self, other: "MaintenanceReport") -> "MaintenanceReport":
        """Adds another table's report: its counts added, its lists after this one's."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self


def wanted_properties(name: str, config: Mapping) -> dict[str, str]:
    """The Delta table properties `name`'s table should have under `config`."""
    if name in CHANGE_FEED_TABLES:
        return {}  # Delta's defaults (module doc)
    return {"delta.deletedFileRetentionDuration": f"interval {config['log.maintenance.file.retention.ms']} milliseconds",
            "delta.logRetentionDuration": f"interval {config['log.maintenance.log.retention.ms']} milliseconds"}


def table_paths(storage: Storage, brokers: list[int]) -> dict[str, str]:
    """name -> path of every cluster table and every broker log on storage (a lost disk has none)."""
    tables = {name: storage.path(name) for name in CLUSTER_TABLES}
    for broker in brokers:
        if storage.path_exists(storage.log_path(broker) + "/_delta_log"):
            tables[f"log of broker {broker}"] = storage.log_path(broker)
    return tables


def _set_properties(storage: Storage, path: str, snap, wanted: dict[str, str]) -> bool:
    conf = snap.metadata().configuration()
    differ = {k: v for k, v in wanted.items() if not conf.contains(k) or conf.apply(k) != v}
    if differ:
        props = ", ".join(f"'{k}' = '{v}'" for k, v in sorted(differ.items()))
        storage.spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({props})")
    return bool(differ)


# tables maintained at once: a pass is a few small Spark jobs and commits per table, mostly driver
# latency (listing, the Delta log, the commit), which threads overlap
PARALLEL_TABLES = 4


def maintain(storage: Storage, brokers: list[int], config: Mapping) -> MaintenanceReport:
    """One pass over every table and log: retention properties, compaction, VACUUM (module doc),
    PARALLEL_TABLES tables at a time. The report lists tables in table_paths' order; the first
    table's failure in that order is raised, after every table's pass has ended."""
    from concurrent.futures import ThreadPoolExecutor
    tables = list(table_paths(storage, brokers).items())
    with ThreadPoolExecutor(max_workers=PARALLEL_TABLES, thread_name_prefix="replog-maintain") as pool:
        futures = [pool.submit(_maintain_table, storage, name, path, config) for name, path in tables]
    report = MaintenanceReport()
    for future in futures:
        report += future.result()
    return report


def _maintain_table(storage: Storage, name: str, path: str, config: Mapping) -> MaintenanceReport:
    report = MaintenanceReport(tables=1)
    # this thread's JVM thread has no active session of its own, and Delta asks for one
    jvm = storage.spark._jvm
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(storage.spark._jsparkSession)
    snap = storage.snapshot(path)
    table = DeltaTable.forPath(storage.spark, path)
    with unwritable_error(path, storage.broker_of_log(path)):
        if _set_properties(storage, path, snap, wanted_properties(name if name in CLUSTER_TABLES else "log", config)):
            report.properties_set.append(name)
        if snap.numOfFiles() >= config["log.maintenance.min.files"]:
            metrics = _compaction(table)
            if metrics is not None:
                report.compacted.append(name)
                report.files_removed += int(metrics["numFilesRemoved"])
                report.files_added += int(metrics["numFilesAdded"])
        before = int(storage.snapshot(path).version())
        table.vacuum()
    report.files_vacuumed += _vacuumed(storage, path, before)
    return report


def _compaction(table: DeltaTable):
    """OPTIMIZE's metrics; None when another writer's commit conflicted (a producer's append never
    does; a topic created meanwhile may): the table is compacted at a later pass."""
    from py4j.protocol import Py4JJavaError
    try:
        return table.optimize().executeCompaction().first()["metrics"]
    except Py4JJavaError as err:
        if is_concurrent_conflict(err):
            return None
        raise


def _vacuumed(storage: Storage, path: str, before: int) -> int:
    """Files deleted by the VACUUM committed after version `before` (its VACUUM END commit's
    metrics; 0 when Delta logged none)."""
    newest = int(storage.snapshot(path).version())
    for version in range(newest, before, -1):
        info = storage.commit_info(path, version) or {}
        if info.get("operation") == "VACUUM END":
            return int(info.get("operationMetrics", {}).get("numDeletedFiles", 0))
    return 0
