"""pipeline.runtime's settings helpers and the driver's JVM options."""

from pipeline.runtime import compiled_expressions, forget_table_logs


def test_driver_java_options_name_the_archive_when_setup_made_one_and_c1_for_short_lived_processes(
        tmp_path, monkeypatch):
    import pipeline.runtime.session as spark_module
    monkeypatch.setenv("REPLOG_CACHE", str(tmp_path))  # the archive lives in the cache's jvm/
    (tmp_path / "jvm").mkdir()
    assert spark_module.driver_java_options() == ""  # no archive: Java's defaults
    assert spark_module.driver_java_options(parallel_gc=True) == "-XX:+UseParallelGC"
    assert spark_module.driver_java_options(short_lived=True) == "-XX:TieredStopAtLevel=1"
    spark_module.jvm_archive().write_bytes(b"archive")
    archive = f"-XX:SharedArchiveFile={tmp_path / 'jvm' / spark_module.jvm_archive().name}"
    assert spark_module.driver_java_options().split() == [archive, "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
    assert spark_module.driver_java_options(parallel_gc=True).split()[-1] == "-XX:+UseParallelGC"
    assert spark_module.driver_java_options(short_lived=True).split()[-1] == "-XX:TieredStopAtLevel=1"
    spaced = tmp_path / "a checkout"  # Spark splits the options at whitespace: no archive then
    (spaced / "jvm").mkdir(parents=True)
    monkeypatch.setenv("REPLOG_CACHE", str(spaced))
    spark_module.jvm_archive().write_bytes(b"archive")
    assert spark_module.driver_java_options(short_lived=True) == "-XX:TieredStopAtLevel=1"


def test_the_suites_jvm_maps_the_archive_that_setup_made_and_runs_the_parallel_collector(spark):
    from pipeline.runtime import jvm_archive
    assert jvm_archive().is_file(), "make setup writes it (scripts/jvm_archive.py)"
    jvm = spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={jvm_archive()}" in arguments
    assert "-XX:TieredStopAtLevel=1" not in arguments  # a long-lived process keeps C2
    collectors = {str(b.getName()) for b in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()}
    assert collectors == {"PS Scavenge", "PS MarkSweep"}  # the parallel collector (conftest.py), not G1


def test_forgetting_the_table_logs_empties_deltas_cache_and_the_tables_read_and_write_as_before(spark, tmp_path):
    # (cacheSize has no static forwarder on the DeltaLog class: ask its Scala object)
    delta_log = getattr(getattr(spark.sparkContext._jvm.org.apache.spark.sql.delta, "DeltaLog$"), "MODULE$")
    path = str(tmp_path / "t")
    spark.range(3).write.format("delta").save(path)
    assert spark.read.format("delta").load(path).count() == 3
    assert delta_log.cacheSize() >= 1
    forget_table_logs(spark)
    assert delta_log.cacheSize() == 0
    spark.range(3, 5).write.format("delta").mode("append").save(path)
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == [0, 1, 2, 3, 4]


def test_a_pinned_frame_without_its_size_estimate_keeps_its_rows_and_runs_no_job(spark):
    from pyspark.sql import functions as F
    from pipeline.runtime import without_size_estimate
    pinned = spark.range(5).join(spark.range(5).withColumnRenamed("id", "x"), F.col("id") == F.col("x")) \
        .localCheckpoint()

    def estimate(df):
        return int(str(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
    assert estimate(pinned) < 2 ** 63 - 1  # (localCheckpoint keeps the estimate of the plan it pinned)
    scheduler = spark.sparkContext._jsc.sc().dagScheduler()
    before = int(str(scheduler.nextJobId()))
    plain = without_size_estimate(pinned)
    assert int(str(scheduler.nextJobId())) == before
    assert estimate(plain) == 2 ** 63 - 1  # Spark's default: no product of products across rounds
    assert sorted(r.id for r in plain.collect()) == [0, 1, 2, 3, 4]


def test_a_block_of_work_on_many_rows_runs_compiled_and_the_session_gets_its_own_settings_back(spark):
    keys = ("spark.sql.codegen.wholeStage", "spark.sql.codegen.factoryMode")
    session = tuple(spark.conf.get(k) for k in keys)
    assert session == ("false", "NO_CODEGEN")  # (the suite's session interprets, as the product's does)
    with compiled_expressions(spark):
        assert tuple(spark.conf.get(k) for k in keys) == ("true", "FALLBACK")
    with compiled_expressions(spark, when=False):
        assert tuple(spark.conf.get(k) for k in keys) == session
    try:
        with compiled_expressions(spark):
            spark.conf.set("spark.sql.codegen.factoryMode", "CODEGEN_ONLY")
            raise RuntimeError("the block failed")
    except RuntimeError:
        pass
    assert tuple(spark.conf.get(k) for k in keys) == session
