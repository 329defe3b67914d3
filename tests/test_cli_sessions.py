"""Operator sessions with `replog`, command after command on one root, in this process (the
suite's SparkSession): Kafka's tool formats line by line, the admin commands, maintenance and a
broker whose location fails. tests/test_cli.py runs the console script itself as a subprocess."""

import io
import shutil

from pipeline.cli import main


def replog(capsys, monkeypatch, *argv, stdin=None):
    """One command: (exit code, stdout lines, stderr lines)."""
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.strip().splitlines()


def test_an_operator_session(capsys, monkeypatch, tmp_path):
    root = str(tmp_path / "cluster")
    monkeypatch.setenv("REPLOG_ROOT", root)  # --root from $REPLOG_ROOT
    cli = lambda *argv, **kw: replog(capsys, monkeypatch, *argv, **kw)  # noqa: E731
    assert cli("cluster", "--create", "--brokers", "3") == (0, [f"Created a cluster of 3 brokers at {root}."], [])
    code, out, _ = cli("topics", "--create", "--topic", "orders", "--partitions", "2", "--replication-factor", "3",
                       "--config", "min.insync.replicas=2")
    assert code == 0 and "Created topic orders." in out
    code, out, _ = cli("produce", "--topic", "orders", "--acks", "all", "--key-separator", ":",
                       stdin="k1:first\nk2:second\nthird\n")
    assert code == 0 and out[0].startswith("Sent 3 records to orders (acks=all)")
    code, out, err = cli("run", "--until-committed")
    # the round that appends commits (the followers' follow-up fetches move the HW): one progress line
    assert code == 0 and out[0].startswith("Committed: nothing pending after ") and "after 1 round." in out[0]
    assert sum(line.startswith("[####################] round ") for line in err) == 1

    code, described, _ = cli("topics", "--describe", "--topic", "orders")
    assert described[0] == "Topic: orders\tPartitionCount: 2\tReplicationFactor: 3\tConfigs: min.insync.replicas=2"
    assert [line.split("\t")[1:6] for line in described[1:]] == [
        ["Topic: orders", "Partition: 0", "Leader: 0", "Replicas: 0,1,2", "Isr: 0,1,2"],
        ["Topic: orders", "Partition: 1", "Leader: 1", "Replicas: 1,2,0", "Isr: 1,2,0"]]
    hws = [int(line.split("HighWatermark: ")[1].split("\t")[0]) for line in described[1:]]
    assert sum(hws) == 3
    assert cli("topics", "--describe", "--under-replicated-partitions") == (0, [], [])
    code, out, _ = cli("consume", "--topic", "orders", "--from-beginning", "--print-key")
    assert sorted(out) == ["k1\tfirst", "k2\tsecond", "null\tthird"]

    brokers = [line.split() for line in cli("brokers")[1]]
    assert brokers == [["BROKER", "STATE", "FETCHER", "LEADERS", "LOCATION", "LOG-DIR-FAILURE"]] + [
        [str(b), "running", "running", str(n), f"{root}/brokers/{b}", "-"] for b, n in ((0, 1), (1, 1), (2, 0))]

    # each leader caches one privileged session per follower, opened by the round's full requests
    # (the epoch expected next: 1) and used once more by the follow-up fetches of the followers of a
    # partition that took records (2): both followers of a leader's one partition alike
    sessions = [line.split() for line in cli("sessions")[1]]
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
    reset = ("consumer-groups", "--reset-offsets", "--group", "billing", "--topic", "orders", "--to-offset", "1")
    code, out, err = cli(*reset)
    assert out == ["GROUP   TOPIC  PARTITION NEW-OFFSET", "billing orders 0         1", "billing orders 1         1"]
    assert any("dry run" in line for line in err)
    assert cli("consumer-groups", "--list")[1] == []
    assert cli(*reset, "--execute")[0] == 0
    assert cli("consumer-groups", "--list")[1] == ["billing"]
    lag = [line.split() for line in cli("consumer-groups", "--describe", "--group", "billing")[1]]
    assert lag[0] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"]
    assert [(r[2], r[3]) for r in lag[1:]] == [("0", "1"), ("1", "1")]
    assert [(int(r[4]), int(r[5])) for r in lag[1:]] == [(hw, max(hw - 1, 0)) for hw in hws]

    # Delta table maintenance by hand: the rounds' small files compacted, nothing read changes
    code, out, err = cli("maintain")
    assert code == 0, err
    summary = next(line for line in out if line.startswith("Maintained "))
    assert summary.startswith("Maintained 22 tables and logs: compacted ")
    assert summary.endswith("retention set on 20.")  # every table but the inbox and admin
    code, out, _ = cli("consume", "--topic", "orders", "--from-beginning", "--print-key")
    assert sorted(out) == ["k1\tfirst", "k2\tsecond", "null\tthird"]

    # --partition: every line to one partition (kcat's -p), whatever the partitioner would pick
    code, out, _ = cli("produce", "--topic", "orders", "--partition", "0", "--acks", "1", stdin="p1\np2\np3\n")
    assert code == 0 and out[0].startswith("Sent 3 records to orders (acks=1)")
    assert cli("run", "--until-committed")[0] == 0
    assert cli("consume", "--topic", "orders", "--partition", "0", "--from-beginning")[1][-3:] == ["p1", "p2", "p3"]


def test_reassigning_with_kafkas_json_file_and_adding_a_broker(capsys, monkeypatch, tmp_path):
    root = str(tmp_path / "cluster")
    monkeypatch.setenv("REPLOG_ROOT", root)
    cli = lambda *argv, **kw: replog(capsys, monkeypatch, *argv, **kw)  # noqa: E731
    assert cli("cluster", "--create", "--brokers", "2")[0] == 0
    assert cli("topics", "--create", "--topic", "t", "--replication-factor", "2")[0] == 0
    assert cli("produce", "--topic", "t", "--acks", "all", stdin="a\nb\n")[0] == 0
    assert cli("brokers", "--add") == (0, ["Added broker 2."], [])
    plan = tmp_path / "move.json"
    plan.write_text('{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2, 1], '
                    '"log_dirs": ["any", "any"]}]}')
    code, out, _ = cli("reassign", "--json", str(plan), "--execute")
    assert code == 0 and "Started the reassignment of 1 partitions" in out[0]
    assert cli("run", "--rounds", "6")[0] == 0
    assert cli("reassign", "--json", str(plan), "--verify")[1][1] == "Reassignment of partition t-0 is completed."
    described = cli("topics", "--describe", "--topic", "t")[1][1].split("\t")
    # the leader (broker 0) left: the target's first ISR member leads
    assert described[3:6] == ["Leader: 2", "Replicas: 2,1", "Isr: 2,1"], described
    assert cli("consume", "--topic", "t", "--from-beginning", "--replica", "2")[1] == ["a", "b"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"partitions": [{"topic": "t", "partition": 0}]}')
    code, _, err = cli("reassign", "--json", str(bad), "--execute")
    assert code == 1 and err[-1].startswith("replog: INVALID_REPLICA_ASSIGNMENT: ")

    assert cli("configs", "--alter", "--entity-type", "topics", "--entity-name", "t", "--add-config",
               "retention.ms=60000,cleanup.policy=[compact,delete]") == (0, ["Completed updating config for topic t."],
                                                                         [])
    assert cli("configs", "--describe", "--entity-type", "topics", "--entity-name", "t")[1] == [
        "Dynamic configs for topic t are:", "  cleanup.policy=compact,delete", "  retention.ms=60000"]
    # client quotas (kafka-configs --entity-type users|clients): a (user, client-id) entity and a
    # default; a producer with a client id
    entity = ("--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients", "--entity-default")
    assert cli("configs", "--alter", *entity, "--add-config", "producer_byte_rate=1024,consumer_byte_rate=2048") == (
        0, ["Completed updating config for user alice, client-id <default>."], [])
    assert cli("configs", "--describe", *entity)[1] == [
        "Quota configs for user alice, client-id <default> are consumer_byte_rate=2048, producer_byte_rate=1024"]
    code, _, err = cli("configs", "--alter", "--entity-type", "clients", "--entity-name", "app",
                       "--add-config", "producer_byte_rate=-5")
    assert code == 1 and err[-1].startswith("replog: INVALID_REQUEST: producer_byte_rate")
    assert cli("produce", "--topic", "t", "--client-id", "app", "--user", "alice", stdin="c\n")[0] == 0


def test_brokers_on_locations_of_their_own_and_one_that_fails(capsys, monkeypatch, tmp_path):
    """Kafka's log.dirs, one per broker, from a properties file; a broker whose location is deleted
    halts (the listing says why), its partition fails over, and `brokers --start` restarts it empty."""
    root, disks = str(tmp_path / "meta"), {b: str(tmp_path / f"disk{b}") for b in range(3)}
    monkeypatch.setenv("REPLOG_ROOT", root)
    cli = lambda *argv, **kw: replog(capsys, monkeypatch, *argv, **kw)  # noqa: E731
    conf = tmp_path / "replog.properties"
    conf.write_text("min.insync.replicas=2\nbroker.session.timeout.ms=1\n"
                    + "".join(f"broker.{b}.log.dirs={d}\n" for b, d in disks.items()))
    code, out, err = cli("cluster", "--create", "--brokers", "3", "--conf-file", str(conf))
    assert code == 0, err
    assert out[1:] == [f"\tbroker {b} at {d}" for b, d in disks.items()]
    assert cli("topics", "--create", "--topic", "t", "--replication-factor", "3")[0] == 0
    assert cli("produce", "--topic", "t", "--acks", "all", stdin="a\nb\n")[0] == 0
    assert cli("run", "--until-committed")[0] == 0

    shutil.rmtree(disks[0])  # broker 0 leads t-0
    assert cli("run", "--rounds", "3")[0] == 0
    listed = [line.split(None, 5) for line in cli("brokers")[1]]
    assert listed[1] == ["0", "fenced", "running", "0", disks[0],
                         f"the log of broker 0 at {disks[0]}/log is gone (not a Delta table)"]
    assert [line[3] for line in listed[2:]] == ["1", "0"]  # broker 1 leads t-0 now
    assert cli("consume", "--topic", "t", "--from-beginning")[1] == ["a", "b"]

    assert cli("brokers", "--start", "0")[1] == ["Started broker 0 with an empty log: it refetches from the leaders."]
    assert cli("run", "--rounds", "3")[0] == 0
    assert cli("consume", "--topic", "t", "--from-beginning", "--replica", "0", "--isolation",
               "read_uncommitted")[1] == ["a", "b"]
    code, _, err = cli("brokers", "--add", "--dir", disks[1])  # broker 1's location
    assert code == 1 and err[-1].startswith("replog: INVALID_CONFIG: brokers 3 and 1 would share")
