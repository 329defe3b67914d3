"""A short fixed-seed run of the fault-injection soak (tests/soak/: `make soak` runs long ones),
and proof that its checker catches what it checks for."""

import subprocess

import pytest
from pyspark.sql import functions as F

from tests.soak import job as job_process
from tests.soak.checker import Violation
from tests.soak.soak import Soak


@pytest.fixture(scope="module")
def soaked(spark, tmp_path_factory):
    return Soak(spark, str(tmp_path_factory.mktemp("soak") / "c"), seed=11).run(events=30)


def test_a_short_soak_keeps_every_guarantee(soaked):
    assert soaked.rounds >= 8
    assert soaked.expected.requests  # traffic was produced, and every request settled (checked in run)


def test_the_checker_reads_the_tables_again_only_after_a_commit_to_one(spark, soaked, monkeypatch):
    """A snapshot with no commit to a table it reads since the last one's reads began is the last
    one, read again it would be the same; a round, or a commit to a broker's log, makes the next
    one read, and it holds what was committed. `fresh` always reads."""
    checker, cluster = soaked.checker, soaked.cluster
    reads = []
    read = checker._read_snapshot
    monkeypatch.setattr(checker, "_read_snapshot", lambda: reads.append(1) or read())
    without_round = lambda snap: {k: v for k, v in snap.items() if k != "round"}  # noqa: E731

    first = checker.snapshot(fresh=True)
    assert (checker.snapshot(), len(reads)) == (first, 1)
    assert checker.snapshot(fresh=True) == first and len(reads) == 2
    cluster.run_round()
    assert without_round(checker.snapshot()) == without_round(checker.snapshot(fresh=True))

    leader = first["partitions"][("clean", 0)]["leader"]
    log = cluster.storage.log_path(leader)
    probe = (spark.read.format("delta").load(log).filter((F.col("topic") == "clean") & (F.col("partition") == 0))
             .limit(1).withColumn("topic", F.lit("checker-probe")))
    probe.write.format("delta").mode("append").save(log)
    before = len(reads)
    assert ("checker-probe", 0, leader) in checker.snapshot()["logs"] and len(reads) == before + 1
    spark.sql(f"DELETE FROM delta.`{log}` WHERE topic = 'checker-probe'")
    assert ("checker-probe", 0, leader) not in checker.check()["logs"] and len(reads) == before + 2


def test_the_checker_catches_a_lost_acknowledged_record_and_a_duplicate_offset(spark, soaked):
    cluster, checker = soaked.cluster, soaked.checker
    snap = checker.check()

    def held(rid, records):  # an acked record the leader still holds (delete_records may have removed it)
        result = snap["results"].get((rid, "clean", records[0][0]), {})
        leader = snap["partitions"][("clean", records[0][0])]["leader"]
        return result.get("status") == "acked" and any(
            offset == result["base_offset"] for offset, _, _ in snap["logs"][("clean", records[0][0], leader)])

    acked = next((rid, records) for rid, (topic, acks, records) in soaked.expected.requests.items()
                 if topic == "clean" and acks == -1 and held(rid, records))
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


def test_a_time_boxed_soak_runs_the_events_drawn_before_the_box_closes_then_heals(spark, tmp_path, monkeypatch):
    """CI's soak (`--minutes`): no event starts once the box has closed; what ran heals and is
    checked, and the seed's first events_run events are the history."""
    from types import SimpleNamespace
    import tests.soak.soak as soak_module
    ticks = iter(range(1000))
    monkeypatch.setattr(soak_module, "time", SimpleNamespace(monotonic=lambda: next(ticks)))
    boxed = Soak(spark, str(tmp_path / "c"), seed=11).run(events=30, deadline=4)
    assert boxed.events_run == 4 and boxed.expected.requests  # seed 11 produces from its first events


def test_the_soak_command_starts_no_seed_once_its_minutes_are_up(capsys):
    from tests.soak.run import main
    assert main(["--seed", "5", "--seeds", "2", "--events", "10", "--minutes", "0"]) == 0
    assert capsys.readouterr().out == "the time box (0 min) has closed: seeds 5-6 not run\n"


def test_a_failing_seed_ends_its_output_with_its_events_and_its_violation(capsys):
    import json

    from tests.soak.run import _repeat_violation
    v = Violation("acked_lost", "seed 9: [acked_lost] offset 3 of t-0 is gone\nhistory:\n1: round\n2: round")
    v.events, v.during_heal = [["round", {}], ["produce", {"topic": "t"}]], True
    _repeat_violation(9, v)
    events, last = capsys.readouterr().out.splitlines()
    assert json.loads(events.removeprefix("seed 9: events ")) == v.events
    assert last == "seed 9: VIOLATION during heal: [acked_lost] seed 9: [acked_lost] offset 3 of t-0 is gone"


def test_an_errored_idempotent_batch_keeps_its_sequences_seed_104(spark, tmp_path):
    """Seed 104 of 300 events failed [acked]: an acks=all idempotent batch appended, then answered
    with an error (its round came 35 s after the produce, the followers had fallen out of the ISR;
    here their fetchers are paused, since a round judges the ISR after its fetches), and the soak sent new values under the same producer epoch and sequences. The leader answered
    that batch as a duplicate of the one it held, at the first batch's offset, as Kafka's leader
    does: duplicates are found by epoch and sequences, not by contents. The soak's producer was
    wrong, so now an errored batch is retried as it was, or the producer bumps its epoch and
    starts at sequence 0 (KIP-360)."""
    soak = Soak(spark, str(tmp_path / "c"), seed=104)
    first = {"partition": 0, "values": ["a", "b"], "base": 0, "kind": "batch", "epoch": 0}
    leader = soak.cluster.describe("clean").filter("partition = 0").first()["leader"]
    followers = [b for b in range(3) if b != leader]
    soak.replay([["idempotent", first], *[["pause", {"broker": b}] for b in followers], ["wait", {"ms": 35_000}]],
                heal=False)
    rid = soak.producers[0]["last"][0]
    assert soak._status(rid) == {"error"}
    snap = soak.checker.check()
    leader = snap["partitions"][("clean", 0)]["leader"]
    held = (spark.read.format("delta").load(soak.cluster.storage.log_path(leader))
            .filter("topic = 'clean' AND partition = 0").orderBy("offset")
            .select("offset", F.col("value").cast("string").alias("value")).collect())
    assert [(r["offset"], r["value"]) for r in held] == [(0, "a"), (1, "b")]  # appended before the error

    drawn = {(d["kind"], d["base"], d["epoch"], tuple(d["values"]) == ("a", "b"))
             for d in (soak.draw_idempotent() for _ in range(40)) if d["partition"] == 0}
    assert drawn == {("retry", 0, 0, True), ("batch", 0, 1, False)}

    # both answers a producer may give keep every guarantee
    soak.replay([*[["resume", {"broker": b}] for b in followers],
                 ["idempotent", {**first, "kind": "retry"}], "round", "round",
                 ["idempotent", {"partition": 0, "values": ["c"], "base": 0, "kind": "batch", "epoch": 1}],
                 "round", "round"], heal=False)
    # and a batch like the old soak's is caught: new values under epoch 1, sequence 0 are answered
    # as the duplicate of "c" (offset 2), which the checker reports as an acked record not held
    with pytest.raises(Violation, match=r"\[acked\].*'z' at clean-0 offset 2; the leader \d holds 'c'"):
        soak.replay([["idempotent", {"partition": 0, "values": ["z"], "base": 0, "kind": "batch", "epoch": 1}],
                     "round", "round"], heal=False)


def test_the_checker_reads_the_isr_before_a_round_it_did_not_see(spark, tmp_path):
    """An election in a round another process ran (the job's, between two of the soak's checks) is
    judged against the ISR before that round, read from the partitions table's history."""
    soak = Soak(spark, str(tmp_path / "c"), seed=3)
    soak.replay([["pause", {"broker": 2}], ["produce", {"topic": "clean", "acks": 1, "records": [[0, "a"]]}],
                 "round", ["wait", {"ms": 35_000}]], heal=False)
    shrunk = soak.rounds  # the wait's round took broker 2, behind the leader's LEO, out of clean-0's ISR
    assert sorted(soak.checker.isr_before_round(shrunk)[("clean", 0)]) == [0, 1, 2]
    after = soak.checker.isr_before_round(shrunk + 1)
    assert sorted(after[("clean", 0)]) == [0, 1] and sorted(after[("clean", 1)]) == [0, 1, 2]


@pytest.mark.parametrize("how", ["delete", "unwritable"])
def test_a_running_brokers_location_fails_mid_soak(spark, tmp_path, how):
    """The soak's fail_location event: a running broker's whole location (outside the root) is
    deleted or made read-only under traffic; a round halts the broker, the controller moves its
    leaderships after the session timeout, the checker holds every guarantee throughout, and after
    start (the location back; a deleted one empty) every request settles."""
    soak = Soak(spark, str(tmp_path / "c"), seed=5)
    assert soak.cluster.storage.broker_root(1) == f"{tmp_path}/c-disks/1"
    produce = ["produce", {"topic": "clean", "acks": "all", "records": [[0, "a"], [1, "b"], [2, "c"]]}]
    soak.replay([produce, "round", ["fail_location", {"broker": 1, "how": how}],
                 ["produce", {"topic": "clean", "acks": "all", "records": [[0, "d"], [1, "e"], [2, "f"]]}],
                 "round", "round"], heal=False)
    assert soak.stopped == {1} and soak.failing == {} and soak.lost == ({1} if how == "delete" else set())
    halted = {r["broker"]: r for r in soak.cluster.core.metadata.broker_rows()}[1]
    assert halted["state"] == "stopped" and halted["log_dir_failure"]
    soak.replay([["wait", {"ms": 10_000}],
                 ["produce", {"topic": "clean", "acks": "all", "records": [[0, "g"], [1, "h"], [2, "i"]]}],
                 "round", "round", ["start", {"broker": 1}], "round", "round"])
    assert soak.stopped == set() and soak.unwritable == set()
    statuses = {r["status"] for r in soak.cluster.produce_results().collect()}
    assert statuses <= {"acked", "error"} and "acked" in statuses


def test_an_empty_log_restarts_only_once_its_old_incarnation_is_fenced_seed_600367(spark, tmp_path):
    """Seed 600367 (CI): the clock stepped back, so the rounds' time stood still and the controller
    never fenced a leader whose location had been deleted; its restart recreated an empty log in
    place of the leader's, and the HW of a clean partition went from 5 to 0. Kafka's controller
    refuses a new incarnation's registration while the old one's session is valid, so the start is
    refused (DUPLICATE_BROKER_REGISTRATION, nothing written) until a round has fenced the old one."""
    soak = Soak(spark, str(tmp_path / "c"), seed=5)
    soak.replay([["produce", {"topic": "clean", "acks": "all", "records": [[0, "a"], [1, "b"], [2, "c"]]}], "round",
                 ["clock_back", {"ms": 30_000}], ["fail_location", {"broker": 1, "how": "delete"}], "round",
                 ["start", {"broker": 1}], "round"], heal=False)
    assert soak.stopped == {1} and any("start broker 1 refused: DUPLICATE_BROKER_REGISTRATION" in line
                                       for line in soak.history), soak.history
    led = {r["partition"]: r["leader"] for r in soak.cluster.describe("clean").collect()}
    assert 1 in led.values()  # (the rounds' time stood still: not fenced, it still leads)
    soak.heal()  # rounds a session timeout apart fence it; then it starts empty and catches up
    assert soak.stopped == set() and any("waits for its fencing" in line for line in soak.history)
    assert [r["value"] for r in soak.cluster.read("clean").orderBy("partition").collect()] == [b"a", b"b", b"c"]


@pytest.mark.integration
def test_the_job_killed_by_sigkill_while_two_processes_produce(spark, tmp_path):
    """The soak's kill_job event: jobs/replicate.py under spark-submit runs rounds while two
    `replog produce` processes write the inbox, and is killed with SIGKILL once a round of it is
    caught committing; a new process's round undoes and replays it. Every guarantee holds (checked
    after every round of the soak's), and every request, the other processes' too, settles."""
    soak = Soak(spark, str(tmp_path / "c"), seed=5)
    soak.replay([["produce", {"topic": "clean", "acks": "all", "records": [[0, "a"], [1, "b"]]}], "round",
                 ["kill_job", {"after_rounds": 2, "producers": [
                     {"topic": "clean", "partition": 2, "acks": "all", "values": ["c1", "c2"]},
                     {"topic": "unclean", "partition": 1, "acks": 1, "values": ["d1"]}]}],
                 ["produce", {"topic": "clean", "acks": "all", "records": [[2, "e"]]}], "round"])
    killed = next(line for line in soak.history if "SIGKILL" in line)
    assert "SIGKILL while round" in killed, soak.history
    results = {(r["request_id"], r["partition"]): r for r in soak.cluster.produce_results().collect()}
    cli = [rid for rid, (_, _, records) in soak.expected.requests.items() if records[0][1] in ("c1", "d1")]
    assert len(cli) == 2 and all(results[(rid, soak.expected.requests[rid][2][0][0])]["status"] == "acked"
                                 for rid in cli)
    clean2 = [bytes(r["value"]).decode() for r in soak.cluster.read("clean", partition=2).orderBy("offset").collect()]
    assert clean2 == ["c1", "c2", "e"]
    recovered = [soak.cluster.storage.commit_info(soak.cluster.storage.log_path(b), v) for b in range(3)
                 for v in range(soak.cluster.storage.table_version(soak.cluster.storage.log_path(b)) + 1)]
    assert any((c or {}).get("userMetadata", "").startswith("replog-recovery=") for c in recovered)


def test_the_wait_for_the_job_lasts_while_its_log_grows_and_ends_once_it_stands_still(tmp_path):
    """Seed 169 of 300 events stopped [job] on a loaded machine: the job's first round halted a
    broker whose location had failed and took longer than a fixed 300 s wait. The wait now follows
    the job's work (its log growing), and still ends for a job whose log stands still. Real
    processes stand in for the job: a shell loop that writes its log, and a sleep that writes none."""
    log, done = tmp_path / "job.log", tmp_path / "done"

    def job(script: str) -> job_process.Job:
        standin = object.__new__(job_process.Job)
        standin.root, standin.log = str(tmp_path), str(log)
        standin.process = subprocess.Popen(["bash", "-c", script], start_new_session=True)
        return standin

    log.write_text("")
    working = job(f"for i in $(seq 40); do echo line $i >> {log}; sleep 0.2; done; touch {done}; sleep 60")
    try:  # it works for 8 s, four times the idle allowance, and is waited for
        assert job_process.wait_until(done.exists, 120, working, "done", idle=2)
    finally:
        working.kill()
    idle = job("sleep 60")
    try:
        assert job_process.wait_until(done.with_name("never").exists, 120, idle, "never", idle=2) is None
        assert idle.alive()  # it ended for the log standing still, not for the process
    finally:
        idle.kill()


def test_a_reassignment_off_a_broker_whose_location_failed_seed_12(spark, tmp_path):
    """Seed 12 of 300 events failed [exception LogDirFailure] at event 227: broker 2's location
    refused writes, a round halted it and the controller fenced it; then a reassignment moved a
    partition off it, and the round that completed it emptied the dropped replica's log on the
    failed disk, in every round after too. The history that shows it, cut by hand to the events
    that matter, and a move back onto the broker while it is still down: the rounds go on, and the
    heal (the location writable again, broker 2 restarted) ends with every guarantee checked,
    broker 2's copy of the partition held once."""
    soak = Soak(spark, str(tmp_path / "c"), seed=12)
    soak.replay([
        ["produce", {"topic": "clean", "acks": "all", "records": [[1, "a"], [1, "b"]]}], "round", "round",
        ["fail_location", {"broker": 2, "how": "unwritable"}],
        ["produce", {"topic": "clean", "acks": 1, "records": [[1, "c"]]}], "round", "round",
        ["wait", {"ms": 10_000}], "round",  # broker.session.timeout.ms: broker 2 is fenced
        ["reassign", {"topic": "clean", "partition": 1, "target": [1, 0]}], "round", "round", "round",
        ["produce", {"topic": "clean", "acks": "all", "records": [[1, "d"]]}], "round",
        ["reassign", {"topic": "clean", "partition": 1, "target": [1, 0, 2]}], "round", "round",
    ])
    assert soak.cluster.describe("clean").filter("partition = 1").first()["replicas"] == [1, 0, 2]
    logs = soak.checker.check()["logs"]
    held = {b: sorted((offset, value) for offset, _, value in logs[("clean", 1, b)]) for b in (0, 1, 2)}
    assert held[2] == held[1] == held[0] and [v for _, v in held[1]][:2] == ["a", "b"]


def test_two_retries_of_an_appended_idempotent_batch_in_a_crashed_round_seed_18(spark, tmp_path):
    """Seed 18 of 300 events failed [acked] at event 226: clean-2's idempotent batch was appended,
    then two retries of it reached the inbox before one round, which was killed after its sixth
    commit and replayed; the second retry was acked with base offset -1, so the checker looked for
    its records at offset 0. The history that shows it, cut by hand (this round makes three
    commits, so it is killed after its second): both retries are acked with the batch's offsets,
    and every guarantee holds."""
    soak = Soak(spark, str(tmp_path / "c"), seed=18)
    batch = {"partition": 2, "values": ["b", "c"], "base": 0, "epoch": 0}
    soak.replay([
        ["produce", {"topic": "clean", "acks": 1, "records": [[2, "a"]]}],
        ["idempotent", {**batch, "kind": "batch"}], "round", "round",
        ["idempotent", {**batch, "kind": "retry"}], ["idempotent", {**batch, "kind": "retry"}],
        ["crash_round", {"after_commit": 2}], "round", "round",
    ])
    snap = soak.checker.check()
    retries = [rid for rid, (topic, acks, records) in soak.expected.requests.items() if records[0][1] == "b"]
    assert len(retries) == 3
    assert [(snap["results"][(rid, "clean", 2)]["status"], snap["results"][(rid, "clean", 2)]["base_offset"])
            for rid in retries] == [("acked", 1)] * 3
