"""The producer side: validating records, turning them into inbox rows (client-side partitioning),
and appending a produce request to the inbox."""

from __future__ import annotations

import random
import uuid
from typing import TYPE_CHECKING, Any, Iterable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, ByteType, IntegerType, LongType, ShortType, StringType

from pipeline.errors import ErrorCode, ReplogError
from pipeline.data.partitioner import partition_for_key
from pipeline.runtime import compiled_expressions
from pipeline.schemas import ACKS_ALL, INBOX_SCHEMA

if TYPE_CHECKING:
    from pipeline.core import ClusterCore

__all__ = ["parse_acks", "check_client", "record_rows", "records_frame", "produce_request"]

_ACKS = {0: 0, 1: 1, -1: ACKS_ALL, "0": 0, "1": 1, "-1": ACKS_ALL, "all": ACKS_ALL}
_RECORD_FIELDS = {"key", "value", "partition", "producer_id", "producer_epoch", "sequence"}


def parse_acks(acks: Any) -> int:
    """0, 1, -1 or "all" (Kafka's `acks`); anything else is INVALID_REQUIRED_ACKS."""
    if isinstance(acks, bool) or not isinstance(acks, (int, str)) or acks not in _ACKS:
        raise ReplogError(ErrorCode.INVALID_REQUIRED_ACKS, f"acks must be 0, 1, -1 or 'all', got {acks!r}")
    return _ACKS[acks]


def check_client(client_id: Any, user: Any) -> tuple[str | None, str | None]:
    """A request's sender: Kafka's client.id and the user it authenticated as (both optional)."""
    for name, value in (("client_id", client_id), ("user", user)):
        if value is not None and (not isinstance(value, str) or not value or value == "<default>"):
            raise ReplogError(ErrorCode.INVALID_REQUEST, f"{name} must be a non-empty str or None, got {value!r}")
    return client_id, user


def _to_bytes(value: Any, field: str, index: int) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise ReplogError(ErrorCode.INVALID_RECORD,
                      f"record {index}: {field} must be str or bytes, got {type(value).__name__}")


def _optional_int(record: dict, field: str, index: int) -> int | None:
    value = record.get(field)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ReplogError(ErrorCode.INVALID_RECORD, f"record {index}: {field} must be an int, got {value!r}")
    return value


def record_rows(records: Iterable[dict], topic: str, partitions: int | None, request_id: str,
                acks: int, now_ms: int, client: tuple[str | None, str | None] = (None, None)) -> list[tuple]:
    """Inbox rows for a list of records; keyed records go where Kafka's default partitioner puts
    them, null keys round-robin from a random start. `partitions` is None for an unknown topic;
    `client`: the sender's (client id, user)."""
    rows = []
    spread = random.randrange(partitions) if partitions else 0
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise ReplogError(ErrorCode.INVALID_RECORD, f"record {index} must be a dict, got {type(record).__name__}")
        unknown = set(record) - _RECORD_FIELDS
        if unknown:
            raise ReplogError(ErrorCode.INVALID_RECORD, f"record {index} has unknown fields {sorted(unknown)}")
        if "value" not in record:
            raise ReplogError(ErrorCode.INVALID_RECORD, f"record {index} has no 'value'")
        key = _to_bytes(record.get("key"), "key", index)
        value = _to_bytes(record["value"], "value", index)
        partition = _optional_int(record, "partition", index)
        if partition is None and partitions:
            partition = partition_for_key(key, partitions) if key is not None else (spread + index) % partitions
        rows.append((request_id, index, topic, partition, key, value, acks, now_ms,
                     _optional_int(record, "producer_id", index), _optional_int(record, "producer_epoch", index),
                     _optional_int(record, "sequence", index), *client))
    if not rows:
        raise ReplogError(ErrorCode.INVALID_RECORD, "no records to produce")
    return rows


# A produced DataFrame whose plan Spark estimates at this many bytes or more is written with compiled
# expressions (pipeline/runtime/tuning.py): 1,000,000 records of 100 bytes took 3.6 s compiled against 27.6 s
# interpreted, but 1,000 took 1.08 s against 0.24 s (a compile per write: the request id and time are
# literals in the plan). jobs/benchmark.py --scenario produce
BULK_BYTES_FOR_CODEGEN = 10_000_000


def is_bulk(df: DataFrame) -> bool:
    """Whether Spark's size estimate of `df`'s plan (no job runs) reaches BULK_BYTES_FOR_CODEGEN;
    False when it cannot say."""
    try:
        return int(str(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())) >= BULK_BYTES_FOR_CODEGEN
    except Exception:  # an estimate is an optimization only
        return False


def records_frame(df: DataFrame, topic: str, partitions: int | None, request_id: str, acks: int,
                  now_ms: int, client: tuple[str | None, str | None] = (None, None)) -> DataFrame:
    """Inbox rows for a DataFrame of records (columns key, value, optional partition)."""
    columns = set(df.columns)
    if "value" not in columns:
        raise ReplogError(ErrorCode.INVALID_RECORD, "the records DataFrame has no 'value' column")
    extra = columns - _RECORD_FIELDS
    if extra:
        raise ReplogError(ErrorCode.INVALID_RECORD, f"the records DataFrame has unknown columns {sorted(extra)}")
    for field in ("key", "value"):
        if field in columns and not isinstance(df.schema[field].dataType, (StringType, BinaryType)):
            raise ReplogError(ErrorCode.INVALID_RECORD,
                              f"column '{field}' must be string or binary, got {df.schema[field].dataType.simpleString()}")
    for field in ("partition", "producer_id", "producer_epoch", "sequence"):
        if field in columns and not isinstance(df.schema[field].dataType, (ByteType, ShortType, IntegerType, LongType)):
            raise ReplogError(ErrorCode.INVALID_RECORD,
                              f"column '{field}' must be an integer type, got {df.schema[field].dataType.simpleString()}")
    key = F.col("key").cast("binary") if "key" in columns else F.lit(None).cast("binary")
    explicit = F.col("partition").cast("int") if "partition" in columns else F.lit(None).cast("int")
    index = F.monotonically_increasing_id()
    if partitions:
        by_key = F.udf(lambda k: None if k is None else partition_for_key(bytes(k), partitions), IntegerType(),
                       useArrow=False)(key)
        spread = F.pmod(index + F.lit(random.randrange(partitions)), F.lit(partitions)).cast("int")
        partition = F.coalesce(explicit, F.when(key.isNotNull(), by_key).otherwise(spread))
    else:
        partition = explicit
    optional = {c: (F.col(c) if c in columns else F.lit(None)) for c in ("producer_id", "producer_epoch", "sequence")}
    out = df.select(
        F.lit(request_id).alias("request_id"), index.alias("record_index"), F.lit(topic).alias("topic"),
        partition.alias("partition"), key.alias("key"), F.col("value").cast("binary").alias("value"),
        F.lit(acks).alias("acks"), F.lit(now_ms).alias("timestamp"),
        *[optional[c].alias(c) for c in optional],
        F.lit(client[0]).alias("client_id"), F.lit(client[1]).alias("user"),
    )
    return out.select([F.col(f.name).cast(f.dataType) for f in INBOX_SCHEMA.fields])


def produce_request(core: "ClusterCore", topic: str, records: Any, acks: Any = 1, client_id: str | None = None,
                    user: str | None = None) -> str:
    """A produce request appended to the inbox (Cluster.produce); its request id. A bulk load (a
    DataFrame of many rows) is written with compiled expressions."""
    acks_value = parse_acks(acks)
    client = check_client(client_id, user)
    if not isinstance(topic, str):
        raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic must be a str, got {topic!r}")
    meta = core.metadata.topic(topic)
    partitions = meta["partitions"] if meta is not None else None
    request_id = str(uuid.uuid4())
    now = core.clock.now_ms()
    if isinstance(records, DataFrame):
        df = records_frame(records, topic, partitions, request_id, acks_value, now, client)
        with compiled_expressions(core.spark, when=is_bulk(df)):
            core.storage.append_table(df, "inbox")
        return request_id
    if isinstance(records, (str, bytes, dict)) or not hasattr(records, "__iter__"):
        raise ReplogError(ErrorCode.INVALID_RECORD, "records must be a list of dicts or a DataFrame")
    df = core.spark.createDataFrame(record_rows(records, topic, partitions, request_id, acks_value, now, client),
                                    INBOX_SCHEMA)
    core.storage.append_table(df, "inbox")
    return request_id
