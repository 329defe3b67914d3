"""A table's history as recovery reads it: every commit a round makes carries the round id, its
step and the round's inputs in the commit's userMetadata
(`replog-round=<id>;step=<step>;now=<ms>;inbox=<v>;admin=<v>;restarted=<0|1>`), so recovery
(recovery.py) can tell from a table's history which commits of an interrupted round landed, undo
them, and replay the round with the same inputs. Not Delta's txnAppId/txnVersion: checking it
makes every commit rebuild the table's full snapshot state (three Spark jobs per commit).

Commit files are read on the driver, one small JSON file each: no Spark job."""

from __future__ import annotations

import json

from delta.tables import DeltaTable
from pyspark.sql import DataFrame

__all__ = ["TXN_APP_ID", "RECOVERY_APP_ID", "WRITTEN_WITH", "commit_tag", "parse_tag", "all_null", "added_rows",
           "History"]

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



class History:
    """Storage's reads of table histories and its undo writes (a mixin of Storage: it uses
    path, version, snapshot-based _newest_version, _is_table and _metadata)."""

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

    def committed_by(self, table: str, round_id: int) -> bool:
        """Whether round `round_id` committed to `table`, and the commit stands: its commits are
        read back from the newest until one by an earlier round, or a recovery that undid this
        round or an earlier one (one small log file each, on the driver). A recovery of a later
        round put the table back to before that round's commits, which keeps this round's: the
        walk goes on past it (a round interrupted after a commit to a table the last complete
        round's row names, as a reassignment's replica_state commit, must not make that round
        incomplete once undone)."""
        path = self.path(table)
        for version in range(self.table_version(path), -1, -1):
            info = self.commit_info(path, version)
            if info is None:
                return False
            fields = parse_tag(info.get("userMetadata"))
            if RECOVERY_APP_ID in fields:
                if int(fields[RECOVERY_APP_ID]) > round_id:
                    continue
                return False
            if TXN_APP_ID in fields and int(fields[TXN_APP_ID]) <= round_id:
                return int(fields[TXN_APP_ID]) == round_id
        return False

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
