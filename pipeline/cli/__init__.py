"""`replog`: a Kafka-style command line for a cluster root.

    replog cluster  --create --brokers 3 [--conf-file F] [--config key=value ...]
                    (broker.<id>.log.dirs=LOCATION: a broker's storage location)
    replog topics   --create --topic T --partitions N --replication-factor RF [--config key=value ...]
    replog topics   --list | --describe [--topic T] [--under-replicated-partitions |
                    --under-min-isr-partitions | --unavailable-partitions]
    replog produce  --topic T [--acks all] [--file F] [--key-separator SEP] [--partition P] [--client-id C] [--user U]
                    (lines from stdin)
    replog consume  --topic T (--from-beginning | --offset N) [--partition P] [--replica B]
                    [--isolation read_committed|read_uncommitted] [--print-key]
    replog run      --rounds N | --until-committed (or --available-now) [--max-rounds 50]
    replog job      [--available-now] [--conf-file F] [--metrics-port P] [--master M] (the replication job)
    replog brokers  [--add [--dir LOCATION] | --start B | --decommission B]
    replog reassign --json FILE (--execute [--wait] | --verify)     (kafka-reassign-partitions' JSON)
    replog configs  --describe | --alter --entity-type topics --entity-name T | --entity-type brokers
                    --entity-default [--add-config k=v,k2=v2] [--delete-config k,k2]
    replog configs  --describe | --alter --entity-type users|clients (--entity-name N | --entity-default)
                    [--entity-type clients (--entity-name C | --entity-default)]
                    [--add-config producer_byte_rate=B,consumer_byte_rate=B] [--delete-config k]
    replog sessions [--leader B]
    replog consumer-groups --list | --describe --group G
                    | --reset-offsets --group G --topic T (--to-earliest | --to-latest | --to-offset N) [--execute]
    replog produce-results [--request ID] [--topic T]
    replog sql "SELECT ... FROM replog.committed ..."   (the replog.* views)

Every command takes --root PATH (default: $REPLOG_ROOT), before or after the command, and
--verbose (the JVM's and Spark's log lines, which are hidden otherwise); listings take --output
json (one JSON object per line). Errors print one line, `replog: CODE: message` with Kafka's
error name, and exit 1; bad arguments exit 2.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback

from pipeline.cli.admin import config_list, reassignment_json
from pipeline.cli.commands import FILTERS, UsageError, describe_line, describe_lines
from pipeline.cli.parser import build_parser
from pipeline.errors import ErrorCode, ReplogError

__all__ = ["main", "FILTERS", "config_list", "describe_line", "describe_lines", "reassignment_json"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__)
    args = parser.parse_args(argv)
    args.root = args.root or os.environ.get("REPLOG_ROOT")
    if not args.root:
        parser.error("--root is required (or set REPLOG_ROOT)")
    if getattr(args, "rounds", None) is not None and args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if not args.verbose:
        logging.disable(logging.CRITICAL)  # PySpark's own loggers (a failed query's context, as JSON)
    try:
        return _run(args)
    finally:
        logging.disable(logging.NOTSET)


def _run(args) -> int:
    from pipeline.runtime import SparkSetupError
    try:
        _check_root(args)
        args.run(args)
    except UsageError as err:
        print(f"replog {args.command}: error: {err}", file=sys.stderr)
        return 2
    except (ReplogError, SparkSetupError, ValueError) as err:
        print(f"replog: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # a JVM or Spark failure the commands do not name: one line, or all of it
        if args.verbose:
            traceback.print_exc()
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        print(f"replog: {ErrorCode.UNKNOWN_SERVER_ERROR}: {type(err).__name__}: {first}"
              + ("" if args.verbose else " (--verbose shows more)"), file=sys.stderr)
        return 1
    return 0


def _check_root(args) -> None:
    """A local root that holds no cluster is reported before a JVM starts (a URI is checked by
    Cluster.open, through Spark)."""
    from pipeline.storage.tables import is_uri
    if args.command == "cluster" or is_uri(args.root):
        return
    if not os.path.isdir(os.path.join(args.root, "cluster", "cluster", "_delta_log")):
        raise ReplogError(ErrorCode.CLUSTER_NOT_FOUND,
                          f"{os.path.abspath(args.root)} holds no cluster (create one: replog cluster --create)")
