"""Each broker's storage location (Kafka's `log.dirs`, one location per broker): where it may be,
and what is wrong with it when a round finds it failed.

Replication buys durability only when a partition's replicas sit in different failure domains, so
a broker may be given a location of its own (a local path on its own disk, or a URI Spark can write:
s3a://, abfss://, gs://, file:/); `<root>/brokers/<id>` stays the default. The cluster's metadata
tables stay under the root.

A location is refused before anything is written when two brokers would share it (one the same as,
or inside, another's), when it lies inside the cluster's metadata tables, when it already holds a
log (another cluster's, or another broker's: INCONSISTENT_CLUSTER_ID, as Kafka refuses a log dir
whose meta.properties names another cluster), and when it cannot be written (KAFKA_STORAGE_ERROR).

Each log is stamped, as Kafka's meta.properties stamps a log dir, with its cluster's id and its
broker's (Storage.create_log). A round checks the stamp of every running broker's log from its
Delta snapshot (no Spark job): a log that is gone, unreadable, of another schema or stamped by
another cluster or broker is a failed log directory, and the broker halts (Cluster.run_round), as a
Kafka broker whose only log dir fails does.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from typing import Any, Mapping

from pyspark.sql.types import StructType

from pipeline.errors import ErrorCode, ReplogError
from pipeline.schemas import LOG_SCHEMA
from pipeline.storage import Storage, is_uri, log_stamp

__all__ = ["check_locations", "given_locations", "split_dirs_config", "log_problem", "write_problem", "DIRS_KEY"]

# a broker's location in a configuration (conf/replog.properties, --config): broker.<id>.log.dirs
DIRS_KEY = re.compile(r"^broker\.(\d+)\.log\.dirs$")


def split_dirs_config(config: Mapping[str, Any] | None) -> tuple[dict[int, str], dict[str, Any]]:
    """(broker -> location, the rest) of a configuration that may name brokers' locations as
    `broker.<id>.log.dirs` (one location per broker: Kafka's comma-separated list of several
    directories is refused with INVALID_CONFIG)."""
    dirs, rest = {}, {}
    for key, value in (config or {}).items():
        found = DIRS_KEY.match(str(key))
        if found is None:
            rest[key] = value
            continue
        if not isinstance(value, str) or not value.strip() or "," in value:
            raise ReplogError(ErrorCode.INVALID_CONFIG,
                              f"'{key}' must be one path or URI (one location per broker), got {value!r}")
        dirs[int(found.group(1))] = value.strip()
    return dirs, rest


def given_locations(brokers: int, configured: Mapping[int, str], broker_dirs: Mapping[int, str] | None) -> dict[int, str]:
    """The locations a new cluster of `brokers` brokers is given, from its config
    (`split_dirs_config`) and `broker_dirs`: INVALID_CONFIG for a broker it has not, or one given
    two different locations."""
    given = {**configured, **(broker_dirs or {})}
    unknown = sorted(b for b in given if not (isinstance(b, int) and 0 <= b < brokers))
    if unknown:
        raise ReplogError(ErrorCode.INVALID_CONFIG, f"locations given for brokers {unknown}, which a cluster of "
                          f"{brokers} brokers (0..{brokers - 1}) has not")
    clash = sorted(b for b in configured if b in (broker_dirs or {}) and configured[b] != broker_dirs[b])
    if clash:
        raise ReplogError(ErrorCode.INVALID_CONFIG,
                          f"brokers {clash} are given one location in broker_dirs and another in the config")
    return given


def _inside(inner: str, outer: str) -> bool:
    """Whether location `inner` is `outer` or lies under it."""
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def check_locations(storage: Storage, wanted: Mapping[int, Any], others: Mapping[int, str]) -> dict[int, str]:
    """The locations `wanted` (broker -> path or URI) spelled as storage spells them, checked
    against each other and against `others` (broker -> the location of each broker already placed):
    raises before anything is written (see the module's text). Returns only the locations that
    differ from a broker's default."""
    placed: dict[int, str] = {}
    for broker, given in sorted(wanted.items()):
        if isinstance(given, bool) or not isinstance(given, (str, os.PathLike)) or not str(given).strip():
            raise ReplogError(ErrorCode.INVALID_CONFIG, f"broker {broker}'s location must be a path or URI, got {given!r}")
        placed[broker] = storage.location(str(given))
    every = {**others, **placed}
    metadata = storage.join("cluster")
    for broker, where in placed.items():
        if _inside(where, metadata):
            raise ReplogError(ErrorCode.INVALID_CONFIG, f"broker {broker}'s location {where} lies inside the "
                              f"cluster's metadata tables ({metadata})")
        for other, theirs in sorted(every.items()):
            if other != broker and (_inside(where, theirs) or _inside(theirs, where)):
                how = "the same location" if where == theirs else "one location inside the other"
                raise ReplogError(ErrorCode.INVALID_CONFIG,
                                  f"brokers {broker} and {other} would share a failure domain ({how}: {where} and "
                                  f"{theirs}): give each broker a location of its own")
    for broker, where in placed.items():
        log = f"{where}/log" if is_uri(where) else os.path.join(where, "log")
        if storage.path_exists(f"{log}/_delta_log"):
            try:
                cluster_id, owner = log_stamp(storage.snapshot(log))
            except Exception:  # noqa: BLE001 - a log Delta cannot load is still not an empty location
                cluster_id, owner = None, None
            whose = (f"the log of broker {owner} of cluster {cluster_id}" if cluster_id else "a Delta table")
            raise ReplogError(ErrorCode.INCONSISTENT_CLUSTER_ID,
                              f"broker {broker}'s location {where} already holds {whose} at {log}: give it an "
                              "empty location (or delete that log if nothing needs it)")
    for broker, where in placed.items():  # (last: the check makes a missing location)
        problem = write_problem(storage, where)
        if problem:
            raise ReplogError(ErrorCode.KAFKA_STORAGE_ERROR, f"broker {broker}'s location {where} {problem}")
    return {b: where for b, where in placed.items() if where != storage.default_broker_root(b)}


def write_problem(storage: Storage, where: str) -> str | None:
    """What stops a write at location `where` (made when missing), by writing and deleting a small
    file there (None: it can be written)."""
    jvm = storage.spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(where)
    try:
        fs = path.getFileSystem(storage.spark._jsc.hadoopConfiguration())
        fs.mkdirs(path)
        probe = jvm.org.apache.hadoop.fs.Path(f"{where.rstrip('/')}/.replog-probe-{uuid.uuid4().hex[:8]}")
        fs.create(probe, True).close()
        fs.delete(probe, False)
    except Exception as err:  # noqa: BLE001 - what the file system said is the message
        said = str(err).strip().splitlines()
        return f"cannot be written ({said[-1] if said else type(err).__name__})"
    return None


def log_problem(storage: Storage, broker: int) -> str | None:
    """What is wrong with a broker's log (None: a Delta table with the log's columns, stamped by
    this cluster for this broker, or by no one: a log made before the stamp), from its Delta
    snapshot: no Spark job."""
    path = storage.log_path(broker)
    if not storage.path_exists(f"{path}/_delta_log"):
        return "is gone (not a Delta table)"
    try:
        snapshot = storage.snapshot(path)
        schema = StructType.fromJson(json.loads(snapshot.metadata().schemaString()))
        cluster_id, owner = log_stamp(snapshot)  # (the same snapshot: one Delta log listing a check)
    except Exception as e:  # noqa: BLE001 - a corrupted log
        return f"cannot be read ({type(e).__name__})"
    columns = {f.name: f.dataType for f in schema.fields}
    wrong = [f.name for f in LOG_SCHEMA.fields if columns.get(f.name) != f.dataType]
    if wrong:
        return f"has a foreign schema (columns {wrong} missing or of another type)"
    if cluster_id is None and storage.cluster_id is not None:  # (Storage.upgrade stamps an older root's logs)
        return "is not stamped by any cluster (a table made there by another writer)"
    if (cluster_id is not None and cluster_id != storage.cluster_id) or (owner is not None and owner != str(broker)):
        return f"holds the log of broker {owner} of cluster {cluster_id}"
    return None
