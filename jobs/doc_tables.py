"""The docs' generated tables, from the code's own definitions so they cannot drift:

- README.md's configuration table, from pipeline/config.py's keys (name, Kafka's default, where
  it may be set, what it does);
- docs/design.md's tables and columns, from pipeline/storage/layout.py's tables and their schemas.

    python jobs/doc_tables.py           # rewrite both between their markers
    python jobs/doc_tables.py --check   # exit 1 when either is out of date (tests/test_docs.py)
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

README = os.path.join(ROOT, "README.md")
DESIGN = os.path.join(ROOT, "docs", "design.md")
CONFIG_MARK = "config-table"
TABLES_MARK = "storage-tables"


def _default(value: object) -> str:
    from pipeline.config import LONG_MAX
    if isinstance(value, bool):
        return str(value).lower()
    if value == "":
        return "(empty)"
    if value == LONG_MAX:
        return "Long.MAX_VALUE"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def config_table() -> str:
    """Every cluster key: its default, whether a topic may override it, and what it does."""
    from pipeline.config import CLUSTER_KEYS, TOPIC_KEYS
    out = ["| key | default | set on | allowed | meaning |", "|---|---|---|---|---|"]
    for key in CLUSTER_KEYS.values():
        scope = "cluster, topic" if key.name in TOPIC_KEYS else "cluster"
        out.append(f"| `{key.name}` | {_default(key.default)} | {scope} | {_cell(key.rule)} | {_cell(key.doc)} |")
    return "\n".join(out)


def storage_tables() -> str:
    """Every table of a root and a broker's log, with its columns and their types."""
    from pipeline.storage.layout import CLUSTER_TABLES, TABLE_DOCS
    from pipeline.schemas import LOG_SCHEMA
    out = ["| table | what a row is | columns |", "|---|---|---|"]
    for name, schema in [*CLUSTER_TABLES.items(), ("log", LOG_SCHEMA)]:
        where = "`<broker location>/log`" if name == "log" else f"`<root>/cluster/{name}`"
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in schema.fields)
        out.append(f"| {where} | {TABLE_DOCS[name]} | {_cell(columns)} |")
    return "\n".join(out)


def replace_block(text: str, mark: str, body: str) -> str:
    begin, end = f"<!-- {mark} -->", f"<!-- /{mark} -->"
    if begin not in text or end not in text:
        raise ValueError(f"no {begin} ... {end} markers")
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + "\n" + body + "\n" + text[stop:]


def updated() -> dict[str, tuple[str, str]]:
    """Each generated file: (as it is, as it should be)."""
    out = {}
    for path, mark, body in ((README, CONFIG_MARK, config_table()), (DESIGN, TABLES_MARK, storage_tables())):
        with open(path) as f:
            text = f.read()
        out[path] = (text, replace_block(text, mark, body))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated table is out of date")
    args = parser.parse_args()
    stale = [path for path, (now, want) in updated().items() if now != want]
    if args.check:
        for path in stale:
            print(f"{os.path.relpath(path, ROOT)} is out of date: run python jobs/doc_tables.py", file=sys.stderr)
        return 1 if stale else 0
    for path, (now, want) in updated().items():
        if now != want:
            with open(path, "w") as f:
                f.write(want)
            print(f"rewrote {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
