"""How the commands print a listing: Kafka's tools' aligned columns, or one JSON object per line
(`--output json`). Either way rows stream: the widths come from the first rows only."""

from __future__ import annotations

import json
from itertools import islice
from typing import Any, Iterable, Iterator, Sequence

__all__ = ["emit", "json_line", "aligned"]

# the rows whose widths set the columns (a longer value later only pushes its line)
WIDTH_SAMPLE = 1000


def json_line(row: dict[str, Any]) -> str:
    return json.dumps(row, default=str, sort_keys=False)


def aligned(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Iterator[str]:
    """The header and rows as kafka-consumer-groups prints them: each column left-aligned to its
    widest value, one space between columns."""
    rows = iter(rows)
    first = [["-" if v is None else str(v) for v in row] for row in islice(rows, WIDTH_SAMPLE)]
    widths = [max([len(h)] + [len(r[i]) for r in first]) for i, h in enumerate(header)]

    def line(values: Sequence[str]) -> str:
        return " ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()
    yield line(list(header))
    for r in first:
        yield line(r)
    for row in rows:
        yield line(["-" if v is None else str(v) for v in row])


def emit(output: str, header: Sequence[str], keys: Sequence[str], rows: Iterable[dict[str, Any]]) -> None:
    """Prints dict rows: `keys` in order under `header` (text), or each row's keys as JSON."""
    if output == "json":
        for row in rows:
            print(json_line({k: row[k] for k in keys}))
        return
    for text in aligned(header, ([row[k] for k in keys] for row in rows)):
        print(text)
