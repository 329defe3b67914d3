"""The one-writer lease: one process at a time runs rounds (and the cleaner and maintenance) on a
root. A process takes it with the next job epoch, as Kafka's controller fences a zombie by its
epoch; a newer process always takes over (a restarted job must not wait for a dead one), and the
old one stops, with FENCED_INSTANCE_ID, before its next write."""

from __future__ import annotations

import os
import socket
import uuid

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipeline.clock import Clock
from pipeline.errors import ErrorCode, ReplogError
from pipeline.schemas import LEASE_SCHEMA
from pipeline.storage.failures import is_concurrent_conflict
from pipeline.storage.tables import Storage

__all__ = ["Lease"]


class Lease:
    """This process's claim on the root's replication lease (the lease table's 'replication' row)."""

    def __init__(self, spark: SparkSession, storage: Storage, clock: Clock):
        self.spark, self.storage, self.clock = spark, storage, clock
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._held: tuple[int, int] | None = None  # (job epoch, lease table version) once held

    def _row(self):
        return self.storage.read("lease").filter(F.col("lease") == "replication").first()

    def hold(self) -> None:
        """The first call takes the lease with the next job epoch (a compare-and-set MERGE: of two
        processes taking it at once, Delta's conflict check fails one); every later call checks,
        from the lease table's version (no Spark job), that no newer process took it over, and a
        fenced one raises FENCED_INSTANCE_ID, naming the holder, before it writes anything."""
        if self._held is not None:
            if self.storage.version("lease") == self._held[1]:
                return
            row = self._row()
            if row is not None and row["job_epoch"] != self._held[0]:
                raise ReplogError(ErrorCode.FENCED_INSTANCE_ID,
                                  f"replication on {self.storage.root} was taken over by {row['holder']} "
                                  f"(job epoch {row['job_epoch']}; this process held {self._held[0]}): "
                                  "this process runs no more rounds")
            self._held = (self._held[0], self.storage.version("lease"))
            return
        current = self._row()
        epoch = (current["job_epoch"] if current is not None else 0) + 1
        claim = self.spark.createDataFrame([("replication", self.holder, epoch, self.clock.now_ms())], LEASE_SCHEMA)
        try:  # one row written: the claim committed, so the lease is this process's
            claimed = self.storage.update_if(claim, "lease", ["lease"], only_if=f"t.job_epoch = {epoch - 1}",
                                             insert=True) == 1
        except Exception as e:  # a concurrent claim committed first (Delta's concurrent-modification check)
            if not is_concurrent_conflict(e):
                raise
            claimed = False
        if not claimed:
            held = self._row()
            raise ReplogError(ErrorCode.FENCED_INSTANCE_ID,
                              f"replication on {self.storage.root} is held by "
                              f"{held['holder'] if held else 'nobody'}: another process took it at the same time")
        self._held = (epoch, self.storage.version("lease"))
