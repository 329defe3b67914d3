"""The `replog` command line's flags: one subcommand per Kafka tool, each with --root."""

from __future__ import annotations

import argparse
import os
from typing import Callable

from pipeline.cli.commands import (FILTERS, cmd_brokers, cmd_cluster, cmd_configs, cmd_consume, cmd_consumer_groups,
                                   cmd_maintain, cmd_produce, cmd_reassign, cmd_run, cmd_sessions, cmd_topics)

__all__ = ["build_parser"]


def build_parser(usage: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="replog", description=usage,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, run: Callable[[argparse.Namespace], None], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--root", default=os.environ.get("REPLOG_ROOT"), help="cluster root (default $REPLOG_ROOT)")
        p.set_defaults(run=run)
        return p

    for add in (_metadata_commands, _data_commands, _admin_commands):
        add(command)
    return parser


Command = Callable[[str, Callable[[argparse.Namespace], None], str], argparse.ArgumentParser]


def _metadata_commands(command: Command) -> None:
    """cluster, topics, brokers."""
    p = command("cluster", cmd_cluster, "create a cluster")
    p.add_argument("--create", action="store_true")
    p.add_argument("--brokers", type=int, default=3)
    p.add_argument("--config", action="append", metavar="KEY=VALUE",
                   help="a cluster config (Kafka's key names); broker.<id>.log.dirs=LOCATION places a broker")
    p.add_argument("--conf-file", metavar="FILE", help="a replog.properties file (--config overrides it)")

    p = command("topics", cmd_topics, "create, list, describe topics")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--create", action="store_true")
    mode.add_argument("--list", action="store_true")
    mode.add_argument("--describe", action="store_true")
    p.add_argument("--topic")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--replication-factor", type=int, default=1)
    p.add_argument("--config", action="append", metavar="KEY=VALUE")
    health = p.add_mutually_exclusive_group()
    for flag in FILTERS:
        health.add_argument("--" + flag.replace("_", "-"), dest=flag, action="store_true")

    p = command("brokers", cmd_brokers, "brokers with their state, leader counts and locations; add, start or "
                "decommission one")
    change = p.add_mutually_exclusive_group()
    change.add_argument("--add", action="store_true", help="register a new empty broker")
    change.add_argument("--decommission", type=int, metavar="B", help="move every replica off broker B")
    change.add_argument("--start", type=int, metavar="B",
                        help="restart stopped broker B (one a failed log directory halted: once its location is back)")
    p.add_argument("--dir", metavar="LOCATION", help="with --add: the new broker's storage location (path or URI)")


def _data_commands(command: Command) -> None:
    """produce, consume, run, maintain."""
    p = command("produce", cmd_produce, "send lines as records")
    p.add_argument("--topic", required=True)
    p.add_argument("--acks", default="1")
    p.add_argument("--file")
    p.add_argument("--key-separator")
    p.add_argument("--partition", type=int, help="send every line to this partition (default: the partitioner)")
    p.add_argument("--client-id", help="Kafka's client.id: selects the client's produce quota")
    p.add_argument("--user", help="the user the client authenticated as (user quotas)")

    p = command("consume", cmd_consume, "print records")
    p.add_argument("--topic", required=True)
    p.add_argument("--from-beginning", action="store_true")
    p.add_argument("--offset", type=int)
    p.add_argument("--partition", type=int)
    p.add_argument("--replica", type=int)
    p.add_argument("--isolation", default="read_committed", choices=["read_committed", "read_uncommitted"])
    p.add_argument("--print-key", action="store_true")

    p = command("run", cmd_run, "run fetch rounds")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--rounds", type=int)
    how.add_argument("--until-committed", action="store_true")
    p.add_argument("--max-rounds", type=int, default=50, help="--until-committed gives up after this many")

    command("maintain", cmd_maintain, "compact small files, VACUUM and set log retention on every table and log")



def _admin_commands(command: Command) -> None:
    """configs, reassign, sessions, consumer-groups."""
    p = command("configs", cmd_configs, "describe or alter topic, broker-default and client quota configs "
                "(kafka-configs)")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--describe", action="store_true")
    action.add_argument("--alter", action="store_true")
    p.add_argument("--entity-type", required=True, action="append", choices=["topics", "brokers", "users", "clients"],
                   help="users and clients may be given together (a (user, client-id) quota)")
    p.add_argument("--entity-name", dest="entity_names", action="append")
    p.add_argument("--entity-default", dest="entity_names", action="append_const", const=None)
    p.add_argument("--add-config", metavar="K=V,K2=V2")
    p.add_argument("--delete-config", metavar="K,K2")

    p = command("reassign", cmd_reassign, "reassign partitions (kafka-reassign-partitions)")
    p.add_argument("--json", required=True, metavar="FILE", help="the reassignment JSON file")
    step = p.add_mutually_exclusive_group(required=True)
    step.add_argument("--execute", action="store_true")
    step.add_argument("--verify", action="store_true")

    p = command("sessions", cmd_sessions, "the leaders' incremental fetch sessions (KIP-227)")
    p.add_argument("--leader", type=int, help="only this leader's session cache")

    p = command("consumer-groups", cmd_consumer_groups, "consumer groups' committed offsets and lag")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true")
    what.add_argument("--describe", action="store_true")
    what.add_argument("--reset-offsets", action="store_true")
    p.add_argument("--group")
    p.add_argument("--topic")
    p.add_argument("--to-earliest", action="store_true")
    p.add_argument("--to-latest", action="store_true")
    p.add_argument("--to-offset", type=int)
    p.add_argument("--execute", action="store_true", help="--reset-offsets commits only with this (as Kafka's tool)")
