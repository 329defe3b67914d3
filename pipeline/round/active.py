"""The active round's core (docs/design.md, "Round v2"): the control job over the partition state
and the summarised inbox, the records numbered and written once per broker, then the control
outputs. Two commit waves, as DESIGN.md's step 5: the brokers' logs in parallel (one commit
each); then the partition rows the round changed with the produce results they answer (one
commit), so a reader never finds an HW or an ack past what the logs hold. run.py runs it on the
cluster's tables; tests/test_round.py on tables of its own."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import reduce
from typing import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline.control.acks import STATUS_PENDING
from pipeline.control.fetch_round import RoundContext
from pipeline.control.state import PARTITION_STATE_SCHEMA
from pipeline.data.append import log_rows
from pipeline.data.catch_up import lagging_ranges, read_lagging_ranges, with_reads
from pipeline.round.control_job import (pending_requests, produce_results, run_control_job, summarise_inbox,
                                        with_producer_checks)
from pipeline.round.inputs import REQUEST_KEY
from pipeline.schemas import LOG_SCHEMA, PARTITION_KEY, PRODUCERS_SCHEMA
from pipeline.runtime import compiled_expressions

__all__ = ["RoundTables", "ActiveRound", "run_active_round"]

# append_all([(df, path), ...]): one commit each, at once (Storage.append_all)
Appender = Callable[[list[tuple[DataFrame, str]]], None]


@dataclass(frozen=True)
class RoundTables:
    """Where the round writes: each broker's log, and the partition rows it changed with the
    produce results they answer (read them with control_job.produce_results)."""

    logs: dict[int, str]
    partition_state: str | None = None
    producers: str | None = None  # the idempotent producers' appended batches (with the logs)


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
    figures: dict = field(default_factory=dict)  # control_job.run_control_job's


# commit_outputs(rows, figures): the second commit wave, given the control output's rows (with
# `round_id`) and the round's figures
OutputsWriter = Callable[[DataFrame, dict], None]


def run_active_round(state_df: DataFrame, inbox_df: DataFrame, pending_df: DataFrame | None, ctx: RoundContext,
                     fetchers: int, tables: RoundTables, append_all: Appender,
                     commit_outputs: OutputsWriter | None = None, topic_checks: DataFrame | None = None,
                     lagging_leaders: set[int] | None = None, sequences: DataFrame | None = None,
                     log_starts: DataFrame | None = None, laps: Laps | None = None) -> ActiveRound:
    """One round over `state_df` (the working set's partition state), the round's new inbox rows
    (with `_commit_version`) and the requests the last round left pending (None: none). The second
    commit wave writes the partition rows the round changed, with their results, to
    `tables.partition_state`, or is `commit_outputs`'s.

    `lagging_leaders`: the leaders whose followers may be behind their LEO (the last round's
    figure of that name; None: unknown, found with a job): their lagging followers read a range of
    their logs before the control job, which takes it as their first response.

    `sequences`: the idempotent producers' checks of the round's batches (pinned;
    control_job.producer_checks), None when it has none: a retried batch is answered with the
    offsets it repeats and not written again, and the batches appended go to `tables.producers`
    with the logs. `log_starts`: the log start offsets asked of the leaders (topic, partition,
    requested_lso: delete_records and retention; round.log_start_requests), None: none. `laps`:
    the caller's phase timer, which the round's phases go on (None: a timer of its own)."""
    lap = laps if laps is not None else Laps()
    read = _lagging_reads(state_df, ctx, tables, lagging_leaders)
    if read is not None:
        state_df = with_reads(state_df, read)
        lap("read lagging ranges")
    if log_starts is not None:
        state_df = state_df.join(F.broadcast(log_starts.withColumnRenamed("requested_lso", "requested_log_start_offset")),
                                 on=PARTITION_KEY, how="left")
    summary = summarise_inbox(inbox_df, fetchers, topic_checks)
    if sequences is not None:
        summary = with_producer_checks(summary, sequences)
        inbox_df = inbox_df.join(sequences.filter(F.col("outcome") == "duplicate").select(*REQUEST_KEY),
                                 on=REQUEST_KEY, how="left_anti")
    if pending_df is not None:
        summary = summary.unionByName(pending_requests(pending_df, fetchers))
    control, figures = run_control_job(state_df, summary, ctx)
    lap("control job")
    batches = [log_rows(inbox_df, control)] if figures["records_appended"] else []
    if read is not None:  # what the responses took of it (a follower whose fetch was refused took nothing)
        taken = (control.select("topic", "partition", F.explode("fetches").alias("f")).filter(~F.col("f.from_batch"))
                 .select("topic", "partition", F.col("f.broker").alias("broker"), F.col("f.to_offset").alias("_to")))
        batches.append(read.join(taken, on=["topic", "partition", "broker"], how="inner")
                       .filter(F.col("offset") < F.col("_to")).drop("_to"))
    if batches and figures["brokers"]:
        rows = reduce(DataFrame.unionByName, batches).localCheckpoint()  # pinned once, for every broker
        lap("number records")
        appends = [(rows.filter(F.col("broker") == broker).select(*LOG_SCHEMA.fieldNames()), tables.logs[broker])
                   for broker in sorted(figures["brokers"])]
        if sequences is not None and figures["records_appended"]:
            appends.append((_producer_rows(control, sequences, ctx.round_id), tables.producers))
        append_all(appends)
        lap("commit logs")
    state = control.filter(F.col("is_known")).select(*PARTITION_STATE_SCHEMA.fieldNames())
    rows = control.withColumn("round_id", F.lit(ctx.round_id).cast("long"))
    if commit_outputs is not None:
        commit_outputs(rows, figures)
    elif figures["changed"]:  # the HWs and the acks they allow, in one commit after the logs'
        append_all([(rows.filter(F.col("is_changed"))
                     .select(*PARTITION_STATE_SCHEMA.fieldNames(), "is_known", "results", "round_id"),
                     tables.partition_state)])
    lap("commit partition rows")
    pending = produce_results(rows).filter(F.col("status") == STATUS_PENDING).drop("round_id")
    return ActiveRound(state, pending, figures["records_appended"], figures["records_replicated"],
                       figures["results"], figures["unsettled"], lap.phases, figures)


def _producer_rows(control: DataFrame, sequences: DataFrame, round_id: int) -> DataFrame:
    """The producers table's rows of the idempotent batches the round appended (their offsets from
    the control job's results)."""
    appended = (produce_results(control.withColumn("round_id", F.lit(round_id).cast("long")))
                .filter(F.col("base_offset").isNotNull()).select(*REQUEST_KEY, "base_offset", "last_offset", "round_id"))
    return (appended.join(sequences.filter(F.col("outcome") == "append"), on=REQUEST_KEY, how="inner")
            .select(*PRODUCERS_SCHEMA.fieldNames()))


def _lagging_reads(state_df: DataFrame, ctx: RoundContext, tables: RoundTables,
                   lagging_leaders: set[int] | None) -> DataFrame | None:
    """The log rows lagging followers read (pinned; `broker` the follower), or None when no leader
    that serves has a follower behind it."""
    ranges = lagging_ranges(state_df, ctx.fetching_brokers, ctx.ineligible_brokers)
    if lagging_leaders is None:  # (O(brokers) rows)
        lagging_leaders = {r["leader"] for r in ranges.select("leader").distinct().collect()}
    leaders = sorted(b for b in lagging_leaders if b in tables.logs and b not in ctx.ineligible_brokers)
    if not leaders:
        return None
    spark = state_df.sparkSession
    read = read_lagging_ranges(ranges, leaders, lambda broker: spark.read.format("delta").load(tables.logs[broker]),
                               ctx.partition_max_bytes)
    # compiled, not interpreted as the rest of the round: the read scans its leaders' whole logs
    # (their files are not laid out by partition), so it costs what the logs hold, not what the
    # followers lack (one such read of a 5,000,000-row log: 27 s compiled against 65 s
    # interpreted; of a 20,000-row log 0.44 s against 0.60 s; docs/benchmarks.md)
    with compiled_expressions(spark):
        return read.localCheckpoint()


class Laps:
    """Seconds between calls, by the name of the phase that just ended."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self.mark = time.perf_counter()

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] = now - self.mark
        self.mark = now


