"""The `replog` command line's flags: one subcommand per Kafka tool. `--root`, `--verbose` and
`--output` are accepted before or after the subcommand."""

from __future__ import annotations

import argparse
from typing import Callable

from pipeline.cli.admin import cmd_brokers, cmd_configs, cmd_consumer_groups, cmd_reassign, cmd_sessions
from pipeline.cli.commands import (FILTERS, cmd_cluster, cmd_consume, cmd_job, cmd_maintain, cmd_produce,
                                   cmd_produce_results, cmd_run, cmd_serve, cmd_sql, cmd_topics)

__all__ = ["build_parser", "version_text"]

ROOT_HELP = "the cluster's root: a path or a URI Spark can read (default: $REPLOG_ROOT)"
VERBOSE_HELP = "show the JVM's, Spark's and Hadoop's log lines and a traceback on an unexpected error"
OUTPUT_HELP = "text (Kafka's tools' layout, the default) or json (one JSON object per line)"

# subcommands whose answer is a listing: they take --output json
_LISTINGS = {"topics", "brokers", "produce-results", "sessions", "consumer-groups", "configs", "sql"}


def version_text() -> str:
    """`replog --version`: this package's version and the Spark and Delta Lake it runs on, read
    from the installed packages' metadata (no JVM)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"
    return f"replog {of('replog')} (pyspark {of('pyspark')}, delta-spark {of('delta-spark')})"


def _common(p: argparse.ArgumentParser, top: bool, listing: bool) -> None:
    """The flags every command takes. On a subcommand their default is SUPPRESS, so a value given
    before the subcommand is not overwritten by the subcommand's default."""
    hidden = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("--root", help=ROOT_HELP, **hidden)
    p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP, **hidden)
    if top or listing:
        p.add_argument("--output", choices=["text", "json"], help=OUTPUT_HELP,
                       **({"default": "text"} if top else hidden))


def build_parser(usage: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="replog", description=usage,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version_text(), help="print the version and exit")
    _common(parser, top=True, listing=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[[argparse.Namespace], None], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _common(p, top=False, listing=name in _LISTINGS)
        p.set_defaults(run=run)
        return p

    for add in (_metadata_commands, _data_commands, _admin_commands):
        add(command)
    return parser


Command = Callable[[str, Callable[[argparse.Namespace], None], str], argparse.ArgumentParser]


def _one_of(p: argparse.ArgumentParser, required: bool, *flags: tuple[str, str]) -> None:
    """Mutually exclusive switches, each (flag, help)."""
    group = p.add_mutually_exclusive_group(required=required)
    for flag, help_text in flags:
        group.add_argument(flag, action="store_true", help=help_text)


def _metadata_commands(command: Command) -> None:
    """cluster, topics, brokers."""
    p = command("cluster", cmd_cluster, "create a cluster")
    p.add_argument("--create", action="store_true", help="create the cluster's tables and broker logs at --root")
    p.add_argument("--brokers", type=int, default=3, help="how many brokers (default 3)")
    p.add_argument("--config", action="append", metavar="KEY=VALUE",
                   help="a cluster config (Kafka's key names); broker.<id>.log.dirs=LOCATION places a broker")
    p.add_argument("--conf-file", metavar="FILE", help="a replog.properties file (--config overrides it)")

    p = command("topics", cmd_topics, "create, list, describe topics (kafka-topics)")
    _one_of(p, True, ("--create", "create --topic"), ("--list", "the topics' names"),
            ("--describe", "each partition's leader, replicas, ISR, HW and LEO"))
    p.add_argument("--topic", help="the topic to create or describe (describe: default every topic)")
    p.add_argument("--partitions", type=int, default=1, help="with --create: how many partitions (default 1)")
    p.add_argument("--replication-factor", type=int, default=1, help="with --create: replicas per partition (default 1)")
    p.add_argument("--config", action="append", metavar="KEY=VALUE", help="with --create: a topic config override")
    health = p.add_mutually_exclusive_group()
    for flag in FILTERS:
        health.add_argument("--" + flag.replace("_", "-"), dest=flag, action="store_true",
                            help=f"with --describe: only the {flag.replace('_', ' ')}")

    p = command("brokers", cmd_brokers, "brokers with their state, leader counts and locations; add, start or "
                "decommission one")
    change = p.add_mutually_exclusive_group()
    change.add_argument("--add", action="store_true", help="register a new empty broker")
    change.add_argument("--decommission", type=int, metavar="B", help="move every replica off broker B")
    change.add_argument("--start", type=int, metavar="B",
                        help="restart stopped broker B (one a failed log directory halted: once its location is back)")
    p.add_argument("--dir", metavar="LOCATION", help="with --add: the new broker's storage location (path or URI)")


def _data_commands(command: Command) -> None:
    """produce, produce-results, consume, run, maintain."""
    p = command("produce", cmd_produce, "send lines (stdin or --file) as records (kafka-console-producer)")
    p.add_argument("--topic", required=True, help="the topic to send to")
    p.add_argument("--acks", default="1", choices=["0", "1", "-1", "all"], help="Kafka's acks (default 1)")
    p.add_argument("--file", help="read the lines from this file instead of stdin")
    p.add_argument("--key-separator", metavar="SEP", help="a line's text before SEP is its key, after it its value")
    p.add_argument("--partition", type=int, help="send every line to this partition (default: the partitioner)")
    p.add_argument("--client-id", help="Kafka's client.id: selects the client's produce quota")
    p.add_argument("--user", help="the user the client authenticated as (user quotas)")

    p = command("produce-results", cmd_produce_results, "a produce request's status per partition: pending, "
                "acked (with its offsets), error (with Kafka's error name) or throttled")
    p.add_argument("--request", metavar="ID", help="the request id `replog produce` printed (default: every request)")
    p.add_argument("--topic", help="only this topic's results")

    p = command("consume", cmd_consume, "print records (kafka-console-consumer): what is there, then exit")
    p.add_argument("--topic", required=True, help="the topic to read")
    p.add_argument("--from-beginning", action="store_true", help="from each partition's log start")
    p.add_argument("--offset", type=int, help="from this offset (OFFSET_OUT_OF_RANGE below the log start)")
    p.add_argument("--partition", type=int, help="only this partition")
    p.add_argument("--replica", type=int, metavar="B", help="read broker B's replica instead of the leader's")
    p.add_argument("--isolation", default="read_committed", choices=["read_committed", "read_uncommitted"],
                   help="read_committed (the default) stops at the HW, read_uncommitted at the log end")
    p.add_argument("--print-key", action="store_true", help="print each record's key, a tab, then its value")

    p = command("run", cmd_run, "run fetch rounds in this process (the replication job's rounds)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--rounds", type=int, help="run this many rounds")
    how.add_argument("--until-committed", "--available-now", dest="until_committed", action="store_true",
                     help="run rounds until every produce request is answered and every partition settled "
                     "(the job's --available-now)")
    p.add_argument("--max-rounds", type=int, default=50, help="--until-committed gives up after this many")

    p = command("sql", cmd_sql, "run a Spark SQL query over the replog.* views (replog.committed, replog.partitions, "
                "replog.rounds, ...)")
    p.add_argument("query", help='the query, e.g. "SELECT topic, count(*) FROM replog.committed GROUP BY topic"')

    p = command("job", cmd_job, "start the replication job under spark-submit (the installed package's "
                "pipeline/jobs/replicate.py, with the cached Delta jars)")
    p.add_argument("--available-now", action="store_true", help="rounds until all is committed, then exit 0")
    p.add_argument("--conf-file", help="a replog.properties whose keys the job checks and applies")
    p.add_argument("--trigger-interval", help="time between rounds (default: replica.fetch.wait.max.ms)")
    p.add_argument("--checkpoint", help="the streaming checkpoint (default ROOT/checkpoints/replicate)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument("--figures-interval", help="how often the replog-rounds query reports the rounds' figures in "
                   "Structured Streaming's progress (default: every round; off: not at all)")
    p.add_argument("--max-stalled-rounds", type=int, help="--available-now stops after this many idle rounds")
    p.add_argument("--master", default="local[2]", help="Spark's master (default local[2]; spark://HOST:7077, yarn)")
    p.add_argument("--spark-conf", action="append", metavar="KEY=VALUE", help="a Spark setting for the job")
    p.add_argument("--print-command", action="store_true", help="print the spark-submit command instead of running it")

    command("maintain", cmd_maintain, "compact small files, VACUUM and set log retention on every table and log")

    p = command("serve", cmd_serve, "serve Kafka's protocol for the cluster, so stock Kafka clients produce "
                "and consume")
    p.add_argument("--listen", default="127.0.0.1:9092", help="HOST:PORT to listen on (default 127.0.0.1:9092; "
                   "port 0: a free one)")
    p.add_argument("--run-rounds", action="store_true", help="run the replication rounds in this process "
                   "(without it, a replication job on the root runs them)")
    p.add_argument("--round-interval-ms", type=int, default=1000, metavar="MS",
                   help="with --run-rounds: a round every MS when idle, at once for a produce request (default 1000)")


def _admin_commands(command: Command) -> None:
    """configs, reassign, sessions, consumer-groups."""
    p = command("configs", cmd_configs, "describe or alter topic, broker-default and client quota configs "
                "(kafka-configs)")
    _one_of(p, True, ("--describe", "print the configs"), ("--alter", "change them (--add-config, --delete-config)"))
    p.add_argument("--entity-type", required=True, action="append", choices=["topics", "brokers", "users", "clients"],
                   help="users and clients may be given together (a (user, client-id) quota)")
    p.add_argument("--entity-name", dest="entity_names", action="append",
                   help="the topic, user or client-id (one per --entity-type)")
    p.add_argument("--entity-default", dest="entity_names", action="append_const", const=None,
                   help="the default entity (brokers: the cluster-wide defaults)")
    p.add_argument("--add-config", metavar="K=V,K2=V2", help="configs to set (a value with commas in brackets)")
    p.add_argument("--delete-config", metavar="K,K2", help="configs to remove (back to the default)")

    p = command("reassign", cmd_reassign, "reassign partitions (kafka-reassign-partitions)")
    p.add_argument("--json", required=True, metavar="FILE", help="the reassignment JSON file")
    _one_of(p, True, ("--execute", "start the reassignment (the next round applies it)"),
            ("--verify", "print each partition's progress"))
    p.add_argument("--wait", action="store_true", help="with --execute: run rounds here until it completes, "
                   "showing the records the new replicas have left to fetch")
    p.add_argument("--max-rounds", type=int, default=200, help="--wait gives up after this many rounds")

    p = command("sessions", cmd_sessions, "the leaders' incremental fetch sessions (KIP-227)")
    p.add_argument("--leader", type=int, help="only this leader's session cache")

    p = command("consumer-groups", cmd_consumer_groups, "consumer groups' committed offsets and lag "
                "(kafka-consumer-groups)")
    _one_of(p, True, ("--list", "the groups' names"), ("--describe", "a group's offsets, log end offsets and lag"),
            ("--reset-offsets", "set a group's offsets for --topic (a dry run without --execute)"))
    p.add_argument("--group", help="the consumer group")
    p.add_argument("--topic", help="with --reset-offsets: the topic whose offsets are set")
    p.add_argument("--to-earliest", action="store_true", help="each partition's log start offset")
    p.add_argument("--to-latest", action="store_true", help="each partition's high watermark")
    p.add_argument("--to-offset", type=int, help="this offset")
    p.add_argument("--execute", action="store_true", help="--reset-offsets commits only with this (as Kafka's tool)")
