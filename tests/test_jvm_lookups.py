"""Py4J's name lookups are remembered (pipeline/jvm_lookups.py): a call to the JVM costs one round
trip, not one per dot of its name; fields are still read each time."""

from pyspark.sql import functions as F


def _round_trips(spark, monkeypatch):
    client = spark.sparkContext._gateway._gateway_client
    sent = []
    send = client.send_command

    def counting(command, *args, **kwargs):
        sent.append(command.splitlines()[0:2])
        return send(command, *args, **kwargs)

    monkeypatch.setattr(client, "send_command", counting)
    return sent


def test_a_function_call_is_one_round_trip_once_its_name_is_known(spark, monkeypatch):
    F.col("warm")  # the first call resolves org.apache.spark.sql.functions and col
    sent = _round_trips(spark, monkeypatch)
    column = F.col("x")
    assert len(sent) == 1 and sent[0][0] == "c"  # the call ("c"), no reflection ("r") before it
    assert [r[0] for r in spark.range(2).withColumnRenamed("id", "x").select(column).collect()] == [0, 1]


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
