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


# commands that may run for long (rounds, compaction): their JVM keeps the C2 compiler
_LONG_RUNNING = {"run", "maintain"}


def _spark(args: argparse.Namespace):
    from pipeline.runtime import get_spark
    with _jvm_output_hidden(not args.verbose):
        spark = get_spark(app_name="replog-cli", short_lived=args.command not in _LONG_RUNNING)
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


def _open(args: argparse.Namespace):
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
    cluster = _open(args)
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
    cluster = _open(args)
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
    cluster = _open(args)
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
    cluster = _open(args)
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
        _run_rounds(args, _open(args))
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
        report = _open(args).maintain()
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
    for flag in ("conf_file", "trigger_interval", "checkpoint", "metrics_port", "max_stalled_rounds"):
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


def cmd_brokers(args: argparse.Namespace) -> None:
    cluster = _open(args)
    if args.dir is not None and not args.add:
        raise UsageError("--dir goes with --add")
    if args.add:
        broker = cluster.add_broker(dir=args.dir)
        print(f"Added broker {broker}" + (f" at {cluster.storage.broker_root(broker)}." if args.dir else "."))
        return
    if args.start is not None:
        cluster.start_broker(args.start)
        empty = {r["broker"]: r["log_lost"] for r in cluster.broker_states().collect()}.get(args.start)
        print(f"Started broker {args.start}" + (" with an empty log: it refetches from the leaders." if empty else "."))
        return
    if args.decommission is not None:
        plan = cluster.decommission_broker(args.decommission)
        print(f"Decommissioning broker {args.decommission}: {len(plan)} partitions move off it.")
        for (topic, partition), target in sorted(plan.items()):
            print(f"\t{topic}-{partition} -> {','.join(map(str, target))}")
        return
    leaders = {r["leader"]: r["n"] for r in cluster.describe().groupBy("leader").count()
               .withColumnRenamed("count", "n").collect()}
    rows = ({"broker": r["broker"], "state": "decommissioned" if r["decommissioned"] else r["state"],
             "fetcher": "paused" if r["fetcher_paused"] else "running", "leaders": leaders.get(r["broker"], 0),
             "location": r["location"], "log_dir_failure": r["log_dir_failure"]}
            for r in cluster.broker_states().orderBy("broker").collect())  # O(brokers)
    emit(args.output, ["BROKER", "STATE", "FETCHER", "LEADERS", "LOCATION", "LOG-DIR-FAILURE"],
         ["broker", "state", "fetcher", "leaders", "location", "log_dir_failure"], rows)


def config_list(text: str | None) -> dict[str, str]:
    """kafka-configs' --add-config list `k1=v1,k2=v2` (a value with commas in brackets: k=[a,b])."""
    pairs, depth, part = [], 0, ""
    for ch in text or "":
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            pairs.append(part)
            part = ""
        else:
            part += ch
    if part:
        pairs.append(part)
    config = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ReplogError(ErrorCode.INVALID_CONFIG, f"--add-config takes k=v,k2=v2, got {pair!r}")
        value = value.strip()
        config[key.strip()] = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    return config


def _client_quota_entity(args: argparse.Namespace) -> dict[str, str | None] | None:
    """kafka-configs' --entity-type users|clients, each followed by --entity-name N or
    --entity-default, as a client quota entity (None: a topics or brokers command)."""
    types, names = args.entity_type, args.entity_names or []
    if not set(types) & {"users", "clients"}:
        return None
    if len(names) != len(types) or len(set(types)) != len(types) or not set(types) <= {"users", "clients"}:
        raise UsageError("give each --entity-type users|clients (once each) an --entity-name "
                         "or --entity-default")
    return {{"users": "user", "clients": "client-id"}[t]: n for t, n in zip(types, names)}


def _entity_text(entity: dict[str, str | None]) -> str:
    return ", ".join(f"{k} {'<default>' if v is None else v}"
                     for k, v in entity.items())


def cmd_configs(args: argparse.Namespace) -> None:
    """kafka-configs: a topic's overrides, the cluster-wide broker defaults, or client quotas."""
    deletes = [k.strip() for k in (args.delete_config or "").split(",") if k.strip()]
    entity = _client_quota_entity(args)
    if entity is not None:
        cluster = _open(args)
        if args.alter:
            cluster.alter_client_quotas(entity, set=config_list(args.add_config), delete=deletes)
            print(f"Completed updating config for {_entity_text(entity)}.")
            return
        for row in cluster.describe_client_quotas():
            if row["entity"] == entity and args.output == "json":
                print(json_line({"entity": entity, "quotas": row["quotas"]}))
                return
            if row["entity"] == entity:
                print(f"Quota configs for {_entity_text(entity)} are "
                      + ", ".join(f"{k}={v}" for k, v in sorted(row["quotas"].items())))
                return
        print(json_line({"entity": entity, "quotas": {}}) if args.output == "json"
              else f"No quota configs for {_entity_text(entity)}.")
        return
    if len(args.entity_type) != 1:
        raise UsageError("one --entity-type for topics or brokers")
    entity_type, name = args.entity_type[0], (args.entity_names or [None])[0]
    if entity_type == "topics" and not name:
        raise UsageError("--entity-type topics: --entity-name is required")
    if entity_type == "brokers" and (name is not None or not args.entity_names):
        raise UsageError("--entity-type brokers: say --entity-default (configs are cluster-wide)")
    cluster = _open(args)
    if args.alter:
        cluster.alter_configs(entity_type, name, set=config_list(args.add_config), delete=deletes)
        print(f"Completed updating config for {'topic ' + name if name else 'the broker default'}.")
        return
    values = {k: str(v).lower() if isinstance(v, bool) else v
              for k, v in sorted(cluster.describe_configs(entity_type, name).items())}
    if args.output == "json":
        print(json_line({"entity_type": entity_type, "entity_name": name, "configs": values}))
        return
    what = f"topic {name}" if name else "the brokers' default"
    print(f"Dynamic configs for {what} are:")
    for key, value in values.items():
        print(f"  {key}={value}")


def reassignment_json(text: str) -> dict[tuple[str, int], list[int]]:
    """kafka-reassign-partitions' JSON ({"version": 1, "partitions": [{"topic", "partition",
    "replicas"[, "log_dirs"]}]}) as reassign_partitions' mapping; INVALID_REPLICA_ASSIGNMENT when
    it is not that."""
    def bad(why: str) -> ReplogError:
        return ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"reassignment JSON: {why}")
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise bad(f"not JSON ({err})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), list):
        raise bad('expected {"version": 1, "partitions": [...]}')
    if doc.get("version", 1) != 1:
        raise bad(f"version {doc.get('version')!r} is not 1")
    mapping = {}
    for entry in doc["partitions"]:
        if not isinstance(entry, dict) or not {"topic", "partition", "replicas"} <= entry.keys():
            raise bad(f"each partition needs topic, partition and replicas, got {entry!r}")
        key = (entry["topic"], entry["partition"])
        if key in mapping:
            raise bad(f"{key[0]}-{key[1]} is listed twice")
        mapping[key] = entry["replicas"]
    return mapping


def cmd_reassign(args: argparse.Namespace) -> None:
    """kafka-reassign-partitions --execute / --verify with a reassignment JSON file."""
    with open(args.json) as f:
        mapping = reassignment_json(f.read())
    if args.wait and not args.execute:
        raise UsageError("--wait goes with --execute")
    cluster = _open(args)
    if args.execute:
        cluster.reassign_partitions(mapping)
        print(f"Started the reassignment of {len(mapping)} partitions (the next round applies it).")
        if args.wait:
            _wait_for_reassignment(args, cluster, mapping)
        return
    progress = {(r["topic"], r["partition"]): r for r in cluster.reassignments().collect()}  # O(reassigning)
    asked = cluster.spark.createDataFrame(sorted(mapping), "topic string, partition int")
    current = {(r["topic"], r["partition"]): r["replicas"]  # O(partitions in the file), filtered in Spark
               for r in cluster.describe().join(asked, on=["topic", "partition"], how="left_semi").collect()}
    print("Status of partition reassignment:")
    for (topic, partition), target in sorted(mapping.items()):
        row = progress.get((topic, partition))
        if row is not None:
            print(f"Reassignment of partition {topic}-{partition} is still in progress "
                  f"({row['records_left']} records, {row['bytes_left']} bytes left to copy).")
        elif current.get((topic, partition)) == list(target):
            print(f"Reassignment of partition {topic}-{partition} is completed.")
        else:
            print(f"There is no active reassignment of partition {topic}-{partition}, "
                  f"but replica set is {current.get((topic, partition))} rather than {list(target)}.")


def _wait_for_reassignment(args: argparse.Namespace, cluster: Any, mapping: dict) -> None:
    """Rounds in this process (as `replog run`, holding the job lock) until every partition of the
    file has its target replicas, with the adding replicas' records left as progress."""
    from pyspark.sql import functions as F

    from pipeline.cli.progress import CatchUpProgress
    from pipeline.storage.job_lock import hold_job_lock
    asked = cluster.spark.createDataFrame(sorted(mapping), "topic string, partition int")

    def left() -> tuple[int, int]:  # (partitions of the file still in progress, their records left)
        row = cluster.reassignments().join(asked, on=["topic", "partition"], how="left_semi").agg(
            F.count(F.lit(1)).alias("n"), F.coalesce(F.sum("records_left"), F.lit(0)).alias("left")).first()
        return row["n"], row["left"]

    lock = hold_job_lock(args.root)
    try:
        report = cluster.run_round()  # applies the reassignment
        moving, records = left()
        progress = CatchUpProgress(records)
        for _ in range(args.max_rounds):
            progress.left(report.round_id, records)
            if not moving:
                break
            report = cluster.run_round()
            moving, records = left()
        progress.close()
    finally:
        if lock is not None:
            lock.close()
    if moving:
        raise ReplogError(ErrorCode.REQUEST_TIMED_OUT, f"{moving} partitions still reassigning ({records} records "
                          f"left) after {args.max_rounds} rounds")
    print(f"Reassignment of {len(mapping)} partitions completed.")


def cmd_sessions(args: argparse.Namespace) -> None:
    """The leaders' KIP-227 fetch session caches as of the newest round (`replog.fetch_sessions`)."""
    cluster = _open(args)
    df = cluster.fetch_sessions()
    if args.leader is not None:
        df = df.filter(df.leader == args.leader)
    keys = ["leader", "fetcher", "type", "session_id", "epoch", "partitions", "created_ms", "last_used_ms"]
    rows = ({**r.asDict(), "type": "follower" if r["privileged"] else "consumer"}
            for r in df.orderBy("leader", "privileged", "fetcher").toLocalIterator())  # O(sessions): <= slots per leader
    emit(args.output, [k.upper().replace("_", "-") for k in keys], keys, rows)


def cmd_consumer_groups(args: argparse.Namespace) -> None:
    """kafka-consumer-groups: committed offsets and lag, and resetting a group's offsets."""
    cluster = _open(args)
    if args.list:
        for r in cluster.consumer_lag().select("group_id").distinct().orderBy("group_id").toLocalIterator():
            print(json_line({"group": r["group_id"]}) if args.output == "json" else r["group_id"])
        return
    if not args.group:
        raise UsageError("--group is required")
    if args.describe:
        keys = ["group_id", "topic", "partition", "current_offset", "log_end_offset", "lag"]
        emit(args.output, ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"], keys,
             (r.asDict() for r in cluster.consumer_lag(args.group).orderBy("topic", "partition").toLocalIterator()))
        return
    if not args.topic or sum([args.to_earliest, args.to_latest, args.to_offset is not None]) != 1:
        raise UsageError("--reset-offsets: --topic and one of --to-earliest, --to-latest, "
                         "--to-offset N")
    parts = cluster.describe(args.topic).select("partition", "log_start_offset", "high_watermark").collect()
    offsets = {(args.topic, r["partition"]): r["log_start_offset"] if args.to_earliest else
               r["high_watermark"] if args.to_latest else args.to_offset for r in parts}  # O(partitions of T)
    emit(args.output, ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], ["group_id", "topic", "partition", "new_offset"],
         ({"group_id": args.group, "topic": t, "partition": p, "new_offset": o} for (t, p), o in sorted(offsets.items())))
    if not args.execute:
        print("(dry run: add --execute to commit these offsets)", file=sys.stderr)
        return
    cluster.commit_offsets(args.group, offsets)
