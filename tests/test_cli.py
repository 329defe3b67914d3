"""The `replog` console script, driven as a subprocess the way an operator types it."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_replicate_job import job_env

REPLOG = str(Path(sys.executable).parent / "replog")

pytestmark = pytest.mark.integration


def replog(*args, stdin=None, root=None, java_options=None):
    env = job_env()
    env.pop("REPLOG_ROOT", None)
    if root is not None:
        env["REPLOG_ROOT"] = root
    if java_options is not None:
        env["JAVA_TOOL_OPTIONS"] = java_options  # every JVM the command starts
    return subprocess.run([REPLOG, *args], input=stdin, capture_output=True, text=True, timeout=300, env=env)


def last_line(done):
    return done.stderr.strip().splitlines()[-1]


def test_an_operator_session(tmp_path):
    root = str(tmp_path / "cluster")
    created = replog("cluster", "--create", "--brokers", "3", "--root", root)
    assert created.returncode == 0, created.stderr[-2000:]
    # quiet by default: the JVM's, log4j's and Hadoop's lines are hidden, --verbose shows them
    assert created.stdout == f"Created a cluster of 3 brokers at {root}.\n" and created.stderr == ""

    topic = replog("topics", "--create", "--topic", "orders", "--partitions", "2", "--replication-factor", "3",
                   "--config", "min.insync.replicas=2", root=root)  # --root from $REPLOG_ROOT
    assert topic.returncode == 0 and "Created topic orders." in topic.stdout

    sent = replog("produce", "--topic", "orders", "--acks", "all", "--key-separator", ":",
                  stdin="k1:first\nk2:second\nthird\n", root=root)
    assert sent.returncode == 0 and sent.stdout.startswith("Sent 3 records to orders (acks=all)")

    ran = replog("run", "--until-committed", root=root)
    assert ran.returncode == 0 and ran.stdout.startswith("Committed: nothing pending after ")
    progress = ran.stderr.count("[####################] round ")  # one progress line per round
    # the round that appends commits (the followers' follow-up fetches move the HW)
    assert progress == 1 and "after 1 round." in ran.stdout

    described = replog("topics", "--describe", "--topic", "orders", root=root).stdout.splitlines()
    assert described[0] == "Topic: orders\tPartitionCount: 2\tReplicationFactor: 3\tConfigs: min.insync.replicas=2"
    assert [line.split("\t")[1:6] for line in described[1:]] == [
        ["Topic: orders", "Partition: 0", "Leader: 0", "Replicas: 0,1,2", "Isr: 0,1,2"],
        ["Topic: orders", "Partition: 1", "Leader: 1", "Replicas: 1,2,0", "Isr: 1,2,0"]]
    assert sum(int(line.split("HighWatermark: ")[1].split("\t")[0]) for line in described[1:]) == 3

    healthy = replog("topics", "--describe", "--under-replicated-partitions", root=root)
    assert healthy.returncode == 0 and healthy.stdout == "" and healthy.stderr == ""
    loud = replog("topics", "--describe", "--under-replicated-partitions", "--verbose", root=root)
    assert loud.returncode == 0 and loud.stdout == "" and "log4j" in loud.stderr

    consumed = replog("consume", "--topic", "orders", "--from-beginning", "--print-key", root=root)
    assert sorted(consumed.stdout.splitlines()) == ["k1\tfirst", "k2\tsecond", "null\tthird"]

    # the driver JVM loads its classes from the class-data-sharing archive `make setup` wrote (the
    # archive on top of Java's own: "top"); each JVM the command starts logs to a file of its own
    listed = replog("topics", "--list", root=root,
                    java_options=f"-Xlog:class+load=info:file={tmp_path}/classes-%p.log")
    assert listed.returncode == 0 and listed.stdout == "orders\n", listed.stderr[-2000:]
    from_archive = [sum("source: shared objects file (top)" in line for line in log.open())
                    for log in tmp_path.glob("classes-*.log")]
    assert max(from_archive) > 5000, from_archive
    brokers = [line.split() for line in replog("brokers", root=root).stdout.splitlines()]
    assert brokers == [["BROKER", "STATE", "FETCHER", "LEADERS", "LOCATION", "LOG-DIR-FAILURE"]] + [
        [str(b), "running", "running", str(n), f"{root}/brokers/{b}", "-"] for b, n in ((0, 1), (1, 1), (2, 0))]

    # each leader caches one privileged session per follower, opened by the round's full requests
    # (the epoch expected next: 1) and used once more by the follow-up fetches of the followers of a
    # partition that took records (2): both followers of a leader's one partition alike
    sessions = [line.split() for line in replog("sessions", root=root).stdout.splitlines()]
    assert sessions[0] == ["LEADER", "FETCHER", "TYPE", "SESSION-ID", "EPOCH", "PARTITIONS", "CREATED-MS",
                           "LAST-USED-MS"]
    assert [(s[0], s[1], s[2], s[5]) for s in sessions[1:]] == [
        ("0", "replica-1", "follower", "1"), ("0", "replica-2", "follower", "1"),
        ("1", "replica-0", "follower", "1"), ("1", "replica-2", "follower", "1")]
    epochs = {(s[0], s[1]): int(s[4]) for s in sessions[1:]}
    assert all(int(s[3]) != 0 for s in sessions[1:]) and set(epochs.values()) <= {1, 2} and 2 in epochs.values()
    assert epochs[("0", "replica-1")] == epochs[("0", "replica-2")] and \
        epochs[("1", "replica-0")] == epochs[("1", "replica-2")]

    # kafka-consumer-groups: a dry run commits nothing; --execute does
    dry = replog("consumer-groups", "--reset-offsets", "--group", "billing", "--topic", "orders", "--to-offset", "1",
                 root=root)
    assert dry.stdout.splitlines() == ["GROUP   TOPIC  PARTITION NEW-OFFSET", "billing orders 0         1",
                                       "billing orders 1         1"] and "dry run" in dry.stderr
    assert replog("consumer-groups", "--list", root=root).stdout == ""
    reset = replog("consumer-groups", "--reset-offsets", "--group", "billing", "--topic", "orders", "--to-offset", "1",
                   "--execute", root=root)
    assert reset.returncode == 0, reset.stderr[-2000:]
    assert replog("consumer-groups", "--list", root=root).stdout == "billing\n"
    lag = [line.split() for line in replog("consumer-groups", "--describe", "--group", "billing",
                                                 root=root).stdout.splitlines()]
    assert lag[0] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"]
    assert [(r[2], r[3]) for r in lag[1:]] == [("0", "1"), ("1", "1")]
    hws = [int(line.split("HighWatermark: ")[1].split("\t")[0]) for line in described[1:]]
    assert [(int(r[4]), int(r[5])) for r in lag[1:]] == [(hw, max(hw - 1, 0)) for hw in hws]

    # Delta table maintenance by hand: the rounds' small files compacted, nothing read changes
    maintained = replog("maintain", root=root)
    assert maintained.returncode == 0, maintained.stderr[-2000:]
    summary = next(line for line in maintained.stdout.splitlines() if line.startswith("Maintained "))
    assert summary.startswith("Maintained 22 tables and logs: compacted ")  # (Delta's VACUUM prints lines too)
    assert summary.endswith("retention set on 20.")  # every table but the inbox and admin
    after = replog("consume", "--topic", "orders", "--from-beginning", "--print-key", root=root)
    assert sorted(after.stdout.splitlines()) == ["k1\tfirst", "k2\tsecond", "null\tthird"]

    again = replog("topics", "--create", "--topic", "orders", "--partitions", "1", root=root)
    assert again.returncode == 1
    assert last_line(again) == "replog: TOPIC_ALREADY_EXISTS: topic 'orders' already exists"

    # --partition: every line to one partition (kcat's -p), whatever the partitioner would pick
    one = replog("produce", "--topic", "orders", "--partition", "0", "--acks", "1", stdin="p1\np2\np3\n", root=root)
    assert one.returncode == 0 and one.stdout.startswith("Sent 3 records to orders (acks=1)")
    assert replog("run", "--until-committed", root=root).returncode == 0
    partition0 = replog("consume", "--topic", "orders", "--partition", "0", "--from-beginning", root=root)
    assert partition0.stdout.splitlines()[-3:] == ["p1", "p2", "p3"], partition0.stderr[-2000:]


def test_errors_are_one_line_and_exit_non_zero(tmp_path):
    missing = replog("topics", "--list", "--root", str(tmp_path / "nothing"))
    assert missing.returncode == 1
    assert last_line(missing).startswith("replog: CLUSTER_NOT_FOUND: ")

    bad_args = replog("run", "--root", str(tmp_path))  # neither --rounds nor --until-committed
    assert bad_args.returncode == 2

    no_root = replog("brokers", root=None)
    assert no_root.returncode == 2 and "--root is required" in no_root.stderr

    # a replication job holds the root (its lock, not a real job: refused before Spark starts)
    from pipeline.storage.job_lock import hold_job_lock
    (tmp_path / "cluster" / "cluster" / "_delta_log").mkdir(parents=True)  # looks like a cluster to the CLI
    held = hold_job_lock(str(tmp_path))
    try:
        second = replog("run", "--until-committed", "--root", str(tmp_path))
        maintain = replog("maintain", "--root", str(tmp_path))
    finally:
        held.close()
    assert second.returncode == 1
    assert last_line(second).startswith("replog: REPLICATION_JOB_RUNNING: a replication job already runs on ")
    assert maintain.returncode == 1 and last_line(maintain).startswith("replog: REPLICATION_JOB_RUNNING: ")


def test_reassigning_with_kafkas_json_file_and_adding_a_broker(tmp_path):
    root = str(tmp_path / "cluster")
    assert replog("cluster", "--create", "--brokers", "2", "--root", root).returncode == 0
    assert replog("topics", "--create", "--topic", "t", "--replication-factor", "2", root=root).returncode == 0
    assert replog("produce", "--topic", "t", "--acks", "all", stdin="a\nb\n", root=root).returncode == 0
    added = replog("brokers", "--add", root=root)
    assert added.returncode == 0 and added.stdout == "Added broker 2.\n"
    plan = tmp_path / "move.json"
    plan.write_text('{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2, 1], "log_dirs": ["any", "any"]}]}')
    started = replog("reassign", "--json", str(plan), "--execute", root=root)
    assert started.returncode == 0 and "Started the reassignment of 1 partitions" in started.stdout
    assert replog("run", "--rounds", "6", root=root).returncode == 0
    verified = replog("reassign", "--json", str(plan), "--verify", root=root)
    assert verified.stdout.splitlines()[1] == "Reassignment of partition t-0 is completed."
    described = replog("topics", "--describe", "--topic", "t", root=root).stdout.splitlines()[1].split("\t")
    # the leader (broker 0) left: the target's first ISR member leads
    assert described[3:6] == ["Leader: 2", "Replicas: 2,1", "Isr: 2,1"], described
    consumed = replog("consume", "--topic", "t", "--from-beginning", "--replica", "2", root=root)
    assert consumed.stdout.splitlines() == ["a", "b"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"partitions": [{"topic": "t", "partition": 0}]}')
    refused = replog("reassign", "--json", str(bad), "--execute", root=root)
    assert refused.returncode == 1 and last_line(refused).startswith("replog: INVALID_REPLICA_ASSIGNMENT: ")
    altered = replog("configs", "--alter", "--entity-type", "topics", "--entity-name", "t",
                     "--add-config", "retention.ms=60000,cleanup.policy=[compact,delete]", root=root)
    assert altered.returncode == 0 and altered.stdout == "Completed updating config for topic t.\n"
    shown = replog("configs", "--describe", "--entity-type", "topics", "--entity-name", "t", root=root)
    assert shown.stdout.splitlines() == ["Dynamic configs for topic t are:", "  cleanup.policy=compact,delete",
                                         "  retention.ms=60000"]
    # client quotas (kafka-configs --entity-type users|clients): a (user, client-id) entity and a
    # default; a producer with a client id
    quota = replog("configs", "--alter", "--entity-type", "users", "--entity-name", "alice", "--entity-type",
                   "clients", "--entity-default", "--add-config", "producer_byte_rate=1024,consumer_byte_rate=2048",
                   root=root)
    assert quota.returncode == 0 and quota.stdout == "Completed updating config for user alice, client-id <default>.\n"
    described = replog("configs", "--describe", "--entity-type", "users", "--entity-name", "alice", "--entity-type",
                       "clients", "--entity-default", root=root)
    assert described.stdout == ("Quota configs for user alice, client-id <default> are consumer_byte_rate=2048, "
                                "producer_byte_rate=1024\n")
    wrong = replog("configs", "--alter", "--entity-type", "clients", "--entity-name", "app",
                   "--add-config", "producer_byte_rate=-5", root=root)
    assert wrong.returncode == 1 and last_line(wrong).startswith("replog: INVALID_REQUEST: producer_byte_rate")
    sent = replog("produce", "--topic", "t", "--client-id", "app", "--user", "alice", stdin="c\n", root=root)
    assert sent.returncode == 0, sent.stderr


def test_brokers_on_locations_of_their_own_and_one_that_fails(tmp_path):
    """Kafka's log.dirs, one per broker, from a properties file; a broker whose location is deleted
    halts (the listing says why), its partition fails over, and `brokers --start` restarts it empty."""
    root, disks = str(tmp_path / "meta"), {b: str(tmp_path / f"disk{b}") for b in range(3)}
    conf = tmp_path / "replog.properties"
    conf.write_text("min.insync.replicas=2\nbroker.session.timeout.ms=1\n"
                    + "".join(f"broker.{b}.log.dirs={d}\n" for b, d in disks.items()))
    created = replog("cluster", "--create", "--brokers", "3", "--conf-file", str(conf), "--root", root)
    assert created.returncode == 0, created.stderr[-2000:]
    assert created.stdout.splitlines()[1:] == [f"\tbroker {b} at {d}" for b, d in disks.items()]
    assert replog("topics", "--create", "--topic", "t", "--replication-factor", "3", root=root).returncode == 0
    assert replog("produce", "--topic", "t", "--acks", "all", stdin="a\nb\n", root=root).returncode == 0
    assert replog("run", "--until-committed", root=root).returncode == 0

    import shutil
    shutil.rmtree(disks[0])  # broker 0 leads t-0
    assert replog("run", "--rounds", "3", root=root).returncode == 0
    listed = [line.split(None, 5) for line in replog("brokers", root=root).stdout.splitlines()]
    assert listed[1] == ["0", "fenced", "running", "0", disks[0],
                         f"the log of broker 0 at {disks[0]}/log is gone (not a Delta table)"]
    assert [line[3] for line in listed[2:]] == ["1", "0"]  # broker 1 leads t-0 now
    consumed = replog("consume", "--topic", "t", "--from-beginning", root=root)
    assert consumed.stdout.splitlines() == ["a", "b"]

    started = replog("brokers", "--start", "0", root=root)
    assert started.stdout == "Started broker 0 with an empty log: it refetches from the leaders.\n"
    assert replog("run", "--rounds", "3", root=root).returncode == 0
    again = replog("consume", "--topic", "t", "--from-beginning", "--replica", "0", "--isolation",
                   "read_uncommitted", root=root)
    assert again.stdout.splitlines() == ["a", "b"]

    added = replog("brokers", "--add", "--dir", disks[1], root=root)  # broker 1's location
    assert added.returncode == 1 and last_line(added).startswith("replog: INVALID_CONFIG: brokers 3 and 1 would share")
