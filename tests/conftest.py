import pytest
from pyspark.sql import SparkSession

from pipeline import Cluster, ManualClock, get_spark
from pipeline.runtime import driver_java_options, forget_table_logs


@pytest.fixture(scope="session")
def spark():
    # small data: adaptive execution's extra per-stage jobs cost more than they save (rounds ~10%
    # faster without it, measured side by side); it changes no result
    # the parallel collector: a worker makes and forgets hundreds of clusters, CPU bound on 2 cores
    # (pipeline.runtime.PARALLEL_GC)
    session = get_spark(extra={"spark.sql.shuffle.partitions": "1", "spark.default.parallelism": "2",
                               "spark.sql.adaptive.enabled": "false",
                               "spark.databricks.delta.snapshotPartitions": "1",
                               "spark.driver.extraJavaOptions": driver_java_options(parallel_gc=True)})
    yield session
    session.stop()


@pytest.fixture(scope="module", autouse=True)
def forget_a_modules_tables():
    """After each test module, the session forgets the Delta logs of the tables its tests made
    (pipeline.runtime.forget_table_logs): they are deleted, and kept they filled the heap."""
    yield
    session = SparkSession.getActiveSession()
    if session is not None:
        forget_table_logs(session)


@pytest.fixture
def clock():
    return ManualClock(start_ms=0)


@pytest.fixture
def new_cluster(spark, tmp_path, clock):
    """Factory: a fresh cluster under tmp_path (brokers, config)."""
    count = {"n": 0}

    def make(brokers=3, config=None):
        count["n"] += 1
        return Cluster.create(spark, str(tmp_path / f"cluster{count['n']}"), brokers=brokers, config=config,
                              clock=clock)

    return make


