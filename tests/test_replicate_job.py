"""jobs/replicate.py run the way users run it: spark-submit in its own process."""

import io
import os
import re
import signal
import time
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import Cluster
from pipeline.config import CLUSTER_KEYS
from jobs.replicate import parse_interval_ms, read_properties, run_available_now

REPO = Path(__file__).resolve().parent.parent
SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")


def job_env():
    """This process's environment without the variables that tie pyspark to this test's own JVM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_GATEWAY", "SPARK_"))}
    return {**env, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}


def submit(*args, timeout=600):
    env = job_env()
    return subprocess.run([SPARK_SUBMIT, "--master", "local[2]", "--properties-file", "conf/spark-defaults.conf",
                           str(REPO / "jobs" / "replicate.py"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def test_shipped_properties_hold_every_key_with_kafkas_default():
    values = read_properties(str(REPO / "conf" / "replog.properties"))
    assert set(values) == set(CLUSTER_KEYS)
    for name, key in CLUSTER_KEYS.items():
        expected = str(key.default).lower() if key.kind is bool else str(key.default)
        assert values[name] == expected, name


def test_trigger_intervals():
    assert [parse_interval_ms(t) for t in ("500ms", "2s", "1min", "750")] == [500, 2000, 60000, 750]


class _Killed(Exception):
    pass


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_available_now_after_a_replayed_round_reads_the_requests_produced_since(spark, tmp_path):
    """Found by the kill test: a round that replays an interrupted one reads the inbox only as far as
    that round did, and commits all of it in the round; --available-now must not stop there while
    newer requests wait unread."""
    from pipeline import ManualClock

    root = str(tmp_path / "cluster")
    clock = ManualClock(start_ms=1_700_000_000_000)
    cluster = Cluster.create(spark, root, brokers=3, clock=clock)
    cluster.create_topic("t", partitions=2, replication_factor=3, config={"min.insync.replicas": "2"})
    first = cluster.produce("t", [{"value": f"a{i}", "partition": i % 2} for i in range(4)], acks="all")

    def die(path, step):
        if "/brokers/" in path:
            raise _Killed(path)

    cluster.storage.after_commit = die  # the process dies once the round's first log commit landed
    clock.advance(500)
    with pytest.raises(_Killed):
        cluster.run_round()
    second = cluster.produce("t", [{"value": f"b{i}", "partition": i % 2} for i in range(4)], acks="all")

    job = Cluster.open(spark, root, clock=clock)
    terminal = _Terminal()  # on a terminal, a live progress bar in place of a log line per round
    assert run_available_now(job, max_stalled=5, stream=terminal) == 2  # the replay, then the round reading `second`
    lines = terminal.getvalue().split("\r\033[K")
    assert lines[0] == "" and len(lines) == 3 and lines[2].endswith("\n") and "\n" not in lines[1]
    assert lines[2].startswith("[####################] round 2 (2): 0 requests and 0 partitions left, 4 answered")
    statuses = {(r["request_id"], r["status"]) for r in job.produce_results().collect()}
    assert statuses == {(first, "acked"), (second, "acked")}
    assert sorted(bytes(r["value"]).decode() for r in job.read("t").collect()) == sorted(
        [f"a{i}" for i in range(4)] + [f"b{i}" for i in range(4)])


@pytest.mark.integration
def test_available_now_commits_what_another_process_produced(spark, tmp_path):
    root = str(tmp_path / "cluster")
    cluster = Cluster.create(spark, root, brokers=3)
    cluster.create_topic("jobs", partitions=2, replication_factor=3, config={"min.insync.replicas": "2"})
    request = cluster.produce("jobs", [{"key": f"k{i}", "value": f"v{i}"} for i in range(20)], acks="all")

    # the whole file applies: the shipped defaults, with two keys changed
    values = {**read_properties(str(REPO / "conf" / "replog.properties")), "replica.lag.time.max.ms": "20000",
              "max.incremental.fetch.session.cache.slots": "500"}
    conf = tmp_path / "replog.properties"
    conf.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    done = submit("--root", root, "--conf-file", str(conf), "--available-now")

    assert done.returncode == 0, done.stderr[-3000:]
    assert "applied max.incremental.fetch.session.cache.slots=500, replica.lag.time.max.ms=20000" in (
        done.stdout + done.stderr)
    settings = Cluster.open(spark, root).describe_configs("brokers")
    assert (settings["replica.lag.time.max.ms"], settings["max.incremental.fetch.session.cache.slots"]) == (20000, 500)
    # spark-submit passes the Python process's stderr on through its own stdout
    # one round appends, replicates and commits (the followers' follow-up fetches move the HW)
    assert "available-now: 1 round\n" in done.stdout + done.stderr
    assert cluster.read("jobs").count() == 20
    status = {r["status"] for r in cluster.produce_results().filter(f"request_id = '{request}'").collect()}
    assert status == {"acked"}


@pytest.mark.integration
def test_without_the_delta_jars_spark_submit_says_what_to_pass(tmp_path):
    env = job_env()
    done = subprocess.run([SPARK_SUBMIT, "--master", "local[1]", str(REPO / "jobs" / "replicate.py"),
                           "--root", str(tmp_path), "--available-now"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode == 1
    lines = (done.stdout + done.stderr).splitlines()
    assert any(line.startswith("replicate: The Delta Lake classes are not on Spark's classpath") for line in lines)


@pytest.mark.integration
def test_bad_configuration_names_the_key_and_writes_nothing(spark, tmp_path):
    root = str(tmp_path / "cluster")
    Cluster.create(spark, root, brokers=1)
    rounds_log = Path(root) / "cluster" / "rounds" / "_delta_log"
    before = sorted(os.listdir(rounds_log))
    conf = tmp_path / "bad.properties"
    conf.write_text("# fetchers must be positive (KAFKA-19645)\nnum.replica.fetchers=0\n")

    done = submit("--root", root, "--conf-file", str(conf), "--available-now", timeout=120)

    assert done.returncode == 2
    out = done.stdout + done.stderr
    assert "INVALID_CONFIG" in out and "num.replica.fetchers" in out
    assert sorted(os.listdir(rounds_log)) == before

    # the brokers' locations are the cluster's: a file that places broker 0 elsewhere is refused
    conf.write_text(f"broker.0.log.dirs={tmp_path / 'elsewhere'}\n")
    done = submit("--root", root, "--conf-file", str(conf), "--available-now", timeout=180)
    assert done.returncode == 2
    out = done.stdout + done.stderr
    assert "INVALID_CONFIG" in out and "brokers [0]" in out and f"{root}/brokers/0" in out
    assert sorted(os.listdir(rounds_log)) == before


@pytest.mark.integration
def test_streaming_job_replicates_until_sigterm_then_resumes_from_its_checkpoint(spark, tmp_path):
    root = str(tmp_path / "cluster")
    cluster = Cluster.create(spark, root, brokers=3)
    cluster.create_topic("live", partitions=2, replication_factor=3)
    checkpoint = tmp_path / "checkpoint"
    job_log = tmp_path / "job.log"

    def run_until_committed(expected, *extra, while_running=None, to_the_jvm=False):
        job_log.write_text("")
        job = subprocess.Popen([SPARK_SUBMIT, "--master", "local[2]", "--properties-file", "conf/spark-defaults.conf",
                                str(REPO / "jobs" / "replicate.py"), "--root", root, "--trigger-interval", "1s",
                                "--checkpoint", str(checkpoint), *extra],
                               stdout=job_log.open("w"), stderr=subprocess.STDOUT, env=job_env(), cwd=REPO)
        try:
            deadline = time.monotonic() + 300
            while cluster.read("live").count() < expected:
                assert job.poll() is None, job_log.read_text()[-3000:]
                assert time.monotonic() < deadline, "not committed within 300 s"
                time.sleep(2)
            if while_running:
                while_running()
            # the job's Python process (spark-submit's JVM runs it as a child; its pid is in the log)
            # or the JVM itself (what a scheduler signals): either stops after the round in progress
            driver = int(re.search(r"SIGTERM to pid (\d+)", job_log.read_text()).group(1))
            os.kill(job.pid if to_the_jvm else driver, signal.SIGTERM)
            job.wait(timeout=120)
            out = job_log.read_text()
        finally:
            if job.poll() is None:
                job.kill()
        assert job.returncode == 0, out[-3000:]
        assert "stopping after the current round" in out
        return out

    port = _free_port()
    scraped = {}

    def scrape():  # Prometheus' view of the running job (pipeline/metrics_export.py)
        import urllib.request
        from prometheus_client.parser import text_string_to_metric_families
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120) as response:
            text = response.read().decode()
        scraped.update({(s.name, s.labels.get("broker"), s.labels.get("partition")): s.value
                        for family in text_string_to_metric_families(text) for s in family.samples})

    pages = []

    def spark_ui():  # the job keeps Spark's UI on, at the address it logs
        import urllib.request
        url = re.search(r"Spark UI at (\S+)", job_log.read_text()).group(1)
        with urllib.request.urlopen(f"{url}/jobs/", timeout=60) as response:
            pages.append(response.status)

    def observed():  # the round's figures in Structured Streaming's progress (the replog-rounds query)
        deadline = time.monotonic() + 120
        while not re.search(r"replog-rounds batch \d+ observed: rounds 1, round_id \d+, records_appended 10, "
                            r"records_replicated 20, hw_advances 2,", job_log.read_text()):
            assert time.monotonic() < deadline, job_log.read_text()[-3000:]
            time.sleep(1)
        scrape()

    cluster.produce("live", [{"value": f"a{i}", "partition": i % 2} for i in range(10)], acks="all")
    first = [int(b) for b in re.findall(r"batch (\d+): round", run_until_committed(
        10, "--metrics-port", str(port), while_running=observed))]
    assert sum(scraped[("replog_partition_high_watermark", None, p)] for p in ("0", "1")) == 10
    assert [scraped[("kafka_server_replicamanager_leadercount", b, None)] for b in "012"] == [1, 1, 0]
    assert [scraped[("kafka_server_replicamanager_underreplicatedpartitions", b, None)] for b in "012"] == [0, 0, 0]
    assert scraped[("replog_round_id", None, None)] >= 1
    cluster.produce("live", [{"value": f"b{i}"} for i in range(10)], acks="all")
    second_log = run_until_committed(20, while_running=spark_ui, to_the_jvm=True)
    second = [int(b) for b in re.findall(r"batch (\d+): round", second_log)]
    assert "signal 15: stopping after the current round" in second_log and pages == [200]

    assert first and second and min(second) > max(first)  # resumed from the checkpoint
    rounds = [r["round_id"] for r in cluster.rounds().orderBy("round_id").collect()]
    assert rounds == list(range(1, len(rounds) + 1))  # every round once, none repeated
    assert sorted(bytes(r["value"]).decode() for r in cluster.read("live").collect()) == sorted(
        [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)])


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _newest_tag(table_dir: Path) -> dict:
    """The userMetadata fields of a Delta table's newest commit, read from its log file."""
    from pipeline.storage import parse_tag
    import json
    commits = sorted(p for p in (table_dir / "_delta_log").glob("*.json"))
    for line in commits[-1].read_text().splitlines() if commits else []:
        if line.startswith('{"commitInfo"'):
            return parse_tag(json.loads(line)["commitInfo"].get("userMetadata"))
    return {}


def _round_in_flight(root: Path, brokers: int) -> int | None:
    """The round whose commits have reached a broker's log while its rounds row has not (None: no
    such round now)."""
    done = int(_newest_tag(root / "cluster" / "rounds").get("replog-round", 0))
    for b in range(brokers):
        tag = _newest_tag(root / "brokers" / str(b) / "log")
        if "replog-round" in tag and int(tag["replog-round"]) > done:
            return int(tag["replog-round"])
    return None


@pytest.mark.integration
def test_a_job_killed_mid_round_loses_and_duplicates_nothing_after_restart(spark, tmp_path):
    """SIGKILL to the whole job (JVM and Python) while a round's commits are landing: the restarted
    job undoes them, replays the round, and every acked record is there once, at its offset, on
    every replica."""
    from pipeline.storage import RECOVERY_APP_ID
    root = tmp_path / "cluster"
    # rounds on this shared machine can take longer than replica.lag.time.max.ms (30 s): a wider
    # window keeps lag out of a test about crashes
    cluster = Cluster.create(spark, str(root), brokers=3, config={"replica.lag.time.max.ms": 600_000})
    cluster.create_topic("crash", partitions=3, replication_factor=3, config={"min.insync.replicas": "2"})
    values = []

    def produce(batch):
        records = [{"value": f"{batch}-{i}", "partition": i % 3} for i in range(30)]
        values.extend(r["value"] for r in records)
        return cluster.produce("crash", records, acks="all")

    requests = [produce(0)]
    job_log = tmp_path / "job.log"
    job = subprocess.Popen([SPARK_SUBMIT, "--master", "local[2]", "--properties-file", "conf/spark-defaults.conf",
                            str(REPO / "jobs" / "replicate.py"), "--root", str(root), "--trigger-interval", "500ms"],
                           stdout=job_log.open("w"), stderr=subprocess.STDOUT, env=job_env(), cwd=REPO,
                           start_new_session=True)
    killed_in = None
    try:
        deadline, next_produce = time.monotonic() + 400, time.monotonic() + 3
        while killed_in is None:
            assert job.poll() is None, job_log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no round caught mid-write within 400 s"
            if time.monotonic() > next_produce and len(requests) < 40:
                requests.append(produce(len(requests)))
                next_produce = time.monotonic() + 3
            if (round_id := _round_in_flight(root, 3)) is not None and round_id >= 3:
                os.killpg(job.pid, signal.SIGKILL)
                killed_in = round_id
            time.sleep(0.01)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=60)
    assert _round_in_flight(root, 3) == killed_in  # the kill left the round half-written
    acked_before = {(r["request_id"], r["partition"]): (r["base_offset"], r["last_offset"])
                    for r in cluster.produce_results().filter("status = 'acked'").collect()}

    done = submit("--root", str(root), "--available-now")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]

    storage = cluster.storage
    rounds = [r["round_id"] for r in cluster.rounds().orderBy("round_id").collect()]
    assert rounds == list(range(1, len(rounds) + 1))
    recovered = [storage.commit_info(storage.log_path(b), v) for b in range(3)
                 for v in range(storage.table_version(storage.log_path(b)) + 1)]
    assert any((c or {}).get("userMetadata", "").startswith(f"{RECOVERY_APP_ID}={killed_in}") for c in recovered)
    # every request acked, at the offsets acked before the kill; its records there, once, on every replica
    results = cluster.produce_results().collect()
    unacked = set(requests) - {r["request_id"] for r in results if r["status"] == "acked"}
    assert not unacked, ([r.asDict() for r in results if r["request_id"] in unacked],
                         (done.stdout + done.stderr)[-3000:], job_log.read_text()[-3000:])
    assert {r["request_id"] for r in results} == set(requests)
    assert {r["status"] for r in results} == {"acked"}
    offsets = {(r["request_id"], r["partition"]): (r["base_offset"], r["last_offset"]) for r in results}
    assert acked_before and {k: offsets[k] for k in acked_before} == acked_before
    hw = {r["partition"]: r["high_watermark"] for r in cluster.describe("crash").collect()}
    logs = {b: sorted((r["partition"], r["offset"], bytes(r["value"]).decode())
                      for r in storage.read_log(b).collect()) for b in range(3)}
    for b in range(3):
        assert len({(p, o) for p, o, _ in logs[b]}) == len(logs[b])  # no offset twice
        assert [x for x in logs[b] if x[1] < hw[x[0]]] == [x for x in logs[0] if x[1] < hw[x[0]]]
    assert sorted(v for _, _, v in logs[0]) == sorted(values) and sum(hw.values()) == len(values)
    by_offset = {(p, o): v for p, o, v in logs[0]}
    for (request, partition), (base, last) in offsets.items():
        batch = requests.index(request)
        assert [by_offset[(partition, o)] for o in range(base, last + 1)] == \
            [f"{batch}-{i}" for i in range(30) if i % 3 == partition]


@pytest.mark.integration
def test_a_second_job_on_one_root_is_refused_and_a_job_another_writer_fenced_exits_3(spark, tmp_path):
    """Two jobs on one root: the second is refused at start (REPLICATION_JOB_RUNNING, naming the
    first's pid) and writes nothing. A writer that runs rounds through the API takes the lease
    over; the job's next round fails with FENCED_INSTANCE_ID and the job exits 3."""
    root = tmp_path / "cluster"
    cluster = Cluster.create(spark, str(root), brokers=1)
    cluster.create_topic("t", partitions=1, replication_factor=1)
    job_log = tmp_path / "job.log"
    first = subprocess.Popen([SPARK_SUBMIT, "--master", "local[2]", "--properties-file", "conf/spark-defaults.conf",
                              str(REPO / "jobs" / "replicate.py"), "--root", str(root), "--trigger-interval", "1s"],
                             stdout=job_log.open("w"), stderr=subprocess.STDOUT, env=job_env(), cwd=REPO)
    try:
        deadline = time.monotonic() + 300
        while not re.search(r"batch \d+: round", job_log.read_text()):
            assert first.poll() is None, job_log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the first job ran no round within 300 s"
            time.sleep(1)
        driver = re.search(r"SIGTERM to pid (\d+)", job_log.read_text()).group(1)
        versions = {t: cluster.storage.version(t) for t in ("rounds", "lease", "replica_state")}
        rounds_before = cluster.rounds().count()

        second = submit("--root", str(root), "--available-now", timeout=300)
        said = second.stdout + second.stderr
        assert second.returncode == 1, said[-3000:]
        assert "REPLICATION_JOB_RUNNING" in said and f"pid {driver} " in said
        assert cluster.storage.version("lease") == versions["lease"]  # the second took nothing over
        assert first.poll() is None  # and the first goes on

        writer = Cluster.open(spark, str(root))
        request = writer.produce("t", [{"value": "v"}], acks=1)
        writer.run_round()  # takes the replication lease over, and appends the request
        first.wait(timeout=120)
        out = job_log.read_text()
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 3, out[-3000:]
    assert "replicate: round failed: FENCED_INSTANCE_ID" in out
    assert writer.rounds().count() > rounds_before
    assert writer.produce_results().filter(f"request_id = '{request}'").first()["status"] == "acked"
