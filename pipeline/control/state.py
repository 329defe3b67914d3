"""The partition state (DESIGN.md, "Round v2", 1): one row per partition with the controller's
metadata, the leader's HW, and each replica's Kafka state as arrays in replica order; and the
inbox summary the control job reads beside it (one row per (request, partition)).

`ReplicaMatrix` turns a batch of partition rows into `[partitions, replicas]` numpy matrices (the
rules' layout) and back, padding partitions with fewer replicas."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pipeline.schemas import PARTITION_KEY, PARTITIONS_SCHEMA, RESULTS_SCHEMA
from pyspark.sql.types import ArrayType, BooleanType, IntegerType, LongType, StringType, StructField, StructType

__all__ = ["PARTITION_STATE_SCHEMA", "REPLICA_ARRAYS", "SESSION_ARRAYS", "REQUEST_SUMMARY_SCHEMA", "RESULT_TYPE", "FETCH_TYPE",
           "CONTROL_OUTPUT_SCHEMA", "padded", "lookup", "as_lists"]


def _fields(*fields: tuple) -> list[StructField]:
    return [StructField(name, dtype, nullable) for name, dtype, nullable in fields]


_LONGS = ArrayType(LongType(), False)
# each follower's entry in its leader's fetch session cache (KIP-227; control/fetch_session.py's
# CachedPartitions): the session (0: none), the max bytes asked, the HW and log start offset last sent
SESSION_ARRAYS = ("session_id", "session_max_bytes", "session_high_watermark", "session_leader_log_start_offset")
# each replica's state, in replica order (Kafka's ReplicaState as the leader sees its followers;
# the leader's own column holds its log's offsets); `validated_leader_epoch`: the leader epoch a
# follower last checked its log against (below the partition's: it validates, and may truncate, at
# its next fetch: controller_wave.py), passed through by the control job
REPLICA_ARRAYS = ("log_start_offset", "log_end_offset", "replica_high_watermark", "fetch_offset",
                  "last_fetch_time_ms", "last_fetch_leader_leo", "last_caught_up_time_ms", "last_data_round",
                  *SESSION_ARRAYS, "validated_leader_epoch")

# the controller's metadata of the partition, as the partitions table holds it (`adding_replicas`:
# a reassignment's, which the replication factor leaves out: control/partition_health.py)
_METADATA = ("leader", "leader_epoch", "leader_epoch_start_offset", "partition_epoch", "replicas", "isr",
             "adding_replicas")

PARTITION_STATE_SCHEMA = StructType([
    *[PARTITIONS_SCHEMA[name] for name in PARTITION_KEY],
    StructField("bucket", IntegerType(), False),  # the control task (fetcher id) the partition belongs to
    *[PARTITIONS_SCHEMA[name] for name in _METADATA],
    *_fields(("high_watermark", LongType(), False), ("min_isr", IntegerType(), False),
             ("lag_time_max_ms", LongType(), False),
             *[(name, _LONGS, False) for name in REPLICA_ARRAYS]),
])

# the inbox summarised (DESIGN.md, "Round v2", 2): a record batch's count and bytes (one row per
# (request, partition, batch)), and the error its records' own checks found (with an idempotent
# producer's sequence checks); pending requests (acks=all, appended in an earlier round) come as one
# row each with their offsets
REQUEST_SUMMARY_SCHEMA = StructType(_fields(
    ("request_id", StringType(), False),
    ("topic", StringType(), False),
    ("partition", IntegerType(), True),
    ("bucket", IntegerType(), False),
    ("append_order", LongType(), False),  # inbox commit version, then request id
    # a record batch of the request's records for the partition (control_job.BATCH_INDEX_SPAN), in
    # offset order: a request's batches take consecutive offsets, a response takes whole batches
    ("batch", LongType(), False),
    ("record_count", LongType(), False),
    ("bytes", LongType(), False),
    ("acks", IntegerType(), False),
    ("record_error", StringType(), True),
    ("is_pending", BooleanType(), False),
    ("base_offset", LongType(), True),
    ("last_offset", LongType(), True),
    # a retried batch of an idempotent producer (KIP-98): not appended, answered with the offsets of
    # the batch it repeats, a stored one's (`base_offset`, `last_offset`) or, when it repeats a
    # request of this round, that request's (`duplicate_of`)
    ("is_duplicate", BooleanType(), False),
    ("duplicate_of", StringType(), True),
))

# a partition's produce results: the results table's fields but its keys and round
RESULT_TYPE = ArrayType(StructType([RESULTS_SCHEMA[name] for name in (
    "request_id", "base_offset", "last_offset", "record_count", "acks", "status", "error_code")]), False)

# what a follower takes of the partition this round: the leader's offsets [from_offset, to_offset);
# `from_batch` true when they are this round's appends (a slice of the batch the leaders write),
# false when the follower lagged and reads them from the leader's log (the data plane's range read)
FETCH_TYPE = ArrayType(StructType(_fields(
    ("broker", IntegerType(), False),
    ("from_offset", LongType(), False),
    ("to_offset", LongType(), False),
    ("from_batch", BooleanType(), False),
)), False)

CONTROL_OUTPUT_SCHEMA = StructType([
    # (a request to an unknown topic may name no partition: its row's partition is null)
    *[StructField(f.name, f.dataType, True) if f.name == "partition" else f for f in PARTITION_STATE_SCHEMA.fields],
    *_fields(
        ("is_known", BooleanType(), False),  # false: a row carrying only the results of an unknown partition
        ("results", RESULT_TYPE, False),
        ("fetches", FETCH_TYPE, False),
        ("records_appended", LongType(), False),
        ("records_replicated", LongType(), False),
        ("isr_shrinks", IntegerType(), False),
        ("isr_expands", IntegerType(), False),
        # the partition's entries in the round's fetch requests and responses (the first fetch's and
        # the follow-up's; KIP-227: an incremental request or response leaves most out)
        ("fetch_request_partitions", IntegerType(), False),
        ("fetch_response_partitions", IntegerType(), False),
        ("is_settled", BooleanType(), False),  # every replica in the ISR at the leader's LEO, HW = LEO
        # the row must be persisted: records moved, the ISR or HW changed, not settled, or it has results
        ("is_changed", BooleanType(), False),
    ),
])


def padded(column: pa.ChunkedArray | pa.Array, width: int, fill: int, dtype: type) -> np.ndarray:
    """A list column as an `[rows, width]` matrix, rows shorter than `width` filled with `fill`."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], type=column.type)
    lengths = column.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    out = np.full((len(column), width), fill, dtype=dtype)
    if len(column):
        values = column.flatten().to_numpy(zero_copy_only=False).astype(dtype)
        rows = np.repeat(np.arange(len(column)), lengths)
        cols = np.arange(len(values)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out[rows, cols] = values
    return out


def as_lists(matrix: np.ndarray, keep: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
    """The rows of `matrix` as lists of their `keep` entries (in column order)."""
    lengths = keep.sum(axis=1)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(matrix[keep], type=value_type))


def lookup(keys: np.ndarray, values: np.ndarray, wanted: np.ndarray, missing: int) -> np.ndarray:
    """values[i] where keys[i] == each of `wanted` (any shape), `missing` where no key is (keys
    unique, in any order)."""
    if not len(keys):
        return np.full(np.shape(wanted), missing, dtype=np.asarray(values).dtype if len(values) else np.int64)
    order = np.argsort(keys)
    keys, values = np.asarray(keys)[order], np.asarray(values)[order]
    at = np.clip(np.searchsorted(keys, wanted), 0, len(keys) - 1)
    return np.where(keys[at] == wanted, values[at], missing)
