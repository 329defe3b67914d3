"""Crash-safe rounds: a round killed after any of its commits, then run again, leaves exactly the
tables of one clean run of it (storage/recovery.py). The round under test commits to every table a round
writes: two brokers' logs (leader and follower appends), partitions (broker 2 fenced: ISR shrinks
and an election), elections, replica_state, producers (an idempotent producer), results (acks=1
and acks=all acked: the follower's follow-up fetch moves the HW) and its rounds row. A copy of the
same root runs it cleanly; each crashed copy must end equal to it, row for row, after the next
round too (no ack lost, no offset twice)."""

import shutil

import pytest
from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock
from pipeline.errors import ReplogError
from pipeline.storage.recovery import Replay, last_complete_round, recover
from pipeline.storage import TXN_APP_ID, Storage, parse_tag

START = 1_700_000_000_000
TABLES = ("partitions", "replica_state", "elections", "producers", "results", "brokers")


class Crash(Exception):
    """Stands for the process dying right after a commit."""


def crash_after(storage, k=None, table=None):
    """Makes the round raise right after its k-th commit, or right after its commit to `table`.
    A round commits its appends at once (Storage.append_all): the ones already under way when it
    raises land too, as they could when a process dies."""
    done = []

    def hook(path, step):
        done.append((path, step))
        if len(done) == k or (table is not None and path.endswith(f"/{table}")):
            raise Crash(f"after commit {len(done)}: {path} ({step})")

    storage.after_commit = hook
    return done


def snapshot(cluster):
    """Every table a round writes, as sorted rows (the rounds rows without their duration)."""
    storage = cluster.storage
    tables = {t: storage.read(t) for t in TABLES}
    tables["rounds"] = storage.read("rounds").drop("duration_ms")
    tables.update({f"log{b}": storage.read_log(b) for b in cluster.brokers})
    return {name: df.orderBy(*df.columns).collect() for name, df in tables.items()}


def round_commits(storage, path, round_id):
    """The versions of the table at `path` committed by round `round_id`."""
    history = storage.spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version", "userMetadata").collect()
    return sorted(r["version"] for r in history
                  if parse_tag(r["userMetadata"]).get(TXN_APP_ID) == str(round_id))


@pytest.fixture(scope="module")
def prepared(spark, tmp_path_factory):
    """A root just before the round under test: 3 brokers, topic t (3 partitions, RF 3, min ISR 2),
    committed data, broker 2 stopped past its session timeout, new produce requests waiting."""
    base = tmp_path_factory.mktemp("crash") / "base"
    clock = ManualClock(start_ms=START)
    cluster = Cluster.create(spark, str(base), brokers=3, clock=clock, config={"min.insync.replicas": 2})
    cluster.create_topic("t", partitions=3, replication_factor=3)
    cluster.produce("t", [{"value": f"a{p}", "partition": p} for p in range(3)], acks="all")
    for _ in range(3):
        clock.advance(500)
        cluster.run_round()
    cluster.stop_broker(2)
    clock.advance(10_000)  # past broker.session.timeout.ms (9000): the next round fences broker 2
    cluster.produce("t", [{"value": f"b{p}", "partition": p} for p in range(3)], acks="all")
    cluster.produce("t", [{"value": "c", "partition": 0}], acks=1)
    cluster.produce("t", [{"value": f"i{s}", "partition": 1, "producer_id": 7, "producer_epoch": 0, "sequence": s}
                          for s in range(2)], acks="all")
    return str(base), clock.now_ms(), cluster.core.round_id + 1


def run_clean(spark, root, now):
    cluster = Cluster.open(spark, root, clock=ManualClock(start_ms=now))
    cluster.run_round()
    return cluster


def finish(cluster, now):
    """The round after the one under test (acks the acks=all requests), at a fixed time."""
    cluster.clock = ManualClock(start_ms=now + 500)
    cluster.run_round()
    return snapshot(cluster)


@pytest.fixture(scope="module")
def clean(spark, prepared, tmp_path_factory):
    base, now, round_id = prepared
    root = str(tmp_path_factory.mktemp("clean") / "root")
    shutil.copytree(base, root)
    cluster = run_clean(spark, root, now)
    storage = cluster.storage
    paths = [storage.path(t) for t in ("partitions", "elections", "replica_state", "producers", "results", "rounds")]
    paths += [storage.log_path(b) for b in cluster.brokers]
    commits = sum(len(round_commits(storage, p, round_id)) for p in paths)
    after_round = snapshot(cluster)
    return {"after_round": after_round, "final": finish(cluster, now), "commits": commits, "cluster": cluster}


def test_the_round_under_test_writes_every_table(clean, prepared):
    _, _, round_id = prepared
    after = clean["after_round"]
    assert clean["commits"] == 8  # logs of brokers 0 and 1, partitions, elections, state, producers, results, rounds
    assert [r["round_id"] for r in after["elections"]] == [round_id]  # partition 2: leader 2 -> 0
    assert {r["round_id"] for r in after["producers"]} == {round_id}
    statuses = {(r["request_id"], r["partition"]): r["status"] for r in after["results"] if r["round_id"] == round_id}
    assert set(statuses.values()) == {"acked"} and len(statuses) == 5  # 3 acks=all b, c, the producer's
    assert clean["final"]["results"] == after["results"]  # nothing left for the next round to answer


@pytest.mark.parametrize("k,table", [(1, None), (5, None), (None, "replica_state")],
                         ids=["after-the-isr-commit", "after-the-log-commits", "after-the-last-wave"])
def test_a_round_killed_after_commit_k_and_run_again_equals_a_clean_run(spark, prepared, clean, tmp_path, k, table):
    base, now, round_id = prepared
    root = str(tmp_path / "root")
    shutil.copytree(base, root)
    crashed = Cluster.open(spark, root, clock=ManualClock(start_ms=now))
    done = crash_after(crashed.storage, k, table)
    with pytest.raises(Crash):
        crashed.run_round()
    # the ISR change commits first, alone; then the logs, elections and producers at once; then the
    # state (the HW), the results and the rounds row at once
    assert done[0][0].endswith("/partitions")
    assert len(done) == k if k is not None else any(path.endswith(f"/{table}") for path, _ in done)
    if k == 5:  # the logs landed, the HW that covers their records did not
        assert not any(path.endswith(("/replica_state", "/results", "/rounds")) for path, _ in done)
    newest = crashed.storage.read("rounds").agg({"round_id": "max"}).first()[0]
    if table is not None:  # the process died after its last wave, which landed whole: the round is complete
        assert {path.rsplit("/", 1)[1] for path, _ in done} >= {"replica_state", "results", "rounds"}
        assert last_complete_round(crashed.storage, newest)[0] == round_id
        again = Cluster.open(spark, root, clock=ManualClock(start_ms=now + 3_000))
        got = snapshot(again)
        # (broker 2's new state, fenced, is written after the round: the next round fences it again)
        assert [r["state"] for r in got.pop("brokers")] == ["stopped" if b == 2 else "running" for b in range(3)]
        assert got == {t: rows for t, rows in clean["after_round"].items() if t != "brokers"}
        assert finish(again, now) == clean["final"]
        return
    assert last_complete_round(crashed.storage, newest)[0] == round_id - 1

    # a new process, later: it undoes the landed commits and replays the round at its own time
    again = Cluster.open(spark, root, clock=ManualClock(start_ms=now + 3_000))
    report = again.run_round()
    assert (report.round_id, report.now_ms) == (round_id, now)
    assert snapshot(again) == clean["after_round"]


@pytest.mark.parametrize("lost", ["replica_state", "rounds"])
def test_a_last_wave_that_landed_in_part_is_undone_and_replayed(spark, prepared, clean, tmp_path, lost):
    """The last wave commits replica_state, results and the rounds row at once: a process that dies
    in it can leave the row without the HW's rows, or the HW's rows and the results without the
    row. The row's commit names the tables it was written with, so the next process finds the
    round incomplete either way, undoes what landed and replays it."""
    base, now, round_id = prepared
    root = str(tmp_path / "root")
    shutil.copytree(base, root)
    crashed = Cluster.open(spark, root, clock=ManualClock(start_ms=now))
    storage, append = crashed.storage, crashed.storage.append

    def append_but_one(df, path, round_id=None, step="", written_with=()):
        if path.endswith(f"/{lost}"):
            raise Crash(f"before the commit to {path}")
        append(df, path, round_id, step, written_with)

    storage.append = append_but_one
    with pytest.raises(Crash):
        crashed.run_round()
    assert round_commits(storage, storage.path("results"), round_id)  # the results landed
    assert bool(round_commits(storage, storage.path("rounds"), round_id)) == (lost != "rounds")
    assert bool(round_commits(storage, storage.path("replica_state"), round_id)) == (lost != "replica_state")
    newest = storage.read("rounds").agg({"round_id": "max"}).first()[0]
    assert last_complete_round(storage, newest)[0] == round_id - 1
    # another process (creating a topic, say) takes the round before it as the last one
    assert Cluster.open(spark, root, clock=ManualClock(start_ms=now)).core.round_id == round_id - 1

    again = Cluster.open(spark, root, clock=ManualClock(start_ms=now + 3_000))
    report = again.run_round()
    assert (report.round_id, report.now_ms) == (round_id, now)
    assert snapshot(again) == clean["after_round"]
    assert finish(again, now) == clean["final"]


def test_a_replay_after_an_active_round_keeps_that_rounds_id_and_appends_nothing_twice(spark, prepared, tmp_path):
    """Soak seed 10: the round before the interrupted one was active, so its rounds row names
    replica_state and results; the interrupted round's commits to them landed (not its row) and
    recovery put both back. The last complete round is still the one before (its commits stand
    under the recovery's), so the replay runs under the interrupted round's id and inputs: it
    used to be taken for incomplete, and the replay ran under its id, appending its records again."""
    base, now, round_id = prepared
    before = str(tmp_path / "before")
    shutil.copytree(base, before)
    first = Cluster.open(spark, before, clock=ManualClock(start_ms=now))
    assert first.run_round().records_appended > 0  # the round under test of the others: active here
    first.produce("t", [{"value": "d", "partition": 0}], acks=1)
    roots = {name: str(tmp_path / name) for name in ("clean", "crashed")}
    for root in roots.values():
        shutil.copytree(before, root)
    clean_cluster = Cluster.open(spark, roots["clean"], clock=ManualClock(start_ms=now + 500))
    assert clean_cluster.run_round().round_id == round_id + 1

    crashed = Cluster.open(spark, roots["crashed"], clock=ManualClock(start_ms=now + 500))
    storage, append = crashed.storage, crashed.storage.append

    def append_but_the_rounds_row(df, path, round_id=None, step="", written_with=()):
        if path.endswith("/rounds"):
            raise Crash(f"before the commit to {path}")
        append(df, path, round_id, step, written_with)

    storage.append = append_but_the_rounds_row
    with pytest.raises(Crash):
        crashed.run_round()
    assert round_commits(storage, storage.path("replica_state"), round_id + 1)  # landed; the row did not
    newest_row = storage.commit_info(storage.path("rounds"), storage.table_version(storage.path("rounds")))
    assert parse_tag(newest_row["userMetadata"])[TXN_APP_ID] == str(round_id)
    assert parse_tag(newest_row["userMetadata"])["with"] == "replica_state,results"  # the active round's row

    again = Cluster.open(spark, roots["crashed"], clock=ManualClock(start_ms=now + 3_000))
    report = again.run_round()
    assert (report.round_id, report.now_ms, report.records_appended) == (round_id + 1, now + 500, 1)
    assert snapshot(again) == snapshot(clean_cluster)


def test_the_same_process_recovers_on_its_next_round_and_keeps_another_writers_topic(spark, prepared, tmp_path):
    """After a failed round the same Cluster object undoes it before its next round; a topic another
    process created in between (a commit after the round's, so no RESTORE) survives."""
    base, now, round_id = prepared
    roots = {name: str(tmp_path / name) for name in ("clean", "crashed")}
    for root in roots.values():
        shutil.copytree(base, root)
    clean_cluster = Cluster.open(spark, roots["clean"], clock=ManualClock(start_ms=now))
    Cluster.open(spark, roots["clean"], clock=ManualClock(start_ms=now)).create_topic("u", 2, 2)
    clean_cluster.run_round()

    crashed = Cluster.open(spark, roots["crashed"], clock=ManualClock(start_ms=now))
    append = crashed.storage.append

    def append_but_the_rounds_row(df, path, round_id=None, step="", written_with=()):
        if path.endswith("/rounds"):
            raise Crash(f"before the commit to {path}")
        append(df, path, round_id, step, written_with)

    crashed.storage.append = append_but_the_rounds_row  # partitions, replica_state and the others land
    with pytest.raises(Crash):
        crashed.run_round()
    crashed.storage.append = append
    Cluster.open(spark, roots["crashed"], clock=ManualClock(start_ms=now)).create_topic("u", 2, 2)
    report = crashed.run_round()
    assert report.round_id == round_id
    got, want = snapshot(crashed), snapshot(clean_cluster)
    assert got == want
    assert sorted(r["topic"] for r in crashed.topics().collect()) == ["t", "u"]


def test_the_round_after_a_replay_reads_what_was_produced_after_the_interrupted_round(spark, tmp_path):
    """Found by the job kill test: the replay reads the inbox and the admin requests only as far as
    the interrupted round did, so the next round must read the rest even though nothing new arrives
    after the replay (it is not an idle round)."""
    root = str(tmp_path / "root")
    clock = ManualClock(start_ms=START)
    cluster = Cluster.create(spark, root, brokers=3, clock=clock, config={"min.insync.replicas": 2})
    cluster.create_topic("t", partitions=2, replication_factor=3)
    cluster.produce("t", [{"value": f"a{p}", "partition": p} for p in range(2)], acks="all")
    for _ in range(2):  # the fetch sessions exist: the round after the replay is an incremental one
        clock.advance(500)
        cluster.run_round()
    cluster.produce("t", [{"value": f"b{p}", "partition": p} for p in range(2)], acks="all")
    clock.advance(500)
    crash_after(cluster.storage, k=2)  # the ISR is unchanged: the first commits are the logs
    with pytest.raises(Crash):
        cluster.run_round()
    late = cluster.produce("t", [{"value": "late", "partition": 0}], acks=1)
    cluster.delete_records("t", 1, 1)

    again = Cluster.open(spark, root, clock=ManualClock(start_ms=clock.now_ms() + 3_000))
    replayed = again.run_round()
    assert replayed.round_id == 3 and replayed.requests_acked == 2
    assert replayed.inbox_version < again.storage.version("inbox") and not again.caught_up(replayed)
    again.clock.advance(500)
    after = again.run_round()
    assert (after.records_appended, after.inbox_version) == (1, again.storage.version("inbox"))
    assert again.caught_up(after)
    assert [r["status"] for r in again.produce_results().filter(F.col("request_id") == late).collect()] == ["acked"]
    assert {r["partition"]: r["log_start_offset"] for r in again.describe("t").collect()} == {0: 0, 1: 1}


# -- recovery on bare tables (recovery.recover: what it finds in a table's history) ---------------

def log_rows(spark, offsets):
    return spark.createDataFrame([("t", 0, o, 0, 0, None, b"v", None, None, None) for o in offsets],
                                 "topic string, partition int, offset long, leader_epoch int, timestamp long, "
                                 "key binary, value binary, producer_id long, producer_epoch int, sequence int")


def offsets(storage):
    return sorted(r["offset"] for r in storage.read_log(0).collect())


@pytest.fixture
def one_log(spark, tmp_path):
    """Broker 0's log: round 1 (complete) wrote offsets 0-1, round 2 (interrupted) 2-3."""
    storage = Storage(spark, str(tmp_path / "root"))
    storage.create_log(0)
    storage.append(log_rows(spark, [0, 1]), storage.log_path(0), 1)
    storage.round_inputs = "now=1234;inbox=7;admin=3;restarted=0"
    storage.append(log_rows(spark, [2, 3]), storage.log_path(0), 2)
    return storage


def test_recover_restores_a_log_and_returns_the_rounds_inputs(one_log):
    assert recover(one_log, [0], last_round=1) == Replay(2, 1234, 7, 3, False)
    assert offsets(one_log) == [0, 1]
    assert recover(one_log, [0], last_round=1) is None  # the recovery commit ends the scan
    assert recover(one_log, [0], last_round=2) is None  # nothing after a complete round


def test_recover_refuses_a_log_another_writer_committed_to_and_writes_nothing(spark, one_log):
    one_log.append(log_rows(spark, [9]), one_log.log_path(0))  # by hand, untagged
    version = one_log.table_version(one_log.log_path(0))
    with pytest.raises(ReplogError) as error:
        recover(one_log, [0], last_round=1)
    assert error.value.code == "KAFKA_STORAGE_ERROR"
    assert "another writer after round 2's (versions [2])" in str(error.value)
    assert one_log.table_version(one_log.log_path(0)) == version and offsets(one_log) == [0, 1, 2, 3, 9]
