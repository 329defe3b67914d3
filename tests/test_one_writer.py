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


def test_of_two_claims_from_the_same_epoch_the_later_one_is_refused_before_its_round(spark, tmp_path, clock):
    """The claim is a compare-and-set on the job epoch read just before it: a process whose
    epoch another claim moved in between takes nothing (its MERGE updates no row) and says who
    holds the lease."""
    root = str(tmp_path / "c")
    first = Cluster.create(spark, root, brokers=1, clock=clock)
    first.create_topic("t", partitions=1, replication_factor=1)
    first.run_round()
    late, quick = Cluster.open(spark, root, clock=clock), Cluster.open(spark, root, clock=clock)
    read_epoch = late.core.lease._row

    def epoch_then_taken():  # `late` reads epoch 1, then `quick` claims epoch 2 before late's MERGE
        row = read_epoch()
        late.core.lease._row = read_epoch
        quick.run_round()
        return row

    late.core.lease._row = epoch_then_taken
    versions = {t: first.storage.version(t) for t in ("rounds", "replica_state", "partitions", "results")}
    with pytest.raises(ReplogError) as refused:
        late.run_round()
    assert refused.value.code == ErrorCode.FENCED_INSTANCE_ID
    assert f"held by {quick.holder}" in str(refused.value)
    # (the refused MERGE matched no row to update; Delta still commits it, with no data change)
    assert [(r["holder"], r["job_epoch"]) for r in first.storage.read("lease").collect()] == [(quick.holder, 2)]
    assert {t: first.storage.version(t) for t in versions} == {**versions, "rounds": versions["rounds"] + 1}
    quick.run_round()  # the holder goes on
