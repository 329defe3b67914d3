"""The `replog` commands that administer a cluster, as Kafka's admin tools do: brokers,
kafka-configs, kafka-reassign-partitions, the fetch session caches, kafka-consumer-groups."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pipeline.cli.commands import UsageError, open_root
from pipeline.cli.output import emit, json_line
from pipeline.errors import ErrorCode, ReplogError

__all__ = ["cmd_brokers", "cmd_configs", "cmd_reassign", "cmd_sessions", "cmd_consumer_groups", "config_list",
           "reassignment_json"]


def cmd_brokers(args: argparse.Namespace) -> None:
    cluster = open_root(args)
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
        cluster = open_root(args)
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
    cluster = open_root(args)
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
    cluster = open_root(args)
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
    cluster = open_root(args)
    df = cluster.fetch_sessions()
    if args.leader is not None:
        df = df.filter(df.leader == args.leader)
    keys = ["leader", "fetcher", "type", "session_id", "epoch", "partitions", "created_ms", "last_used_ms"]
    rows = ({**r.asDict(), "type": "follower" if r["privileged"] else "consumer"}
            for r in df.orderBy("leader", "privileged", "fetcher").toLocalIterator())  # O(sessions): <= slots per leader
    emit(args.output, [k.upper().replace("_", "-") for k in keys], keys, rows)


def cmd_consumer_groups(args: argparse.Namespace) -> None:
    """kafka-consumer-groups: committed offsets and lag, and resetting a group's offsets."""
    cluster = open_root(args)
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
