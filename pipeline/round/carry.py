"""What a round hands to the next round of the same process instead of re-reading the tables it
has just written: rows by key, pinned in executor memory.

A round sees only its working set (round.py), so what it changes is small, while the rows it
carries are every partition's. `Keyed` keeps them as a base and the rows changed since, both
pinned: a round reads its working set's rows out of both, and adds the rows it changed to the
changes, so carrying costs what the round changed, not the partition count. The changes are folded
into a new base once they are a tenth of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

__all__ = ["Keyed", "pinned", "pinned_without_history", "within"]

# the changes fold into the base once they are this share of it (and at least FOLD_MIN_ROWS rows)
FOLD_SHARE = 10
FOLD_MIN_ROWS = 1_000


def _as_rows(df: DataFrame) -> DataFrame:
    """`df`'s rows as a plan of its own (an RDD scan): no constraints, statistics or lineage of the
    plan that made it."""
    jdf = df._jdf
    fresh = df.sparkSession._jsparkSession.internalCreateDataFrame(jdf.queryExecution().toRdd(), jdf.schema(), False)
    return ClassicDataFrame(fresh, df.sparkSession)


def pinned(df: DataFrame) -> DataFrame:
    """`df` computed once, as a plan without the constraints of the plan that made it (Spark 4.2's
    localCheckpoint of a union whose sides carry filters on array columns fails rewriting them)."""
    return _as_rows(df).localCheckpoint()


def pinned_without_history(df: DataFrame) -> DataFrame:
    """`df` pinned, as a plan that knows nothing of how it was made. A localCheckpoint keeps its
    origin plan's size estimate, and a carried DataFrame is made from the last round's, which was
    made from the one before: without this the estimates multiply round after round until
    planning a join spends minutes in BigInteger arithmetic (seen in jobs/profile_round.py)."""
    return _as_rows(df.localCheckpoint())


def within(df: DataFrame, keys_df: DataFrame | None) -> DataFrame:
    """The rows of `df` whose key (keys_df's columns, a prefix of df's key) is in `keys_df` (None:
    every row)."""
    return df if keys_df is None else df.join(F.broadcast(keys_df), on=keys_df.columns, how="left_semi")


@dataclass(frozen=True)
class Keyed:
    """Rows with a key, carried: `base` and `changes` (rows that replace the base's rows of their
    key, or add keys), both pinned; `changed_rows` counts the rows added to the changes since the
    base was pinned (an upper bound of their number), `base_rows` the base's."""

    keys: tuple[str, ...]
    base: DataFrame
    base_rows: int
    changes: DataFrame | None = None
    changed_rows: int = 0

    @classmethod
    def of(cls, df: DataFrame, keys: list[str]) -> "Keyed":
        """`df` as a new base (pinned here; counted, one job over the pinned rows)."""
        base = pinned_without_history(df)
        return cls(tuple(keys), base, base.count())

    def all(self) -> DataFrame:
        """Every key's current row."""
        if self.changes is None:
            return self.base
        keys = list(self.keys)
        return (self.base.join(self.changes.select(*keys), on=keys, how="left_anti")
                .unionByName(self.changes))

    def within(self, keys_df: DataFrame | None) -> DataFrame:
        """The current rows whose key starts with one in `keys_df` (None: every row)."""
        if keys_df is None or self.changes is None:
            return within(self.all(), keys_df)
        keys = list(self.keys)
        return (within(self.base, keys_df).join(self.changes.select(*keys), on=keys, how="left_anti")
                .unionByName(within(self.changes, keys_df)))

    def updated(self, rows: DataFrame, count: int) -> "Keyed":
        """With `rows` (`count` of them, an upper bound) replacing the rows of their keys."""
        if count == 0:
            return self
        keys = list(self.keys)
        rows = rows.select(*self.base.columns)
        changed_rows = self.changed_rows + count
        if changed_rows >= max(self.base_rows // FOLD_SHARE, FOLD_MIN_ROWS):
            return Keyed.of(self.updated_all(rows), keys)
        changes = rows if self.changes is None else (
            self.changes.join(rows.select(*keys), on=keys, how="left_anti").unionByName(rows))
        return Keyed(self.keys, self.base, self.base_rows, pinned_without_history(changes), changed_rows)

    def updated_all(self, rows: DataFrame) -> DataFrame:
        """Every key's current row with `rows` replacing theirs (not pinned)."""
        keys = list(self.keys)
        return self.all().join(rows.select(*keys), on=keys, how="left_anti").unionByName(rows)
