"""The `replog` commands in this process (the suite's SparkSession): their output lines, --output
json, --root on either side of the command, and the errors. tests/test_cli.py drives the console
script as a subprocess (the JVM's lines hidden, the exit codes)."""

import json
import os
import subprocess
import sys

import pytest

from pipeline.cli import main
from pipeline.cli.output import aligned
from pipeline.cli.parser import build_parser


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.strip().splitlines()


@pytest.fixture
def root(new_cluster):
    cluster = new_cluster(brokers=3)
    cluster.create_topic("orders", partitions=2, replication_factor=3, config={"min.insync.replicas": "2"})
    return cluster


def test_produce_results_follow_a_request_from_the_inbox_to_its_acknowledgement(capsys, root):
    where = root.storage.root
    request = root.produce("orders", [{"value": "a", "partition": 0}, {"value": "b", "partition": 0},
                                      {"value": "c", "partition": 1}], acks="all")
    code, out, _ = run(capsys, "produce-results", "--request", request, "--root", where)
    assert code == 0
    assert out[0].split() == ["REQUEST-ID", "TOPIC", "PARTITION", "ACKS", "STATUS", "ERROR-CODE", "BASE-OFFSET",
                              "LAST-OFFSET", "THROTTLE-TIME-MS"]
    assert out[1].split() == [request, "orders", "-", "-1", "queued", "-", "-", "-", "-"]

    root.run_round()
    code, out, _ = run(capsys, "--root", where, "produce-results", "--request", request)  # --root before the command
    assert code == 0 and [line.split() for line in out[1:]] == [
        [request, "orders", "0", "-1", "acked", "-", "0", "1", "0"],
        [request, "orders", "1", "-1", "acked", "-", "0", "0", "0"]]

    code, out, _ = run(capsys, "produce-results", "--request", request, "--topic", "orders", "--output", "json",
                       "--root", where)
    assert [json.loads(line) for line in out] == [
        {"request_id": request, "topic": "orders", "partition": p, "acks": -1, "status": "acked", "error_code": None,
         "base_offset": 0, "last_offset": last, "throttle_time_ms": 0} for p, last in ((0, 1), (1, 0))]

    failed = root.produce("nope", [{"value": "x"}], acks="1")
    root.run_round()
    code, out, _ = run(capsys, "produce-results", "--request", failed, "--output", "json", "--root", where)
    assert [(r["status"], r["error_code"]) for r in map(json.loads, out)] == [
        ("error", "UNKNOWN_TOPIC_OR_PARTITION")]

    code, out, err = run(capsys, "produce-results", "--request", "no-such-request", "--root", where)
    assert code == 1 and out == [] and err == [f"replog: INVALID_REQUEST: no produce request no-such-request at {where}"]


def test_listings_as_json_lines_and_aligned_columns(capsys, root):
    where = root.storage.root
    root.produce("orders", [{"value": "a", "partition": 0}], acks="all")
    root.run_round()
    code, out, _ = run(capsys, "topics", "--describe", "--output", "json", "--root", where)
    expected = [r.asDict() for r in root.describe("orders").orderBy("partition").collect()]
    assert code == 0 and [json.loads(line) for line in out] == expected

    code, out, _ = run(capsys, "--output", "json", "topics", "--list", "--root", where)
    assert out == ['{"topic": "orders"}']

    code, out, _ = run(capsys, "brokers", "--output", "json", "--root", where)
    assert [(r["broker"], r["state"], r["leaders"], r["log_dir_failure"]) for r in map(json.loads, out)] == [
        (0, "running", 1, None), (1, "running", 1, None), (2, "running", 0, None)]

    # kafka-consumer-groups' columns: each left-aligned to its widest value
    root.commit_offsets("billing-consumers", {("orders", 0): 1, ("orders", 1): 0})
    code, out, _ = run(capsys, "consumer-groups", "--describe", "--group", "billing-consumers", "--root", where)
    assert out == ["GROUP             TOPIC  PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG",
                   "billing-consumers orders 0         1              1              0",
                   "billing-consumers orders 1         0              0              0"]

    code, out, _ = run(capsys, "configs", "--describe", "--entity-type", "topics", "--entity-name", "orders",
                       "--output", "json", "--root", where)
    assert json.loads(out[0]) == {"entity_type": "topics", "entity_name": "orders",
                                  "configs": {"min.insync.replicas": 2}}


def test_aligned_widths_come_from_the_rows_and_missing_values_are_dashes():
    assert list(aligned(["A", "LONGER"], [(1, None), ("wide-value", 22)])) == [
        "A          LONGER", "1          -", "wide-value 22"]


def test_bad_flags_exit_2_and_every_flag_says_what_it_does(capsys, root):
    code, out, err = run(capsys, "consumer-groups", "--reset-offsets", "--group", "g", "--root", root.storage.root)
    assert code == 2 and err == ["replog consumer-groups: error: --reset-offsets: --topic and one of --to-earliest, "
                                 "--to-latest, --to-offset N"]
    parser = build_parser("")
    commands = next(a for a in parser._actions if a.dest == "command").choices
    undocumented = [(name, a.option_strings) for name, p in [("replog", parser), *commands.items()]
                    for a in p._actions if a.option_strings and not a.help]
    assert undocumented == []
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("replog 0.1.0 (pyspark 4.2.0, delta-spark ")


def test_a_missing_local_root_is_reported_without_starting_a_jvm(tmp_path):
    script = ("import sys; from pipeline.cli import main; code = main(['topics', '--list', '--root', sys.argv[1]]); "
              "from pyspark import SparkContext; print(code, SparkContext._gateway is None)")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "nothing")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.stdout.split() == ["1", "True"], done.stderr[-2000:]
    assert done.stderr.strip() == (f"replog: CLUSTER_NOT_FOUND: {tmp_path / 'nothing'} holds no cluster "
                                   "(create one: replog cluster --create)")


def test_sql_over_the_views_and_a_bad_query(capsys, root):
    where = root.storage.root
    root.produce("orders", [{"value": v, "partition": 1} for v in "abc"], acks="all")
    root.run_round()
    query = ("SELECT partition, count(*) AS records FROM replog.committed WHERE topic = 'orders' "
             "GROUP BY partition ORDER BY partition")
    code, out, _ = run(capsys, "sql", query, "--root", where)
    assert code == 0 and out == ["partition records", "1         3"]
    code, out, _ = run(capsys, "sql", query, "--output", "json", "--root", where)
    assert [json.loads(line) for line in out] == [{"partition": 1, "records": 3}]
    code, out, err = run(capsys, "sql", "SELECT * FROM replog.nope", "--root", where)
    assert code == 1 and out == [] and len(err) == 1 and err[0].startswith(
        "replog: INVALID_REQUEST: [TABLE_OR_VIEW_NOT_FOUND] ")


def test_round_progress_is_one_live_line_on_a_terminal_and_a_line_per_round_in_a_log():
    import io
    from types import SimpleNamespace
    from pipeline.cli.progress import RoundProgress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    def report(round_id, appended, replicated, acked, pending, active):
        return SimpleNamespace(round_id=round_id, records_appended=appended, records_replicated=replicated,
                               requests_acked=acked, requests_failed=0, pending_requests=pending,
                               throttled_requests=0, active_partitions=active)

    ticks = iter([0.0, 2.0, 4.0])
    log = io.StringIO()
    progress = RoundProgress(stream=log, clock=lambda: next(ticks))
    progress.update(report(1, 1000, 1000, 1, 3, 2))
    progress.update(report(2, 0, 2000, 3, 0, 0))
    progress.close()
    assert log.getvalue().splitlines() == [
        "[#####...............] round 1 (1): 3 requests and 2 partitions left, 1 answered, 1,000 records/s, ETA 6 s",
        "[####################] round 2 (2): 0 requests and 0 partitions left, 4 answered, 1,000 records/s, ETA 0 s"]

    ticks = iter([0.0, 1.0])
    terminal = Terminal()
    progress = RoundProgress(total=4, stream=terminal, clock=lambda: next(ticks))
    progress.update(report(7, 10, 20, 0, 1, 1))
    progress.close()
    progress.close()
    assert terminal.getvalue() == ("\r\033[K[#####...............] round 7 (1/4): 1 requests and 1 partitions left, "
                                   "0 answered, 30 records/s, ETA 3 s\n")


def test_reassign_execute_wait_runs_rounds_until_done_showing_the_records_left(capsys, new_cluster, tmp_path):
    from tests.helpers import partition_row
    cluster = new_cluster(brokers=3)
    cluster.create_topic("moving", partitions=1, replication_factor=2)
    cluster.produce("moving", [{"value": str(i)} for i in range(30)], acks="all")
    replicas = list(partition_row(cluster, "moving")["replicas"])
    target = [({0, 1, 2} - set(replicas)).pop(), replicas[0]]
    plan = tmp_path / "move.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": "moving", "partition": 0,
                                                              "replicas": target}]}))
    code, out, err = run(capsys, "reassign", "--json", str(plan), "--execute", "--wait", "--root", cluster.storage.root)
    assert code == 0, err
    assert out == ["Started the reassignment of 1 partitions (the next round applies it).",
                   "Reassignment of 1 partitions completed."]
    assert err and all(" records left, " in line for line in err)
    first, last = err[0], err[-1]
    assert " of 30 records left" in first and last.startswith("[####################] ") and " 0 of 30 " in last
    assert list(partition_row(cluster, "moving")["replicas"]) == target
    code, _, err = run(capsys, "reassign", "--json", str(plan), "--verify", "--wait", "--root", cluster.storage.root)
    assert code == 2 and err == ["replog reassign: error: --wait goes with --execute"]
