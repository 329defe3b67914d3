"""The rounds' figures as Structured Streaming reports them: observed metrics (`Dataset.observe`)
over rows of the rounds table, so a streaming query that reads the table carries, in each
micro-batch's progress, what the rounds it read did (the replication job's `replog-rounds`
query: pipeline/jobs/replicate.py)."""

from __future__ import annotations

import json

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from pipeline.schemas import BROKER_GAUGES

__all__ = ["ROUND_FIGURES", "round_figure_columns", "observe_round_figures", "moved", "broker_gauges_json"]

# the observation's name: a progress's observedMetrics["round"]
ROUND_FIGURES = "round"

# summed over the rounds of a micro-batch (one round, unless the query fell behind)
_SUMS = ("records_appended", "records_replicated", "hw_advances", "isr_shrinks", "isr_expands",
         "requests_acked", "requests_failed")
# as of the newest round of the micro-batch
_GAUGES = ("under_replicated_partitions", "under_min_isr_partitions", "offline_partitions", "active_partitions",
           "pending_requests", "max_lag")


def round_figure_columns() -> list[Column]:
    """Aggregates over rows of the rounds table (ROUNDS_SCHEMA): how many rounds and the newest's
    id, the counts summed (records appended and replicated, partitions whose HW moved, ISR
    shrinks and expands, produce requests answered), the partition gauges and the pending
    requests of the newest round, and the longest round's milliseconds. A round written before
    `hw_advances` was kept counts 0 there."""
    newest = F.max_by  # (the value of the row with the largest round_id)
    return [F.count(F.lit(1)).alias("rounds"), F.max("round_id").alias("round_id"),
            *[F.coalesce(F.sum(name), F.lit(0)).cast("long").alias(name) for name in _SUMS],
            *[newest(name, "round_id").alias(name) for name in _GAUGES],
            F.max("duration_ms").alias("max_duration_ms")]


def observe_round_figures(rounds: DataFrame, observation: str | Observation = ROUND_FIGURES) -> DataFrame:
    """`rounds` with round_figure_columns observed: a streaming DataFrame reports them under the
    name ROUND_FIGURES in each micro-batch's progress, a batch one to an `observation`."""
    return rounds.observe(observation, *round_figure_columns())


def moved(figures: dict) -> bool:
    """Whether observed figures (round_figure_columns, as a dict) say a round changed anything:
    records appended or replicated, a HW moved, the ISR changed, a request answered."""
    return any(figures.get(name) for name in _SUMS)


def broker_gauges_json(counts: dict, max_lag: dict, brokers: list[int]) -> str:
    """The rounds row's `broker_gauges`: one entry per broker of `brokers` (and any other the
    counts name), each with every BROKER_GAUGES value (0 where the control job counted none).
    `counts`: (gauge, broker) -> partitions; `max_lag`: broker -> records."""
    ids = sorted(set(brokers) | {b for _, b in counts} | set(max_lag))
    return json.dumps([{"broker": b, **{g: counts.get((g, b), 0) for g in BROKER_GAUGES[:-1]},
                        "MaxLag": max_lag.get(b, 0)} for b in ids], separators=(",", ":"))
