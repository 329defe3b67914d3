"""A short fixed-seed run of the fault-injection soak (tests/soak/: `make soak` runs long ones),
and proof that its checker catches what it checks for."""

import pytest
from pyspark.sql import functions as F

from tests.soak.checker import Violation
from tests.soak.soak import Soak


@pytest.fixture(scope="module")
def soaked(spark, tmp_path_factory):
    return Soak(spark, str(tmp_path_factory.mktemp("soak") / "c"), seed=11).run(events=30)


def test_a_short_soak_keeps_every_guarantee(soaked):
    assert soaked.rounds >= 10
    assert soaked.expected.requests  # traffic was produced, and every request settled (checked in run)


def test_the_checker_catches_a_lost_acknowledged_record_and_a_duplicate_offset(spark, soaked):
    cluster, checker = soaked.cluster, soaked.checker
    snap = checker.check()
    acked = next((rid, records) for rid, (topic, acks, records) in soaked.expected.requests.items()
                 if topic == "clean" and acks == -1
                 and snap["results"].get((rid, topic, records[0][0]), {}).get("status") == "acked")
    partition = acked[1][0][0]
    leader = snap["partitions"][("clean", partition)]["leader"]
    log = cluster.storage.log_path(leader)
    offset = snap["results"][(acked[0], "clean", partition)]["base_offset"]
    row = spark.read.format("delta").load(log).filter((F.col("topic") == "clean") & (F.col("partition") == partition)
                                                      & (F.col("offset") == offset))
    row.write.format("delta").mode("append").save(log)  # the same offset twice
    with pytest.raises(Violation, match=r"\[duplicates\]"):
        checker.check()
    spark.sql(f"DELETE FROM delta.`{log}` WHERE topic = 'clean' AND partition = {partition} AND offset = {offset}")
    with pytest.raises(Violation, match=r"\[(acked|gap)\]"):
        checker.check()
