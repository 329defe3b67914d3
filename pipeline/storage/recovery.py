"""Recovery of an interrupted round: the round's commits that landed are undone, and the round is
replayed with the inputs it had (its time, its inbox and admin versions), so the tables end up
exactly as after one clean run of it.

A round's row in the rounds table is its commit point. The row is committed at once with the
round's last outputs (replica_state's rows and the results: Storage.commit_round_row), and its
commit names their tables: a round is complete when its row is there and each table it names has
the round's commit. Each of a round's commits carries its round id and its inputs in the commit's
userMetadata (storage.commit_tag). A table whose newest commits carry a round id above the last
complete round holds an interrupted round's writes (the rounds table too: a row that landed
without the commits it names):

- when they are the table's newest commits, Delta RESTORE puts the table back to the version
  before them (one commit);
- when somebody else committed after them (another process creating a topic), the round's rows
  of partitions go back to the old version's row by key (the rows carry the round id that last
  wrote them), and its rows of replica_state (which rounds append to) are deleted by their round
  id. Logs and the other append-only tables have no other writer under the one-writer lease; a
  foreign commit after the round's there is reported, not guessed at.

Recovery commits are tagged `replog-recovery=<round>`: a later scan stops there. Reading the
history costs one small Delta log file per table on the driver (no Spark job), once per process
and after a failed round, never on an ordinary round.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import functions as F

from pipeline.errors import ErrorCode, ReplogError
from pipeline.schemas import PARTITION_KEY, REPLICA_KEY
from pipeline.storage import RECOVERY_APP_ID, TXN_APP_ID, WRITTEN_WITH, Storage, parse_tag

__all__ = ["Replay", "Landed", "landed_commits", "last_complete_round", "recover", "stale_logs"]

# the cluster tables a round writes: key (None: append-only, by round id)
ROUND_TABLES: dict[str, list[str] | None] = {
    "partitions": PARTITION_KEY, "replica_state": REPLICA_KEY,
    "elections": None, "producers": None, "results": None, "rounds": None,
}
# tables a round appends to whose other writers also append (rows carry the round that wrote them)
_APPENDED_BY_KEY = ("replica_state",)


@dataclass(frozen=True)
class Replay:
    """The inputs of an interrupted round, for running it again (None: not recorded, by a release
    before recovery existed)."""

    round_id: int
    now_ms: int | None
    inbox_version: int | None
    admin_version: int | None
    restarted: bool


@dataclass(frozen=True)
class Landed:
    """The commits an interrupted round made to one table."""

    path: str
    versions: tuple[int, ...]  # newest first
    tag: dict  # the newest one's userMetadata fields
    interleaved: bool  # another writer committed after the first of them

    @property
    def before(self) -> int:
        return min(self.versions) - 1


def landed_commits(storage: Storage, path: str, last_round: int, since_ms: int) -> Landed | None:
    """The commits to the table at `path` by rounds after `last_round`, walking its history back
    from the newest commit until a commit of a complete round, a recovery, or a foreign commit
    older than `since_ms` (the last complete round's)."""
    version = storage.table_version(path)
    landed, foreign, tag = [], [], {}
    while version >= 0:
        info = storage.commit_info(path, version)
        if info is None:
            break
        fields = parse_tag(info.get("userMetadata"))
        if RECOVERY_APP_ID in fields:
            break
        if TXN_APP_ID in fields:
            if int(fields[TXN_APP_ID]) <= last_round:
                break
            landed.append(version)
            tag = tag or fields
        elif info.get("timestamp", 0) < since_ms:
            break
        else:
            foreign.append(version)
        version -= 1
    if not landed:
        return None
    return Landed(path, tuple(landed), tag, any(v > min(landed) for v in foreign))


def _optional_int(fields: dict, key: str) -> int | None:
    return int(fields[key]) if key in fields else None


def last_complete_round(storage: Storage, last_round: int) -> tuple[int, int]:
    """The last complete round, given `last_round`, the newest round with a row in the rounds
    table: it, or the round before it when its row's commit names a table without that round's
    commit (the process died during the round's last wave); and the time of that round's row's
    commit (0: none)."""
    path = storage.path("rounds")
    version = storage.table_version(path)
    newest = storage.commit_info(path, version) if version > 0 else None
    since_ms = (newest or {}).get("timestamp", 0) if last_round else 0
    while last_round and version > 0:  # (back past commits of no round: a maintenance pass's)
        info = storage.commit_info(path, version)
        fields = parse_tag((info or {}).get("userMetadata"))
        if info is None or RECOVERY_APP_ID in fields or fields.get(TXN_APP_ID, str(last_round)) != str(last_round):
            break
        if TXN_APP_ID in fields:
            tables = filter(None, fields.get(WRITTEN_WITH, "").split(","))
            if any(not storage.committed_by(table, last_round) for table in tables):
                before = storage.commit_info(path, version - 1) if version > 1 else None
                return last_round - 1, (before or {}).get("timestamp", 0) if last_round > 1 else 0
            break
        version -= 1
    return last_round, since_ms


def stale_logs(storage: Storage, brokers: list[int], last_round: int) -> list[int]:
    """Of `brokers` (halted for a failed log directory: recovery leaves their logs alone), those whose
    log holds a commit of a round after the last complete one, which nothing can undo there: they
    restart empty. `last_round`: the newest round with a row."""
    if not brokers:
        return []
    last_complete, since_ms = last_complete_round(storage, last_round)
    stale = []
    for broker in brokers:
        try:
            landed = landed_commits(storage, storage.log_path(broker), last_complete, since_ms)
        except Exception:  # noqa: BLE001 - a log that cannot be read restarts empty anyway
            continue
        if landed is not None:
            stale.append(broker)
    return stale


def recover(storage: Storage, brokers: list[int], last_round: int) -> Replay | None:
    """Undoes what a round after the last complete one committed (see the module's text; `last_round`:
    the newest round with a row) and returns its inputs for the replay; None when no such commit exists."""
    last_round, since_ms = last_complete_round(storage, last_round)
    tables = {storage.path(t): t for t in ROUND_TABLES}
    tables.update({storage.log_path(b): None for b in brokers})
    found = [landed for path in tables
             if (landed := landed_commits(storage, path, last_round, since_ms)) is not None]
    if not found:
        return None
    tag = found[0].tag
    round_id = int(tag[TXN_APP_ID])
    for landed in found:  # checked before anything is undone: a refusal writes nothing
        if landed.interleaved and ROUND_TABLES.get(tables[landed.path]) is None:
            raise ReplogError(ErrorCode.KAFKA_STORAGE_ERROR,
                              f"{landed.path} has commits by another writer after round {round_id}'s "
                              f"(versions {sorted(landed.versions)}): it cannot be rolled back safely")
    marker = f"{RECOVERY_APP_ID}={round_id}"
    for landed in found:
        table = tables[landed.path]
        if not landed.interleaved:
            storage.restore(landed.path, landed.before, marker)
        elif table in _APPENDED_BY_KEY:
            storage.delete_rows(landed.path, f"round_id > {last_round}", marker)
        else:
            keys = ROUND_TABLES[table]
            old = storage.read_version(landed.path, landed.before).withColumn("_old", F.lit(True))
            back = (storage.read(table).filter(F.col("round_id") > last_round).select(*keys)
                    .join(old, on=keys, how="left").fillna(False, subset=["_old"]).localCheckpoint())
            storage.merge_back(landed.path, back, keys, f"t.round_id > {last_round}", marker)
    return Replay(round_id, _optional_int(tag, "now"), _optional_int(tag, "inbox"), _optional_int(tag, "admin"),
                  tag.get("restarted") == "1")
