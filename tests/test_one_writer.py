"""One writer per root: the replication lease. A second Cluster object (or job) that runs rounds on
the same root takes the lease over with the next job epoch; the first is fenced at its next round
with FENCED_INSTANCE_ID naming the new holder, and writes nothing."""

import pytest
from pyspark.sql import functions as F

from pipeline import Cluster
from pipeline.errors import ErrorCode, ReplogError


def test_a_second_writer_takes_the_lease_and_the_first_is_fenced_before_writing(spark, tmp_path, clock):
    root = str(tmp_path / "c")
    first = Cluster.create(spark, root, brokers=1, clock=clock)
    first.create_topic("t", partitions=1, replication_factor=1)
    first.run_round()
    lease = first.storage.read("lease").first()
    assert (lease["holder"], lease["job_epoch"]) == (first.holder, 1)

    second = Cluster.open(spark, root, clock=clock)
    second.run_round()
    assert first.storage.read("lease").first()["job_epoch"] == 2

    request = first.produce("t", [{"value": "v"}], acks=1)  # produce needs no lease: any process may
    rounds = first.rounds().count()
    versions = {t: first.storage.version(t) for t in ("replica_state", "partitions", "results", "rounds")}
    with pytest.raises(ReplogError) as failed:
        first.run_round()
    assert failed.value.code == ErrorCode.FENCED_INSTANCE_ID
    assert second.holder in str(failed.value) and "job epoch 2" in str(failed.value)
    assert {t: first.storage.version(t) for t in versions} == versions  # nothing written
    with pytest.raises(ReplogError):
        first.run_round()  # and stays fenced

    # the holder goes on and appends the request the fenced one could not
    second.run_round()
    assert second.rounds().count() == rounds + 1
    assert second.produce_results().filter(F.col("request_id") == request).first()["status"] == "acked"
