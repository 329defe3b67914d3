"""Errors a user can cause, named by Kafka's error codes where Kafka has one."""

from __future__ import annotations

__all__ = ["ReplogError", "ErrorCode", "LogDirFailure"]


class ErrorCode:
    """Kafka's error names (org.apache.kafka.common.protocol.Errors) used by this project."""

    NONE = "NONE"
    UNKNOWN_TOPIC_OR_PARTITION = "UNKNOWN_TOPIC_OR_PARTITION"
    INVALID_REPLICATION_FACTOR = "INVALID_REPLICATION_FACTOR"
    INVALID_REPLICA_ASSIGNMENT = "INVALID_REPLICA_ASSIGNMENT"
    INVALID_PARTITIONS = "INVALID_PARTITIONS"
    INVALID_TOPIC_EXCEPTION = "INVALID_TOPIC_EXCEPTION"
    TOPIC_ALREADY_EXISTS = "TOPIC_ALREADY_EXISTS"
    INVALID_REQUIRED_ACKS = "INVALID_REQUIRED_ACKS"
    INVALID_CONFIG = "INVALID_CONFIG"
    INVALID_REQUEST = "INVALID_REQUEST"
    UNKNOWN_SERVER_ERROR = "UNKNOWN_SERVER_ERROR"
    INVALID_RECORD = "INVALID_RECORD"
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
    NOT_ENOUGH_REPLICAS = "NOT_ENOUGH_REPLICAS"
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
    NOT_LEADER_OR_FOLLOWER = "NOT_LEADER_OR_FOLLOWER"
    LEADER_NOT_AVAILABLE = "LEADER_NOT_AVAILABLE"
    OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"
    FENCED_LEADER_EPOCH = "FENCED_LEADER_EPOCH"
    UNKNOWN_LEADER_EPOCH = "UNKNOWN_LEADER_EPOCH"
    OUT_OF_ORDER_SEQUENCE_NUMBER = "OUT_OF_ORDER_SEQUENCE_NUMBER"
    INVALID_PRODUCER_EPOCH = "INVALID_PRODUCER_EPOCH"
    DUPLICATE_SEQUENCE_NUMBER = "DUPLICATE_SEQUENCE_NUMBER"
    CLUSTER_ALREADY_EXISTS = "CLUSTER_ALREADY_EXISTS"
    CLUSTER_NOT_FOUND = "CLUSTER_NOT_FOUND"
    # a second replication job started on a root whose job still runs (not a Kafka code: storage/job_lock.py)
    REPLICATION_JOB_RUNNING = "REPLICATION_JOB_RUNNING"
    BROKER_NOT_AVAILABLE = "BROKER_NOT_AVAILABLE"
    # a broker registering while its previous incarnation still holds its registration
    DUPLICATE_BROKER_REGISTRATION = "DUPLICATE_BROKER_REGISTRATION"
    REQUEST_TIMED_OUT = "REQUEST_TIMED_OUT"
    FETCH_SESSION_ID_NOT_FOUND = "FETCH_SESSION_ID_NOT_FOUND"
    INVALID_FETCH_SESSION_EPOCH = "INVALID_FETCH_SESSION_EPOCH"
    INVALID_GROUP_ID = "INVALID_GROUP_ID"
    # another instance took over (Kafka: a static member whose group.instance.id a newer one uses)
    FENCED_INSTANCE_ID = "FENCED_INSTANCE_ID"
    OFFSET_METADATA_TOO_LARGE = "OFFSET_METADATA_TOO_LARGE"
    # a log directory that cannot be read or repaired (Kafka: a failed log dir)
    KAFKA_STORAGE_ERROR = "KAFKA_STORAGE_ERROR"
    # a log directory that holds another cluster's data (Kafka's InconsistentClusterIdException)
    INCONSISTENT_CLUSTER_ID = "INCONSISTENT_CLUSTER_ID"
    # the consumer's NoOffsetForPartitionException (a client error, not a protocol code)
    NO_OFFSET_FOR_PARTITION = "NO_OFFSET_FOR_PARTITION"


class ReplogError(Exception):
    """An error a user caused; `code` is Kafka's error name, and nothing was written.

    >>> ReplogError(ErrorCode.INVALID_CONFIG, "unknown key 'foo'").code
    'INVALID_CONFIG'
    """

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.detail = message


class LogDirFailure(ReplogError):
    """KAFKA_STORAGE_ERROR for a log directory the file system refuses (Kafka's
    KafkaStorageException from a failed log dir); `broker`: whose log it is (None: a cluster table)."""

    def __init__(self, problem: str, remedy: str, broker: int | None = None):
        super().__init__(ErrorCode.KAFKA_STORAGE_ERROR, f"{problem}. {remedy}.")
        self.problem = problem  # what the file system refused, without the remedy
        self.broker = broker
