"""The `replog` commands, one function each (`cmd_<name>`), and the lines they print in Kafka's
tools' formats; pipeline/cli/__init__.py has the usage, parser.py the flags."""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from pipeline.cli.output import emit, json_line
from pipeline.errors import ErrorCode, ReplogError


class UsageError(Exception):
    """Flags that do not go together: `replog <command>: error: ...` and exit 2, as argparse."""

# kafka-topics --describe's filters, by control/partition_health.py's definitions (looked up when
# used: that module needs numpy, which a command that starts no JVM never loads); as kafka-topics
# does, --under-min-isr-partitions also lists the offline partitions
FILTERS = {
    "under_replicated_partitions": ("under_replicated",),
    "under_min_isr_partitions": ("under_min_isr", "offline"),
    "unavailable_partitions": ("offline",),
}


def _config(pairs: list[str] | None) -> dict[str, str]:
    config = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ReplogError(ErrorCode.INVALID_CONFIG, f"--config takes key=value, got {pair!r}")
        config[key.strip()] = value.strip()
    return config


# commands that may run for long (rounds, compaction; reassign --wait too): their JVM keeps the C2 compiler
_LONG_RUNNING = {"run", "maintain"}


def _spark(args: argparse.Namespace):
    from pipeline.runtime import get_spark
    with _jvm_output_hidden(not args.verbose):
        spark = get_spark(app_name="replog-cli",
                          short_lived=args.command not in _LONG_RUNNING and not getattr(args, "wait", False))
    if args.verbose:
        spark.sparkContext.setLogLevel("WARN")
    return spark


@contextmanager
def _jvm_output_hidden(hide: bool) -> Iterator[None]:
    """Starts the JVM with its stdout and stderr on /dev/null: its launcher's, log4j's and Hadoop's
    lines (and those of the Python workers it forks) never reach the terminal, while this process
    prints as before. Spark's errors still come back through Py4J as exceptions."""
    if not hide:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def open_root(args: argparse.Namespace):
    """The cluster at --root, without the replog.* views: no command reads them, and registering
    them is about 3 s of a command's start."""
    from pipeline.cluster import Cluster
    return Cluster.open(_spark(args), args.root, views=False)


def cmd_cluster(args: argparse.Namespace) -> None:
    from pipeline.cluster import Cluster
    if not args.create:
        raise UsageError("say --create")
    from pipeline.config import read_properties
    try:
        config = {**(read_properties(args.conf_file) if args.conf_file else {}), **_config(args.config)}
    except (OSError, ValueError) as err:
        raise ReplogError(ErrorCode.INVALID_CONFIG, str(err)) from None
    cluster = Cluster.create(_spark(args), args.root, brokers=args.brokers, config=config)
    print(f"Created a cluster of {args.brokers} brokers at {cluster.storage.root}.")
    for broker, where in sorted(cluster.storage.broker_dirs.items()):
        print(f"\tbroker {broker} at {where}")


def describe_lines(cluster: Any, args: argparse.Namespace) -> Iterator[str]:
    """Kafka's describe lines, streamed partition by partition (the driver never holds them all)."""
    df = _described(cluster, args)
    topics = {r["topic"]: r for r in cluster.topics().collect()}  # one row per topic
    headers = not any(getattr(args, f) for f in FILTERS)
    current = None
    for r in df.toLocalIterator():
        if headers and r["topic"] != current:
            current, t = r["topic"], topics[r["topic"]]
            yield (f"Topic: {t['topic']}\tPartitionCount: {t['partitions']}\t"
                   f"ReplicationFactor: {t['replication_factor']}\tConfigs: {_configs(t['config'])}")
        yield describe_line(r)


def _described(cluster: Any, args: argparse.Namespace) -> Any:
    """describe()'s partitions under the --describe filters, in topic and partition order."""
    from pipeline.control.partition_health import SQL
    df = cluster.describe(args.topic)
    for flag, names in FILTERS.items():
        if getattr(args, flag):
            df = df.filter(" OR ".join(f"({SQL[name]})" for name in names))
    return df.orderBy("topic", "partition")


def describe_line(r: Any) -> str:
    """A `replog.partitions` row as kafka-topics.sh --describe prints a partition, with HW and LEO."""
    return (f"\tTopic: {r['topic']}\tPartition: {r['partition']}\tLeader: {r['leader']}\t"
            f"Replicas: {','.join(map(str, r['replicas']))}\tIsr: {','.join(map(str, r['isr']))}\t"
            f"HighWatermark: {r['high_watermark']}\tLogEndOffset: {r['log_end_offset']}"
            + "".join(f"\t{label}: {','.join(map(str, r[column]))}" for label, column in
                      (("Adding Replicas", "adding_replicas"), ("Removing Replicas", "removing_replicas"))
                      if r[column]))


def _configs(config_json: str | None) -> str:
    values = json.loads(config_json) if config_json else {}
    return ",".join(f"{k}={v}" for k, v in sorted(values.items()))


def cmd_topics(args: argparse.Namespace) -> None:
    cluster = open_root(args)
    if args.create:
        if not args.topic:
            raise UsageError("--create: --topic is required")
        cluster.create_topic(args.topic, partitions=args.partitions, replication_factor=args.replication_factor,
                             config=_config(args.config))
        print(f"Created topic {args.topic}.")
    elif args.list:
        for r in cluster.topics().orderBy("topic").toLocalIterator():
            print(json_line({"topic": r["topic"]}) if args.output == "json" else r["topic"])
    elif args.output == "json":
        for r in _described(cluster, args).toLocalIterator():
            print(json_line(r.asDict()))
    else:
        for line in describe_lines(cluster, args):
            print(line)


def cmd_produce(args: argparse.Namespace) -> None:
    cluster = open_root(args)
    stream = open(args.file) if args.file else sys.stdin
    with stream:
        lines = [line.rstrip("\n") for line in stream if line.rstrip("\n")]
    records = []
    for line in lines:
        if args.key_separator and args.key_separator in line:
            key, value = line.split(args.key_separator, 1)
            records.append({"key": key, "value": value})
        else:
            records.append({"value": line})
    if args.partition is not None:
        records = [{**r, "partition": args.partition} for r in records]
    if not records:
        print("replog produce: no lines to send", file=sys.stderr)
        return
    request_id = cluster.produce(args.topic, records, acks=args.acks, client_id=args.client_id, user=args.user)
    print(f"Sent {len(records)} records to {args.topic} (acks={args.acks}), request {request_id}.")


RESULT_KEYS = ["request_id", "topic", "partition", "acks", "status", "error_code", "base_offset", "last_offset",
               "throttle_time_ms"]


def cmd_produce_results(args: argparse.Namespace) -> None:
    """A produce request's status in each partition it wrote (`Cluster.produce_results`): pending
    until the round acknowledges it, acked with its offsets, error with Kafka's error name, or throttled
    by a client quota. A request no round has read yet is reported as in the inbox."""
    cluster = open_root(args)
    df = cluster.produce_results()
    if args.request:
        df = df.filter(df.request_id == args.request)
    if args.topic:
        df = df.filter(df.topic == args.topic)
    rows = df.orderBy("request_id", "topic", "partition").toLocalIterator()
    first = next(rows, None)
    if first is None and args.request:
        _unread_request(cluster, args)
        return
    emit(args.output, [k.upper().replace("_", "-") for k in RESULT_KEYS], RESULT_KEYS,
         (r.asDict() for r in _chain(first, rows)))


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    if first is not None:
        yield first
        yield from rest


def _unread_request(cluster: Any, args: argparse.Namespace) -> None:
    """A request with no result yet: in the inbox (no round has read it) or unknown."""
    inbox = cluster.storage.read("inbox")
    queued = inbox.filter(inbox.request_id == args.request).limit(1).collect()
    if not queued:
        raise ReplogError(ErrorCode.INVALID_REQUEST, f"no produce request {args.request} at {cluster.storage.root}")
    row = {**{k: None for k in RESULT_KEYS}, "request_id": args.request, "topic": queued[0]["topic"],
           "acks": queued[0]["acks"], "status": "queued"}
    emit(args.output, [k.upper().replace("_", "-") for k in RESULT_KEYS], RESULT_KEYS, [row])


def cmd_sql(args: argparse.Namespace) -> None:
    """A Spark SQL query over the root's `replog.*` views (replog.committed, replog.partitions,
    ...), printed as aligned columns or JSON lines: `replog sql "SELECT ..."`."""
    from pipeline.cluster import Cluster
    from pyspark.errors import AnalysisException
    Cluster.open(_spark(args), args.root)  # registers the views
    try:
        df = _spark(args).sql(args.query)
    except AnalysisException as err:  # a parse error too: the user's query, not a failure
        raise ReplogError(ErrorCode.INVALID_REQUEST, str(err).strip().splitlines()[0]) from None
    keys = df.columns
    emit(args.output, keys, keys, (r.asDict() for r in df.toLocalIterator()))


def cmd_consume(args: argparse.Namespace) -> None:
    if not args.from_beginning and args.offset is None:
        raise UsageError("say --from-beginning or --offset N (it reads what is there and exits)")
    cluster = open_root(args)
    df = cluster.read(args.topic, partition=args.partition, from_offset=args.offset, replica=args.replica,
                      isolation=args.isolation)
    for r in df.orderBy("partition", "offset").toLocalIterator():
        value = bytes(r["value"]).decode("utf-8", "replace") if r["value"] is not None else "null"
        if args.print_key:
            key = bytes(r["key"]).decode("utf-8", "replace") if r["key"] is not None else "null"
            print(f"{key}\t{value}")
        else:
            print(value)


def cmd_run(args: argparse.Namespace) -> None:
    from pipeline.storage.job_lock import hold_job_lock
    lock = hold_job_lock(args.root)  # one job per root: a second is refused before Spark starts
    try:
        _run_rounds(args, open_root(args))
    finally:
        if lock is not None:
            lock.close()


def cmd_maintain(args: argparse.Namespace) -> None:
    """One pass of Delta table maintenance (pipeline/storage/maintenance.py). It takes the one-writer lease,
    so it holds the job lock as `run` does: refused while a replication job runs (which makes the
    pass itself every log.maintenance.interval.ms)."""
    from pipeline.storage.job_lock import hold_job_lock
    lock = hold_job_lock(args.root)
    try:
        report = open_root(args).maintain()
    finally:
        if lock is not None:
            lock.close()
    print(f"Maintained {report.tables} tables and logs: compacted {len(report.compacted)} "
          f"({report.files_removed} small files into {report.files_added}), vacuumed {report.files_vacuumed} files, "
          f"retention set on {len(report.properties_set)}.")
    for name in report.compacted:
        print(f"  compacted {name}")


def _run_rounds(args: argparse.Namespace, cluster: Any) -> None:
    from pipeline.cli.progress import RoundProgress
    limit = args.rounds or args.max_rounds
    progress = RoundProgress(total=args.rounds)
    try:
        for done in range(1, limit + 1):
            report = cluster.run_round()
            progress.update(report)
            if args.until_committed and cluster.caught_up(report):
                progress.close()
                print(f"Committed: nothing pending after {done} round{'' if done == 1 else 's'}.")
                return
    finally:
        progress.close()
    if args.until_committed:
        raise ReplogError(ErrorCode.REQUEST_TIMED_OUT,
                          f"still {report.pending_requests} requests pending, {report.throttled_requests or 0} "
                          f"waiting for a client quota and {report.active_partitions} partitions active after "
                          f"{limit} rounds")
    print(f"Ran {limit} rounds.")


def job_command(args: argparse.Namespace) -> list[str]:
    """The spark-submit command line that runs the replication job (pipeline/jobs/replicate.py)
    from this installation: PySpark's spark-submit, the Delta jars from the cache (fetched once),
    the settings rounds are measured with (pipeline/runtime/tuning.py, the Spark UI left on), and
    the job's own flags."""
    from pyspark.find_spark_home import _find_spark_home

    import pipeline.jobs.replicate as job
    from pipeline.runtime import FAST_CONFS, delta_jars
    from pipeline.runtime.session import DELTA_CONFS
    confs = {**{k: v for k, v in FAST_CONFS.items() if k != "spark.ui.enabled"}, **DELTA_CONFS,
             **dict(_pair(c) for c in args.spark_conf or [])}
    command = [os.path.join(_find_spark_home(), "bin", "spark-submit"), "--master", args.master,
               "--jars", ",".join(delta_jars())]
    for key, value in confs.items():
        command += ["--conf", f"{key}={value}"]
    command += [job.__file__, "--root", args.root]
    for flag in ("conf_file", "trigger_interval", "checkpoint", "metrics_port", "figures_interval",
                 "max_stalled_rounds"):
        if getattr(args, flag) is not None:
            command += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    return command + (["--available-now"] if args.available_now else [])


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UsageError(f"--spark-conf takes key=value, got {text!r}")
    return key, value


def cmd_job(args: argparse.Namespace) -> None:
    """The replication job under spark-submit (what `spark-submit jobs/replicate.py` runs from a
    checkout), its output passed through; the command exits with the job's exit code."""
    import subprocess
    command = job_command(args)
    if args.print_command:
        print(" ".join(command))
        return
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    code = subprocess.call(command, env=env)
    if code:
        raise SystemExit(code)


def cmd_serve(args: argparse.Namespace) -> None:
    """Kafka's protocol for the cluster at --root on --listen (pipeline/wire/), until SIGTERM or
    Ctrl-C; the replication job may run beside it on the root, or --run-rounds runs them here."""
    import signal
    import threading
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise ReplogError(ErrorCode.INVALID_REQUEST, f"--listen {args.listen!r} is not HOST:PORT")
    cluster = open_root(args)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    server = cluster.serve(host, int(port), run_rounds=args.run_rounds, round_interval_ms=args.round_interval_ms)
    rounds = (f"rounds every {args.round_interval_ms} ms here" if args.run_rounds
              else "rounds from a replication job on the root")
    try:
        print(f"Serving Kafka's protocol for {args.root} at {host}:{server.port} ({rounds}); "
              "SIGTERM or Ctrl-C stops.", flush=True)
        stop.wait()
    finally:
        server.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("Stopped.")
