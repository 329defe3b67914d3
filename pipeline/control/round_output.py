"""A bucket's round as the control job's output rows (CONTROL_OUTPUT_SCHEMA): each partition's
state after the round with its produce results, its fetches and its figures, and a row per unknown
(topic, partition) a request named, carrying its results only."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline.control import acks as acks_rule
from pipeline.control.bucket import Appends, Partitions, column, partition_keys
from pipeline.control.round_context import RoundContext
from pipeline.control.state import CONTROL_OUTPUT_SCHEMA, REPLICA_ARRAYS, SESSION_ARRAYS, as_lists, padded

__all__ = ["output_rows", "CONTROL_OUTPUT_SCHEMA_ARROW"]


def output_rows(state: pa.Table, parts: Partitions, appends: Appends, hw: np.ndarray, changes: np.ndarray,
                isr_moves: tuple, fetch: tuple, entries: tuple, ctx: RoundContext) -> pa.Table:
    """The bucket's rows after the round: `isr_moves` (joined, shrunk), `fetch` (each replica's LEO
    before, the end of what it read, the records read and taken from the batches, fetched),
    `entries` (the partitions' fetch request and response entries)."""
    joined, shrunk = isr_moves
    read, from_batch, fetched = fetch[2], fetch[3], fetch[4]
    n = state.num_rows
    results, known, per_partition, result_offsets = _results(parts, appends, hw, n)
    fetches, fetch_offsets, listed = _fetches(parts, fetch)
    leo_new, leader_leo_before = appends.leader_leo, parts.leader_leo
    settled = _settled(parts, hw, leo_new, ctx) & (hw == leo_new)
    width = parts.brokers.shape[1]
    state_moved = np.zeros(n, dtype=bool)
    for name in (*SESSION_ARRAYS, "log_start_offset"):  # (a leader's session cache entry is replica state)
        state_moved |= ((padded(state.column(name), width, 0, np.int64) != parts.arrays[name]) & parts.exists).any(axis=1)
    columns = {name: state.column(name) for name in ("topic", "partition", "bucket", "leader", "leader_epoch",
                                                      "leader_epoch_start_offset", "replicas", "adding_replicas",
                                                      "min_isr", "lag_time_max_ms")}
    columns.update(
        partition_epoch=pa.array(column(state, "partition_epoch") + changes, type=pa.int32()),
        isr=as_lists(parts.brokers, parts.in_isr, pa.int32()),
        high_watermark=pa.array(hw, type=pa.int64()),
        **{name: as_lists(parts.arrays[name], parts.exists, pa.int64()) for name in parts.arrays},
        is_known=pa.array(np.ones(n, dtype=bool)),
        results=pa.ListArray.from_arrays(pa.array(result_offsets), results.take(pa.array(np.flatnonzero(known)))),
        fetches=pa.ListArray.from_arrays(pa.array(fetch_offsets), fetches),
        records_appended=pa.array(leo_new - leader_leo_before, type=pa.int64()),
        records_replicated=pa.array(np.where(fetched, read + from_batch, 0).sum(axis=1), type=pa.int64()),
        isr_shrinks=pa.array(shrunk.sum(axis=1), type=pa.int32()),
        isr_expands=pa.array(joined.sum(axis=1), type=pa.int32()),
        fetch_request_partitions=pa.array(entries[0], type=pa.int32()),
        fetch_response_partitions=pa.array(entries[1], type=pa.int32()),
        is_settled=pa.array(settled, type=pa.bool_()),
        is_changed=pa.array((leo_new > leader_leo_before) | listed.any(axis=1) | (changes > 0) | (per_partition > 0)
                            | state_moved | (hw != parts.high_watermark) | ~settled, type=pa.bool_()),
    )
    out = pa.table([columns[f.name] for f in CONTROL_OUTPUT_SCHEMA_ARROW], schema=CONTROL_OUTPUT_SCHEMA_ARROW)
    # (Spark takes the output only in its own Arrow types: list fields named "element", non-null fields)
    return pa.concat_tables([out, _unknown_rows(appends, results)]).cast(_SPARK_ARROW_SCHEMA)


def _results(parts: Partitions, appends: Appends, hw: np.ndarray, n: int
             ) -> tuple[pa.StructArray, np.ndarray, np.ndarray, np.ndarray]:
    """One result per (request, partition), with the acks against the HW after the round: its first
    batch's base offset, its last batch's last offset and status (the acks wait for the whole
    request), its records. Returns them, which are of known partitions, their count per partition
    and the partitions' offsets into them."""
    isr_size = parts.in_isr.sum(axis=1)
    status, code = acks_rule.request_status(appends.error, appends.acks, appends.last, hw[appends.at],
                                            isr_size[appends.at] if n else appends.at,
                                            parts.min_isr[appends.at] if n else appends.at)
    first, last = appends.part_first, appends.part_last
    offsets = appends.answered[first]
    results = pa.StructArray.from_arrays(
        [appends.table.column("request_id").combine_chunks().take(pa.array(first, type=pa.int64())),
         pa.array(np.where(offsets, appends.base[first], None), type=pa.int64()),
         pa.array(np.where(offsets, appends.last[last], None), type=pa.int64()),
         pa.array(np.bincount(appends.part, weights=appends.count, minlength=len(first)).astype(np.int64)
                  if len(first) else first, type=pa.int64()),
         pa.array(appends.acks[first], type=pa.int32()),
         pa.array(status[last], type=pa.string()), pa.array(code[last], type=pa.string())],
        fields=list(CONTROL_OUTPUT_SCHEMA_ARROW.field("results").type.value_type))
    known = appends.known[first]
    per_partition = np.bincount(appends.index[first][known], minlength=n) if n else np.zeros(0, dtype=np.int64)
    return results, known, per_partition, np.r_[0, np.cumsum(per_partition)].astype(np.int32)


def _fetches(parts: Partitions, fetch: tuple) -> tuple[pa.StructArray, np.ndarray, np.ndarray]:
    """What each follower took: the range of the leader's log a lagging one read (the data plane
    holds its rows), then its slice of this round's batch, from the leader's LEO before the round.
    Returns them, the partitions' offsets into them, and which replicas took any."""
    own_leo, read_end, read, from_batch, _ = fetch
    read_rows, read_cols = np.nonzero(read > 0)
    batch_rows, batch_cols = np.nonzero(from_batch > 0)
    batch_from = np.broadcast_to(parts.leader_leo[:, None], from_batch.shape)
    rows = np.r_[read_rows, batch_rows]
    order = np.argsort(rows, kind="stable")
    brokers = np.r_[parts.brokers[read_rows, read_cols], parts.brokers[batch_rows, batch_cols]]
    starts = np.r_[own_leo[read_rows, read_cols], batch_from[batch_rows, batch_cols]]
    ends = np.r_[read_end[read_rows, read_cols], (batch_from + from_batch)[batch_rows, batch_cols]]
    kinds = np.r_[np.zeros(len(read_rows), dtype=bool), np.ones(len(batch_rows), dtype=bool)]
    fetches = pa.StructArray.from_arrays(
        [pa.array(brokers[order], type=pa.int32()), pa.array(starts[order], type=pa.int64()),
         pa.array(ends[order], type=pa.int64()), pa.array(kinds[order], type=pa.bool_())],
        fields=list(CONTROL_OUTPUT_SCHEMA_ARROW.field("fetches").type.value_type))
    listed = (read > 0) | (from_batch > 0)
    offsets = np.r_[0, np.cumsum((read > 0).sum(axis=1) + (from_batch > 0).sum(axis=1))].astype(np.int32)
    return fetches, offsets, listed


def _settled(parts: Partitions, hw: np.ndarray, leo_new: np.ndarray, ctx: RoundContext) -> np.ndarray:
    """Whether every follower is in the ISR at the leader's LEO and log start, knowing the HW. (A
    fetching follower that answered before the HW moved learns it at its next fetch, as Kafka's
    leader answers a waiting fetch when its HW moves: until then the partition is not settled.)"""
    lso = parts.arrays["log_start_offset"]
    leader_lso = np.where(parts.is_leader, lso, 0).sum(axis=1)
    hw_known = ((parts.arrays["replica_high_watermark"] == hw[:, None]) | parts.is_leader
                | ~np.isin(parts.brokers, ctx.fetching_brokers))
    return np.where(parts.exists, parts.in_isr & (parts.arrays["log_end_offset"] == leo_new[:, None])
                    & ((lso == leader_lso[:, None]) | ~parts.serving[:, None]) & hw_known, True).all(axis=1)


def _unknown_rows(appends: Appends, results: pa.StructArray) -> pa.Table:
    """A row per unknown (topic, partition) of the requests, carrying their results only."""
    unknown = np.flatnonzero(~appends.known[appends.part_first])  # (request, partition)s, as `results`
    if len(unknown) == 0:
        return CONTROL_OUTPUT_SCHEMA_ARROW.empty_table()
    table = appends.table.take(pa.array(appends.part_first[unknown], type=pa.int64()))
    keys, first, inverse = np.unique(partition_keys(table).to_numpy(zero_copy_only=False), return_index=True,
                                     return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    m = len(keys)
    empty_longs = pa.array([[]] * m, type=pa.list_(pa.int64()))
    columns = {f.name: pa.nulls(m, f.type) for f in CONTROL_OUTPUT_SCHEMA_ARROW}
    zeros = {f.name: pa.array(np.zeros(m, dtype=f.type.to_pandas_dtype()), type=f.type)
             for f in CONTROL_OUTPUT_SCHEMA_ARROW if pa.types.is_integer(f.type)}
    columns.update(zeros)
    columns.update({name: empty_longs for name in REPLICA_ARRAYS})
    columns.update(
        topic=table.column("topic").take(pa.array(first)).combine_chunks(),
        partition=table.column("partition").take(pa.array(first)).combine_chunks(),
        bucket=table.column("bucket").take(pa.array(first)).combine_chunks(),
        replicas=pa.array([[]] * m, type=pa.list_(pa.int32())), isr=pa.array([[]] * m, type=pa.list_(pa.int32())),
        is_known=pa.array(np.zeros(m, dtype=bool)), is_settled=pa.array(np.ones(m, dtype=bool)),
        is_changed=pa.array(np.ones(m, dtype=bool)),
        results=pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(np.bincount(inverse))].astype(np.int32)),
                                         results.take(pa.array(unknown[order]))),
        fetches=pa.array([[]] * m, type=CONTROL_OUTPUT_SCHEMA_ARROW.field("fetches").type))
    return pa.table([columns[f.name] for f in CONTROL_OUTPUT_SCHEMA_ARROW], schema=CONTROL_OUTPUT_SCHEMA_ARROW)



def _lenient(t: pa.DataType) -> pa.DataType:
    """`t` with every nested field nullable and lists' fields named as Arrow names them."""
    if pa.types.is_list(t):
        return pa.list_(_lenient(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _lenient(f.type)) for f in t])
    return t


def _arrow_schema() -> pa.Schema:
    return pa.schema([pa.field(f.name, _lenient(f.type)) for f in to_arrow_schema(CONTROL_OUTPUT_SCHEMA)])


CONTROL_OUTPUT_SCHEMA_ARROW = _arrow_schema()


_SPARK_ARROW_SCHEMA = to_arrow_schema(CONTROL_OUTPUT_SCHEMA)

