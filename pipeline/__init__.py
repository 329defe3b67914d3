"""replog: a replicated log with Apache Kafka's replication guarantees on Spark and Delta Lake."""

from pipeline.clock import Clock, ManualClock, SystemClock
from pipeline.cluster import Cluster
from pipeline.errors import ErrorCode, ReplogError
from pipeline.round import RoundReport
from pipeline.runtime import get_spark

__all__ = ["Cluster", "Clock", "ManualClock", "SystemClock", "ErrorCode", "ReplogError", "RoundReport", "get_spark"]
