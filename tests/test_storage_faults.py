"""Bad storage: a lost cluster table, a broker log that is not a Delta table, has a foreign
schema or cannot be read, a write that fails mid-round (a full disk), a read-only log directory,
and two producers writing the inbox at once; and how a commit conflict with another writer is told
from other errors.
A lost cluster table fails with a clear error and writes nothing; a broker's failed log directory
halts that broker, as Kafka's does (tests/test_broker_dirs.py has the failure domains); after the
fault heals the cluster goes on with nothing lost or doubled."""

import os
import shutil
import threading

import pytest
from delta.exceptions import ConcurrentAppendException
from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock
from pipeline.errors import ReplogError
from pipeline.storage import is_concurrent_conflict
from tests.fs_faults import read_only, scratch_dir
from tests.helpers import advance_rounds

START = 1_700_000_000_000


def _values(cluster, broker):
    return sorted((r["partition"], r["offset"], r["value"].decode()) for r in
                  cluster.read("t", replica=broker, isolation="read_uncommitted").collect())


def _statuses(cluster):
    return {r["request_id"]: r["status"] for r in cluster.produce_results().collect()}


@pytest.fixture(scope="module")
def setup(spark, tmp_path_factory):
    clock = ManualClock(start_ms=START)
    root = str(tmp_path_factory.mktemp("faults") / "c")
    cluster = Cluster.create(spark, root, brokers=3, clock=clock, config={"min.insync.replicas": 2})
    cluster.create_topic("t", partitions=2, replication_factor=3)
    cluster.produce("t", [{"value": f"a{i}", "partition": i % 2} for i in range(4)], acks="all")
    advance_rounds(cluster, clock, 2)
    return cluster, clock


def test_a_lost_cluster_table_is_refused_at_open(spark, setup, tmp_path):
    cluster, clock = setup
    copy = tmp_path / "copy"
    shutil.copytree(cluster.storage.root, copy)
    shutil.rmtree(copy / "cluster" / "partitions")
    with pytest.raises(ReplogError, match="'partitions' table") as err:
        Cluster.open(spark, str(copy), clock=clock)
    assert err.value.code == "KAFKA_STORAGE_ERROR"
    assert not (copy / "cluster" / "partitions").exists()


@pytest.mark.parametrize("damage", ["not a delta table", "foreign schema", "unreadable log"])
def test_a_broken_log_of_a_running_broker_halts_it_and_the_round_goes_on(spark, setup, tmp_path, damage):
    """Kafka's failed log dir: the broker halts (stopped, its brokers row says why), the round runs
    without it, and start_broker restarts it empty, to refetch from the leaders."""
    cluster, clock = setup
    copy = tmp_path / "copy"
    shutil.copytree(cluster.storage.root, copy)
    other = Cluster.open(spark, str(copy), clock=ManualClock(start_ms=clock.now_ms()))
    committed = _values(other, 0)
    log = other.storage.log_path(1)
    shutil.rmtree(log)
    if damage == "not a delta table":
        (copy / "brokers" / "1" / "log").mkdir()
        (copy / "brokers" / "1" / "log" / "part-0.csv").write_text("topic,partition,offset\n")
    elif damage == "foreign schema":
        spark.createDataFrame([("x", 1)], "name string, size int").write.format("delta").save(log)
    else:  # a Delta log whose only commit is not JSON
        (copy / "brokers" / "1" / "log" / "_delta_log").mkdir(parents=True)
        (copy / "brokers" / "1" / "log" / "_delta_log" / f"{0:020d}.json").write_text("{not json\n")
    other.produce("t", [{"value": "b0", "partition": 0}], acks="all")
    rounds = other.storage.version("rounds")
    other.clock.advance(500)
    other.run_round()
    assert other.storage.version("rounds") > rounds  # the round ran
    row = {r["broker"]: r for r in other.broker_states().collect()}[1]
    assert row["state"] == "stopped"
    assert f"the log of broker 1 at {log} " + {"not a delta table": "is gone (not a Delta table)",
                                               "foreign schema": "has a foreign schema",
                                               "unreadable log": "cannot be read"}[damage] in row["log_dir_failure"]
    if damage != "not a delta table":
        return  # the remedy is the same for each; it runs once
    with pytest.raises(ReplogError, match="DUPLICATE_BROKER_REGISTRATION: broker 1 would restart with an empty log"):
        other.start_broker(1)  # (it still leads t-0: not fenced yet)
    advance_rounds(other, other.clock, 1, step=10_000)  # past broker.session.timeout.ms: fenced, t-0 moves
    other.start_broker(1)
    advance_rounds(other, other.clock, 3)
    assert _values(other, 1) == _values(other, 0) == sorted(committed + [(0, 2, "b0")])


def test_delete_records_on_a_leader_whose_location_failed(spark, setup, tmp_path):
    """Soak seed 9's history: a leader's location is removed, delete_records asks for its
    partition's HW, and the round halts the leader. The halted leader takes no log start (its log is
    gone: the round used to fail opening it); while it is down delete_records is refused
    (LEADER_NOT_AVAILABLE, nothing written); once the controller fences it, the new leader takes it,
    and the restarted broker refetches from the new log start."""
    cluster, clock = setup
    copy = tmp_path / "copy"
    shutil.copytree(cluster.storage.root, copy)
    other = Cluster.open(spark, str(copy), clock=ManualClock(start_ms=clock.now_ms()))

    def log_starts():
        return {r["broker"]: r["log_start_offset"] for r in other.storage.replica_state().collect()
                if r["topic"] == "t" and r["partition"] == 0}

    leader = other.describe("t").filter("partition = 0").first()["leader"]
    hw = other.describe("t").filter("partition = 0").first()["high_watermark"]
    assert hw == 2 and log_starts() == {0: 0, 1: 0, 2: 0}
    shutil.rmtree(other.storage.log_path(leader))
    assert other.delete_records("t", 0, -1) == 2  # asked while the leader still runs
    advance_rounds(other, other.clock, 1)         # the round halts it, and goes on
    assert {r["broker"]: r["state"] for r in other.broker_states().collect()}[leader] == "stopped"
    assert log_starts() == {0: 0, 1: 0, 2: 0}
    admin = other.storage.version("admin")
    with pytest.raises(ReplogError, match=f"LEADER_NOT_AVAILABLE: the leader of t-0, broker {leader}, is stopped"):
        other.delete_records("t", 0, -1)
    assert other.storage.version("admin") == admin
    advance_rounds(other, other.clock, 1, step=10_000)  # past broker.session.timeout.ms: fenced, t-0 moves
    new_leader = other.describe("t").filter("partition = 0").first()["leader"]
    assert new_leader != leader
    assert other.delete_records("t", 0, -1) == 2
    advance_rounds(other, other.clock, 2)
    assert log_starts() == {b: 0 if b == leader else 2 for b in range(3)}
    other.start_broker(leader)
    advance_rounds(other, other.clock, 3)
    assert log_starts() == {0: 2, 1: 2, 2: 2}
    assert _values(other, leader) == _values(other, new_leader) == [(1, 0, "a1"), (1, 1, "a3")]


def test_a_write_that_fails_mid_round_then_heals_loses_and_doubles_nothing(spark, setup, tmp_path):
    cluster, clock = setup
    copy = tmp_path / "copy"
    shutil.copytree(cluster.storage.root, copy)
    other = Cluster.open(spark, str(copy), clock=ManualClock(start_ms=clock.now_ms()))
    requests = [other.produce("t", [{"value": f"c{p}", "partition": p}], acks="all") for p in range(2)]
    commits = []

    def disk_full(path, step):
        commits.append(step)
        if len(commits) == 2:
            raise OSError(28, "No space left on device")

    other.storage.after_commit = disk_full
    with pytest.raises(OSError, match="No space left"):
        other.run_round()
    other.storage.after_commit = None  # the disk has room again
    advance_rounds(other, other.clock, 3)
    statuses = _statuses(other)
    assert [statuses[r] for r in requests] == ["acked", "acked"]
    expected = sorted(_values(cluster, 0) + [(0, 2, "c0"), (1, 2, "c1")])
    assert _values(other, 0) == _values(other, 1) == _values(other, 2) == expected


def test_two_producers_writing_the_inbox_at_once_lose_nothing(spark, setup, tmp_path):
    cluster, clock = setup
    copy = tmp_path / "copy"
    shutil.copytree(cluster.storage.root, copy)
    replicator = Cluster.open(spark, str(copy), clock=ManualClock(start_ms=clock.now_ms()))
    producers = [Cluster.open(spark, str(copy), clock=ManualClock(start_ms=clock.now_ms())) for _ in range(2)]
    sent, errors = [], []

    def produce(i, producer):
        try:
            for n in range(6):
                sent.append(producer.produce("t", [{"value": f"p{i}-{n}", "partition": n % 2}], acks=1))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(i, p)) for i, p in enumerate(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    advance_rounds(replicator, replicator.clock, 3)
    statuses = _statuses(replicator)
    assert len(sent) == 12 and all(statuses[r] == "acked" for r in sent)
    values = [v for _, _, v in _values(replicator, 0)]
    assert sorted(v for v in values if v.startswith("p")) == sorted(f"p{i}-{n}" for i in range(2) for n in range(6))
    assert replicator.storage.read("inbox").filter(F.col("value").cast("string").startswith("p")).count() == 12


def test_a_read_only_log_directory_halts_its_broker_losing_and_doubling_nothing(spark, setup, tmp_path):
    """A write the file system refuses mid-round (KAFKA_STORAGE_ERROR naming the broker's log)
    halts that broker; the round's commits so far are undone and it runs again without it. Once the
    directory can be written again, start_broker re-syncs it."""
    cluster, clock = setup
    copy = tmp_path / "copy"
    shutil.copytree(cluster.storage.root, copy)
    other = Cluster.open(spark, str(copy), clock=ManualClock(start_ms=clock.now_ms()))
    requests = [other.produce("t", [{"value": f"r{p}", "partition": p}], acks="all") for p in range(2)]
    log_dir = copy / "brokers" / "2" / "log"
    read_only(log_dir, True)
    try:
        probe = log_dir / "_delta_log" / "probe"
        with pytest.raises(OSError):
            probe.write_text("")  # the directory really is read-only to this process
        other.clock.advance(500)
        other.run_round()
        row = {r["broker"]: r for r in other.broker_states().collect()}[2]
        assert row["state"] == "stopped"
        assert row["log_dir_failure"].startswith(f"the log of broker 2 at {log_dir} cannot be written")
        other.clock.advance(9000)  # broker.session.timeout.ms: the controller fences it, and the ISR shrinks
        advance_rounds(other, other.clock, 3)
        statuses = _statuses(other)
        assert [statuses[r] for r in requests] == ["acked", "acked"]
    finally:
        read_only(log_dir, False)  # the fault heals
    other.start_broker(2)
    advance_rounds(other, other.clock, 3)
    expected = sorted(_values(cluster, 0) + [(0, 2, "r0"), (1, 2, "r1")])
    assert _values(other, 0) == _values(other, 1) == _values(other, 2) == expected


def _log(cluster, broker, topic):
    """(offset, value) of every record of `topic` in `broker`'s log as stored (strays included)."""
    return sorted((r["offset"], r["value"].decode()) for r in
                  cluster.storage.read_log(broker).filter(F.col("topic") == topic).collect())


def test_a_reassignment_off_a_broker_whose_location_failed_completes_and_its_strays_go_at_restart(
        spark, tmp_path):
    """Soak seed 12: moving a partition off a broker whose location cannot be written (halted, then
    fenced) completes, and the rounds go on; the controller leaves that broker's log alone while it
    is down. When it restarts, the round that unfences it removes the records of the replicas moved
    off it or back onto it meanwhile (Kafka's stray replicas), keeps those of the replica it still
    hosts, and the re-added replica refetches its partition once, with nothing doubled."""
    clock = ManualClock(start_ms=START)
    cluster = Cluster.create(spark, str(tmp_path / "c"), brokers=3, clock=clock)
    for topic in ("t", "k"):
        cluster.create_topic(topic, partitions=1, replication_factor=2)
    cluster.reassign_partitions({("t", 0): [2, 1], ("k", 0): [0, 2]})
    advance_rounds(cluster, clock, 3)
    cluster.produce("t", [{"value": "a", "partition": 0}], acks="all")
    cluster.produce("k", [{"value": "x", "partition": 0}], acks="all")
    advance_rounds(cluster, clock, 3)
    location = cluster.storage.broker_root(2)
    read_only(location, True)
    try:
        cluster.produce("t", [{"value": "b", "partition": 0}], acks=1)
        advance_rounds(cluster, clock, 2)  # broker 2 (t's leader) cannot append: halted
        clock.advance(10_000)  # broker.session.timeout.ms: fenced, t's leader becomes 1
        advance_rounds(cluster, clock, 2)
        assert {r["broker"]: r["state"] for r in cluster.broker_states().collect()}[2] == "fenced"
        cluster.reassign_partitions({("t", 0): [1, 0]})  # off the failed broker
        advance_rounds(cluster, clock, 4)
        parts = {r["topic"]: r for r in cluster.describe().collect()}
        assert list(parts["t"]["replicas"]) == [1, 0] and parts["t"]["leader"] == 1
        cluster.produce("t", [{"value": "c", "partition": 0}], acks="all")
        advance_rounds(cluster, clock, 2)
        assert _log(cluster, 2, "t") == [(0, "a")]  # left alone while down
        cluster.reassign_partitions({("t", 0): [1, 0, 2]})  # back onto it, still down
        advance_rounds(cluster, clock, 2)
    finally:
        read_only(location, False)  # the fault heals
    cluster.start_broker(2)
    advance_rounds(cluster, clock, 6)
    # ("b" was never appended: its leader could not write it)
    assert _log(cluster, 2, "t") == _log(cluster, 1, "t") == _log(cluster, 0, "t") == [(0, "a"), (1, "c")]
    assert _log(cluster, 2, "k") == _log(cluster, 0, "k") == [(0, "x")]
    parts = {r["topic"]: r for r in cluster.describe().collect()}
    assert sorted(parts["t"]["isr"]) == [0, 1, 2]


@pytest.mark.parametrize("error, conflict", [
    # delta-spark's Python class for Delta's conflict (what spark.sql raises)
    (ConcurrentAppendException("Files were added"), True),
    # a Py4J error from DeltaTable's API carries the Java class's name in its text
    (RuntimeError("An error occurred while calling o9.execute.\n: io.delta.exceptions.ConcurrentTransactionException:"
                  " This error occurs when multiple streaming queries ..."), True),
    (RuntimeError(": io.delta.exceptions.MetadataChangedException: The metadata of the Delta table has been changed"),
     True),
    # Java's own ConcurrentModificationException is a bug, not another writer: it is raised
    (RuntimeError(": java.util.ConcurrentModificationException"), False),
    (RuntimeError("[DELTA_MISSING_DELTA_TABLE] not a Delta table"), False),
])
def test_a_commit_conflict_with_another_writer_is_told_from_other_errors(error, conflict):
    assert is_concurrent_conflict(error) is conflict


def test_a_scratch_directory_left_read_only_by_a_fault_is_still_removed():
    """A soak that fails while a broker's location refuses writes leaves it read-only (for root,
    immutable): its scratch directory is made writable again and removed, not left behind."""
    with scratch_dir("soak-test-") as root:
        location = os.path.join(root, "cluster-disks", "2", "log")
        os.makedirs(location)
        open(os.path.join(location, "part-0.parquet"), "w").close()
        read_only(os.path.join(root, "cluster-disks", "2"), True)
        with pytest.raises(OSError):
            open(os.path.join(location, "part-1.parquet"), "w").close()
    assert not os.path.exists(root)
