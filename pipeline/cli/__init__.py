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
    replog run      --rounds N | --until-committed [--max-rounds 50]
    replog brokers  [--add [--dir LOCATION] | --start B | --decommission B]
    replog reassign --json FILE (--execute | --verify)     (kafka-reassign-partitions' JSON)
    replog configs  --describe | --alter --entity-type topics --entity-name T | --entity-type brokers
                    --entity-default [--add-config k=v,k2=v2] [--delete-config k,k2]
    replog configs  --describe | --alter --entity-type users|clients (--entity-name N | --entity-default)
                    [--entity-type clients (--entity-name C | --entity-default)]
                    [--add-config producer_byte_rate=B,consumer_byte_rate=B] [--delete-config k]
    replog sessions [--leader B]
    replog consumer-groups --list | --describe --group G
                    | --reset-offsets --group G --topic T (--to-earliest | --to-latest | --to-offset N) [--execute]

Every command takes --root PATH (default: $REPLOG_ROOT). Errors print one line, `replog: CODE:
message`, and exit 1; bad arguments exit 2.
"""

from __future__ import annotations

import sys

from pipeline.cli.commands import FILTERS, config_list, describe_line, describe_lines, reassignment_json
from pipeline.cli.parser import build_parser
from pipeline.errors import ReplogError

__all__ = ["main", "FILTERS", "config_list", "describe_line", "describe_lines", "reassignment_json"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__)
    args = parser.parse_args(argv)
    if not args.root:
        parser.error("--root is required (or set REPLOG_ROOT)")
    if getattr(args, "rounds", None) is not None and args.rounds < 1:
        parser.error("--rounds must be >= 1")
    from pipeline.runtime import SparkSetupError
    try:
        args.run(args)
    except ReplogError as err:
        print(f"replog: {err}", file=sys.stderr)
        return 1
    except SparkSetupError as err:
        print(f"replog: {err}", file=sys.stderr)
        return 1
    except ValueError as err:
        print(f"replog: {err}", file=sys.stderr)
        return 1
    return 0
