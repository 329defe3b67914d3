"""Py4J's name lookups are remembered (pipeline/runtime/jvm_lookups.py): a call to the JVM costs one round
trip, not one per dot of its name; fields are still read each time. A column name's JVM Column is
made once, and a list argument crosses in calls of ten elements."""

from pyspark import SparkContext
from pyspark.sql import functions as F

from pipeline.runtime.jvm_lookups import _NamedColumns


def _round_trips(spark, monkeypatch):
    """The commands sent to the JVM from here on, without Py4J's "m d" (a Python proxy freed by the
    garbage collector, which can run at any moment and free objects an earlier test made)."""
    client = spark.sparkContext._gateway._gateway_client
    sent = []
    send = client.send_command

    def counting(command, *args, **kwargs):
        if not command.startswith("m\nd\n"):
            sent.append(command.splitlines()[0:2])
        return send(command, *args, **kwargs)

    monkeypatch.setattr(client, "send_command", counting)
    return sent


def test_a_function_call_is_one_round_trip_once_its_name_is_known(spark, monkeypatch):
    F.col("warm")  # the first call resolves org.apache.spark.sql.functions and col
    sent = _round_trips(spark, monkeypatch)
    column = F.col("first_use_of_this_name")
    assert len(sent) == 1 and sent[0][0] == "c"  # the call ("c"), no reflection ("r") before it
    assert [r[0] for r in spark.range(2).withColumnRenamed("id", "first_use_of_this_name").select(column)
            .collect()] == [0, 1]


def test_static_methods_are_remembered_and_fields_are_read_each_time(spark, monkeypatch):
    jvm = spark._jvm
    jvm.scala.Option.empty(), jvm.java.lang.Integer  # resolved once
    sent = _round_trips(spark, monkeypatch)
    assert jvm.scala.Option.empty().isEmpty()
    assert [s[0] for s in sent] == ["c", "c"]  # empty(), then isEmpty() on the object it returned
    sent.clear()
    assert jvm.java.lang.Integer.MAX_VALUE == 2**31 - 1
    assert jvm.java.lang.Integer.MAX_VALUE == 2**31 - 1
    assert [s[0] for s in sent] == ["r", "r"]  # a field: asked of the JVM each time


def test_a_column_name_becomes_a_jvm_column_once(spark, monkeypatch):
    F.col("named_once")
    sent = _round_trips(spark, monkeypatch)
    a, b = F.col("named_once"), F.col("named_once")
    assert sent == [] and a._jc is b._jc
    left = spark.range(3).withColumnRenamed("id", "named_once")
    right = spark.range(1, 4).withColumnRenamed("id", "named_once").withColumn("twice", F.col("named_once") * 2)
    # the same name resolved in two DataFrames, a join on it, and a string name in select
    rows = left.join(right, on="named_once").select("named_once", "twice", (a + 1).alias("next")).collect()
    assert sorted(tuple(r) for r in rows) == [(1, 2, 2), (2, 4, 3)]


def test_literals_are_kept_by_type_and_value(spark, monkeypatch):
    F.lit("kept"), F.lit(7), F.lit(True), F.lit(None)
    sent = _round_trips(spark, monkeypatch)
    assert F.lit("kept")._jc is F.lit("kept")._jc and F.lit(None)._jc is F.lit(None)._jc and sent == []
    assert F.lit(1)._jc is not F.lit(True)._jc  # equal in Python, not the same literal
    row = spark.range(1).select(F.lit(7).alias("i"), F.lit(True).alias("b"), F.lit(1).alias("one"),
                                F.lit("kept").alias("s"), F.lit(None).cast("long").alias("n")).first()
    assert tuple(row) == (7, True, 1, "kept", None)
    assert dict(spark.range(1).select(F.lit(True).alias("b"), F.lit(1).alias("one")).dtypes) == \
        {"b": "boolean", "one": "int"}


def test_a_new_spark_context_starts_an_empty_column_cache(monkeypatch):
    made = []
    named = _NamedColumns(lambda name: made.append(name) or f"column {name} #{len(made)}")
    monkeypatch.setattr(SparkContext, "_active_spark_context", "context one")
    assert named("a") == named("a") == "column a #1"
    monkeypatch.setattr(SparkContext, "_active_spark_context", "context two")
    assert named("a") == "column a #2" and made == ["a", "a"]


def test_a_list_argument_crosses_ten_elements_a_call(spark, monkeypatch):
    spark._jvm.java.util.Collections.max([1, 2])  # resolved once
    sent = _round_trips(spark, monkeypatch)
    items = [f"e{i}" for i in range(25)]
    assert spark._jvm.java.util.Collections.max(items) == "e9"
    # List.of and the ArrayList for the first ten, List.of and addAll for each further ten, the call
    assert len(sent) == 7
    converted = spark._jvm.java.util.ArrayList(items)
    assert list(converted) == items
    converted.add("more")  # a mutable list, as Py4J's own conversion makes
    assert converted.size() == 26


def test_a_list_with_a_null_is_converted_element_by_element(spark):
    converted = spark._jvm.java.util.ArrayList(["a", None, 3])
    assert list(converted) == ["a", None, 3]
    assert list(spark._jvm.java.util.ArrayList([])) == []


def test_importing_the_package_patches_nothing_and_get_spark_switches_the_cache_on():
    import subprocess
    import sys
    code = ("import pipeline\n"
            "from py4j import java_gateway\n"
            "from pyspark.sql.classic import column\n"
            "from pyspark.sql.functions import builtin\n"
            "print(hasattr(java_gateway.JavaClass.__getattr__, '__wrapped__'),"
            " isinstance(column._create_column_from_name, type(lambda: 0)),"
            " hasattr(builtin._invoke_function, '__wrapped__'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True", "False"]
    # this process's session came from get_spark: the cache is on
    from py4j import java_gateway
    assert hasattr(java_gateway.JavaClass.__getattr__, "__wrapped__")
