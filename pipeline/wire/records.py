"""Kafka's record batches (magic v2) at the front door: a Produce request's batches read into inbox
records, and log rows written into the batches a Fetch response carries. The batch format (framing,
varints, CRC-32C) is kio's (kio.records); what is kept, refused and rebuilt is decided here.

A produced batch becomes records {key, value, partition, producer_id, producer_epoch, sequence}
(the sequence of each record is the batch's base sequence plus its offset delta; a batch without a
producer id, -1, is not idempotent). Refused, with Kafka's error for the partition and nothing
written:
- a compressed batch (attributes bits 0-2): UNSUPPORTED_COMPRESSION_TYPE (the door stores records
  as they are; a producer sends with compression.type=none);
- a transactional or control batch (bits 4 and 5): the door serves no transactions
  (TRANSACTIONAL_ID_AUTHORIZATION_FAILED is what Kafka answers a producer it does not allow one;
  INVALID_RECORD here, with the reason);
- a record with headers: INVALID_RECORD, since the log keeps no headers and dropping them would
  lose what the producer wrote;
- bytes that are not a well-formed batch (CRC, lengths): CORRUPT_MESSAGE.

The log's timestamp is the time the request reached the inbox, as a topic with
message.timestamp.type=LogAppendTime has it; the producer's timestamps are not kept.

A fetched partition's records are written as batches of consecutive records of one leader epoch
(the epoch a KIP-320 consumer validates its position with), at most BATCH_RECORDS each.
"""

from __future__ import annotations

import io
from datetime import datetime, timezone
from typing import Any, Iterable

from kio.records.readers import read_batch
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

__all__ = ["RecordsRefused", "read_produced", "write_fetched", "BATCH_RECORDS"]

COMPRESSION_MASK = 0x07
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
NO_PRODUCER_ID = -1
BATCH_RECORDS = 500


class RecordsRefused(Exception):
    """A partition's records the door does not append: `error` is Kafka's error name."""

    def __init__(self, error: str, message: str):
        super().__init__(message)
        self.error = error


def read_produced(data: bytes | None, partition: int) -> list[dict]:
    """The records of a partition's batches in a Produce request, in order; RecordsRefused for what
    the door does not append."""
    if not data:
        raise RecordsRefused("INVALID_RECORD", "a produce request with no records for the partition")
    out: list[dict] = []
    offset = 0
    while offset < len(data):
        try:
            batch, size = read_batch(data, offset)
        except Exception as err:  # noqa: BLE001 - whatever a corrupt batch raises in the reader
            raise RecordsRefused("CORRUPT_MESSAGE", f"a record batch that does not read: {err}") from None
        offset += size
        attributes = int(batch.attributes)
        if attributes & COMPRESSION_MASK:
            raise RecordsRefused("UNSUPPORTED_COMPRESSION_TYPE",
                                 f"a batch compressed with codec {attributes & COMPRESSION_MASK}; "
                                 "the front door takes compression.type=none")
        if attributes & (TRANSACTIONAL_BIT | CONTROL_BIT):
            raise RecordsRefused("INVALID_RECORD", "a transactional batch: the front door serves no transactions")
        idempotent = int(batch.producer_id) != NO_PRODUCER_ID
        base_offset = int(batch.base_offset)
        for record in batch.records:
            if record.headers:
                raise RecordsRefused("INVALID_RECORD", "a record with headers: the log keeps no record headers")
            row: dict[str, Any] = {"key": record.key, "value": record.value, "partition": partition}
            if idempotent:
                row.update(producer_id=int(batch.producer_id), producer_epoch=int(batch.producer_epoch),
                           sequence=int(batch.base_sequence) + int(record.offset) - base_offset)
            out.append(row)
    if not out:
        raise RecordsRefused("INVALID_RECORD", "a produce request with no records for the partition")
    return out


def _timestamp(ms: int) -> TZAwareMicros:
    return TZAwareMicros.parse(datetime.fromtimestamp(ms / 1000, timezone.utc))


def write_fetched(rows: Iterable[tuple[int, int, int, bytes | None, bytes | None]]) -> bytes:
    """The batches for a partition's fetched records: rows of (offset, leader_epoch, timestamp ms,
    key, value) in offset order."""
    buffer = io.BytesIO()
    batch: list[Record] = []
    epoch = None

    def flush() -> None:
        if batch:
            write_new_batch(buffer, NewRecordBatch(producer_id=i64(-1), producer_epoch=i16(-1),
                                                   partition_leader_epoch=i32(epoch), base_sequence=i32(-1),
                                                   records=tuple(batch), attributes=i16(0)))
            batch.clear()

    for offset, leader_epoch, ts, key, value in rows:
        if leader_epoch != epoch or len(batch) >= BATCH_RECORDS:
            flush()
            epoch = leader_epoch
        batch.append(Record(attributes=i8(0), timestamp=_timestamp(ts), offset=i64(offset), key=key,
                            value=value, headers=()))
    flush()
    return buffer.getvalue()
