"""Brokers in separate failure domains (Kafka's log.dirs, one location per broker): each broker's
log in a directory tree of its own, outside the cluster root. Losing one broker's whole location,
or having it refuse writes, halts that broker as Kafka halts a broker whose only log dir failed:
every acknowledged record stays committed and readable, the partitions it led move to a leader from
their ISR, and once its location is back (or replaced by an empty one) it re-syncs to the same
records at the same offsets. Locations two brokers would share, or that hold another cluster's log,
are refused before anything is written."""

import os
import shutil

import pytest

from pipeline import Cluster, ManualClock
from pipeline.errors import ReplogError
from pipeline.storage import Storage
from tests.fs_faults import read_only
from tests.helpers import advance_rounds

START = 1_700_000_000_000
SESSION_TIMEOUT_MS = 9000  # broker.session.timeout.ms, Kafka's default


def _three_disks(spark, tmp_path, **kwargs):
    disks = {b: str(tmp_path / f"disk{b}" / "replog") for b in range(3)}
    cluster = Cluster.create(spark, str(tmp_path / "meta"), brokers=3, clock=ManualClock(start_ms=START),
                             config={"min.insync.replicas": 2}, broker_dirs=disks, **kwargs)
    cluster.create_topic("t", partitions=3, replication_factor=3)
    return cluster, disks


def _produce(cluster, tag, n=6):
    return cluster.produce("t", [{"value": f"{tag}{i}", "partition": i % 3} for i in range(n)], acks="all")


def _statuses(cluster):
    """(request id, partition) -> the produce result's status."""
    return {(r["request_id"], r["partition"]): r["status"] for r in cluster.produce_results().collect()}


def _committed(cluster, replica=None):
    return sorted((r["partition"], r["offset"], r["value"].decode())
                  for r in cluster.read("t", replica=replica).collect())


def _leaders(cluster):
    return {r["partition"]: (r["leader"], list(r["isr"])) for r in cluster.describe("t").collect()}


def _below_hw(cluster, broker):
    """A replica's records below its partition's high watermark (read from its own log)."""
    hw = {r["partition"]: r["high_watermark"] for r in cluster.describe("t").collect()}
    return sorted((r["partition"], r["offset"], r["value"].decode())
                  for r in cluster.read("t", replica=broker, isolation="read_uncommitted").collect()
                  if r["offset"] < hw[r["partition"]])


def _fail_over(cluster, victim):
    """Rounds until the controller has fenced the halted `victim` and moved its leaderships."""
    advance_rounds(cluster, None, SESSION_TIMEOUT_MS // 1000 + 2, step=1000)
    state = {r["broker"]: r for r in cluster.broker_states().collect()}[victim]
    assert state["state"] == "fenced" and state["log_dir_failure"] is not None


@pytest.mark.parametrize("failure", ["deleted", "unwritable"])
def test_a_broker_whose_whole_location_fails_loses_no_acknowledged_record(spark, tmp_path, failure):
    cluster, disks = _three_disks(spark, tmp_path)
    first = _produce(cluster, "a")
    advance_rounds(cluster, None, 3)
    assert all(_statuses(cluster)[(first, p)] == "acked" for p in range(3))
    before = _leaders(cluster)
    victim = 1
    led = [p for p, (leader, _) in before.items() if leader == victim]
    assert led, "broker 1 leads a partition"
    assert not os.path.exists(os.path.join(str(tmp_path / "meta"), "brokers", "1"))  # its log is on its own disk
    assert os.path.isdir(os.path.join(disks[victim], "log", "_delta_log"))

    location = tmp_path / f"disk{victim}"
    if failure == "deleted":
        shutil.rmtree(location)
    else:
        read_only(location, True)
    try:
        second = _produce(cluster, "b")
        advance_rounds(cluster, None, 1)  # the round halts the broker (and runs without it)
        halted = {r["broker"]: r for r in cluster.broker_states().collect()}[victim]
        assert halted["state"] == "stopped"
        assert f"the log of broker {victim} at {disks[victim]}" in halted["log_dir_failure"]
        assert ("is gone" if failure == "deleted" else "cannot be written") in halted["log_dir_failure"]
        _fail_over(cluster, victim)
        after = _leaders(cluster)
        for p in led:  # a leader from the partition's ISR, not the halted broker
            leader, isr = after[p]
            assert leader != victim and leader in before[p][1] and victim not in isr
        third = _produce(cluster, "c")
        advance_rounds(cluster, None, 3)
        statuses = _statuses(cluster)
        assert all(statuses[(req, p)] == "acked" for req in (first, third) for p in range(3))
        acked = {f"{tag}{i}" for tag, req in (("a", first), ("b", second), ("c", third))
                 for i in range(6) if statuses[(req, i % 3)] == "acked"}
        committed = _committed(cluster)
        values = [v for _, _, v in committed]
        assert acked <= set(values) and len(values) == len(set(values))  # every acknowledged record, once
        assert set(values) <= {f"{tag}{i}" for tag in "abc" for i in range(6)}
        assert spark.sql("SELECT count(*) FROM replog.committed").first()[0] == len(committed)
    finally:
        if failure == "unwritable":
            read_only(location, False)  # the location is back, with its log

    cluster.start_broker(victim)
    row = {r["broker"]: r for r in cluster.broker_states().collect()}[victim]
    assert row["log_dir_failure"] is None and row["log_lost"] == (failure == "deleted")
    advance_rounds(cluster, None, 4)
    leaders = _leaders(cluster)
    assert all(victim in isr for _, isr in leaders.values())  # back in every ISR
    for p, (leader, _) in leaders.items():
        mine = [r for r in _below_hw(cluster, victim) if r[0] == p]
        assert mine == [r for r in _below_hw(cluster, leader) if r[0] == p]  # same records, same offsets
    assert [r for r in _committed(cluster)] == committed


def test_each_broker_has_its_location_on_record_and_a_reopened_cluster_uses_it(spark, tmp_path):
    cluster, disks = _three_disks(spark, tmp_path)
    _produce(cluster, "a")
    advance_rounds(cluster, None, 3)
    locations = {r["broker"]: r["location"] for r in cluster.broker_states().collect()}
    assert locations == disks
    reopened = Cluster.open(spark, str(tmp_path / "meta"), clock=cluster.clock)
    assert {b: reopened.storage.log_path(b) for b in range(3)} == {b: os.path.join(d, "log") for b, d in disks.items()}
    assert _committed(reopened) == _committed(cluster)
    added = reopened.add_broker(dir=str(tmp_path / "disk3"))
    assert added == 3 and os.path.isdir(tmp_path / "disk3" / "log" / "_delta_log")
    assert {r["broker"]: r["location"] for r in reopened.broker_states().collect()}[3] == str(tmp_path / "disk3")
    default = reopened.add_broker()  # no location given: under the root
    assert reopened.storage.log_path(default) == os.path.join(str(tmp_path / "meta"), "brokers", "4", "log")


def test_a_location_given_as_a_file_uri(spark, tmp_path):
    uri = f"file://{tmp_path}/remote/b2"
    cluster = Cluster.create(spark, str(tmp_path / "meta"), brokers=3, clock=ManualClock(start_ms=START),
                             config={"broker.2.log.dirs": uri})
    cluster.create_topic("t", partitions=1, replication_factor=3)
    cluster.produce("t", [{"value": "x", "partition": 0}], acks="all")
    advance_rounds(cluster, None, 3)
    assert cluster.storage.log_path(2) == f"file:{tmp_path}/remote/b2/log"
    assert os.path.isdir(tmp_path / "remote" / "b2" / "log" / "_delta_log")
    assert [r["value"].decode() for r in cluster.read("t", replica=2).collect()] == ["x"]


def _refused(spark, root, code, *phrases, **create):
    with pytest.raises(ReplogError) as err:
        Cluster.create(spark, str(root), clock=ManualClock(start_ms=START), **create)
    assert err.value.code == code
    for phrase in phrases:
        assert phrase in str(err.value)
    assert not Storage(spark, str(root)).exists() and not os.path.exists(root)  # nothing written


def test_locations_two_brokers_would_share_are_refused_naming_both(spark, tmp_path):
    shared = str(tmp_path / "shared")
    _refused(spark, tmp_path / "c1", "INVALID_CONFIG", "brokers 0 and 2", "the same location", shared,
             broker_dirs={0: shared, 1: str(tmp_path / "x"), 2: shared})
    _refused(spark, tmp_path / "c2", "INVALID_CONFIG", "brokers 0 and 1", "one location inside the other",
             broker_dirs={0: shared, 1: os.path.join(shared, "inner")})
    # a location given that is another broker's default one
    _refused(spark, tmp_path / "c3", "INVALID_CONFIG", "brokers 0 and 1",
             broker_dirs={0: str(tmp_path / "c3" / "brokers" / "1")})
    _refused(spark, tmp_path / "c4", "INVALID_CONFIG", "inside the cluster's metadata",
             broker_dirs={0: str(tmp_path / "c4" / "cluster" / "b0")})
    _refused(spark, tmp_path / "c5", "INVALID_CONFIG", "brokers [5]", broker_dirs={5: str(tmp_path / "y")})
    _refused(spark, tmp_path / "c6", "INVALID_CONFIG", "one location per broker",
             config={"broker.0.log.dirs": f"{tmp_path}/a,{tmp_path}/b"})
    assert not any((tmp_path / d).exists() for d in ("shared", "x", "y"))


def test_a_location_holding_another_clusters_log_is_refused(spark, tmp_path):
    other, disks = _three_disks(spark, tmp_path)
    theirs = disks[1]
    _refused(spark, tmp_path / "mine", "INCONSISTENT_CLUSTER_ID", theirs, "the log of broker 1 of cluster",
             other.storage.cluster_id, broker_dirs={0: theirs})
    with pytest.raises(ReplogError) as err:
        other.add_broker(dir=disks[2])
    assert err.value.code == "INVALID_CONFIG" and "brokers 3 and 2" in str(err.value)
    assert sorted(r["broker"] for r in other.broker_states().collect()) == [0, 1, 2]


def test_a_log_replaced_by_another_clusters_halts_its_broker(spark, tmp_path):
    cluster, disks = _three_disks(spark, tmp_path)
    _produce(cluster, "a")
    advance_rounds(cluster, None, 3)
    stranger = Cluster.create(spark, str(tmp_path / "stranger"), brokers=1, clock=ManualClock(start_ms=START))
    shutil.rmtree(os.path.join(disks[2], "log"))
    shutil.copytree(stranger.storage.log_path(0), os.path.join(disks[2], "log"))
    advance_rounds(cluster, None, 1)
    row = {r["broker"]: r for r in cluster.broker_states().collect()}[2]
    assert row["state"] == "stopped"
    assert f"holds the log of broker 0 of cluster {stranger.storage.cluster_id}" in row["log_dir_failure"]
    # it still leads a partition until the controller fences it: an empty restart waits for that
    with pytest.raises(ReplogError, match="DUPLICATE_BROKER_REGISTRATION: broker 2 would restart with an empty log"):
        cluster.start_broker(2)
    assert not {r["broker"]: r for r in cluster.broker_states().collect()}[2]["log_lost"]  # (nothing written)
    advance_rounds(cluster, None, 1, step=10_000)  # past broker.session.timeout.ms: fenced, its leadership moved
    cluster.start_broker(2)  # restarts empty: the stranger's log is replaced
    assert {r["broker"]: r for r in cluster.broker_states().collect()}[2]["log_lost"]
    advance_rounds(cluster, None, 4)
    assert _below_hw(cluster, 2) == _committed(cluster)


def test_a_broker_whose_location_cannot_be_written_does_not_start(spark, tmp_path):
    cluster, disks = _three_disks(spark, tmp_path)
    advance_rounds(cluster, None, 1)
    location = tmp_path / "disk0"
    read_only(location, True)
    try:
        advance_rounds(cluster, None, 1)  # (an idle round writes no log: the broker is halted by the check of the next write)
        cluster.stop_broker(0)
        with pytest.raises(ReplogError) as err:
            cluster.start_broker(0)
        assert err.value.code == "KAFKA_STORAGE_ERROR" and "broker 0 cannot start" in str(err.value)
        assert {r["broker"]: r["state"] for r in cluster.broker_states().collect()}[0] == "stopped"
    finally:
        read_only(location, False)
    cluster.start_broker(0)
    assert {r["broker"]: r["state"] for r in cluster.broker_states().collect()}[0] == "starting"
