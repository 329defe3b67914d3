"""Round v2's active round for the path it covers so far (docs/design.md, "Round v2"): the control
job, the records numbered and written once per broker, then the control outputs. Two commit
waves, as DESIGN.md's step 5: the brokers' logs in parallel (one commit each); then the partition
rows the round changed with the produce results they answer (one commit), so a reader never
finds an HW or an ack past what the logs hold. It runs beside today's round (jobs/bench_round_v2.py) until it carries every rule."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import reduce
from typing import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline.control.fetch_round import RoundContext
from pipeline.control.state import PARTITION_STATE_SCHEMA
from pipeline.acks import STATUS_PENDING
from pipeline.control_job import pending_requests, produce_results, run_control_job, summarise_inbox
from pipeline.data.append import log_rows
from pipeline.data.catch_up import lagging_ranges, read_lagging_ranges, with_ranges_read
from pipeline.schemas import LOG_SCHEMA

__all__ = ["RoundTables", "ActiveRound", "run_active_round"]

# append_all([(df, path), ...]): one commit each, at once (Storage.append_all)
Appender = Callable[[list[tuple[DataFrame, str]]], None]


@dataclass(frozen=True)
class RoundTables:
    """Where the round writes: each broker's log, and the partition rows it changed with the
    produce results they answer (read them with control_job.produce_results)."""

    logs: dict[int, str]
    partition_state: str


@dataclass(frozen=True)
class ActiveRound:
    state: DataFrame  # the partitions after the round (pinned): the next round's input
    pending: DataFrame  # the acks=all requests still waiting for the HW (result rows): the next round's too
    records_appended: int
    records_replicated: int
    requests_answered: int
    # partitions not settled after it (a replica outside the ISR or behind, or HW < LEO): with
    # none, and no new inbox rows or pending requests, the next round has nothing to do (idle)
    unsettled: int
    phases: dict[str, float] = field(default_factory=dict)  # seconds on the driver, by phase


def run_active_round(state_df: DataFrame, inbox_df: DataFrame, pending_df: DataFrame | None, ctx: RoundContext,
                     fetchers: int, tables: RoundTables, append_all: Appender) -> ActiveRound:
    """One round over `state_df` (the working set's partition state), the round's new inbox rows
    (with `_commit_version`) and the requests the last round left pending (None: none)."""
    lap = _Laps()
    summary = summarise_inbox(inbox_df, fetchers)
    if pending_df is not None:
        summary = summary.unionByName(pending_requests(pending_df, fetchers))
    control, figures = run_control_job(state_df, summary, ctx)
    lap("control job")
    batches = [log_rows(inbox_df, control)] if figures["records_appended"] else []
    if figures["lagging"]:  # followers behind before the round read their leaders' logs
        spark = state_df.sparkSession
        read = read_lagging_ranges(lagging_ranges(control), sorted(figures["lagging_leaders"]),
                                   lambda broker: spark.read.format("delta").load(tables.logs[broker]),
                                   ctx.partition_max_bytes).localCheckpoint()
        control = with_ranges_read(control, read, ctx.round_id).localCheckpoint()
        figures["records_replicated"] += read.count()  # (a job in such rounds only)
        batches.append(read)
        lap("read lagging ranges")
    if batches:
        rows = reduce(DataFrame.unionByName, batches).localCheckpoint()  # pinned once, for every broker
        lap("number records")
        append_all([(rows.filter(F.col("broker") == broker).select(*LOG_SCHEMA.fieldNames()), tables.logs[broker])
                    for broker in sorted(figures["brokers"])])
        lap("commit logs")
    state = control.filter(F.col("is_known")).select(*PARTITION_STATE_SCHEMA.fieldNames())
    rows = control.withColumn("round_id", F.lit(ctx.round_id).cast("long"))
    if figures["changed"]:  # the HWs and the acks they allow, in one commit after the logs'
        append_all([(rows.filter(F.col("is_changed"))
                     .select(*PARTITION_STATE_SCHEMA.fieldNames(), "is_known", "results", "round_id"),
                     tables.partition_state)])
    lap("commit partition rows")
    pending = produce_results(rows).filter(F.col("status") == STATUS_PENDING).drop("round_id")
    return ActiveRound(state, pending, figures["records_appended"], figures["records_replicated"],
                       figures["results"], figures["unsettled"], lap.phases)


class _Laps:
    """Seconds between calls, by the name of the phase that just ended."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self.mark = time.perf_counter()

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] = now - self.mark
        self.mark = now
