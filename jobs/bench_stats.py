"""What Delta's file statistics cost a round's appends: the same rows appended to tables that keep
statistics on Delta's default first 32 columns, on the columns the cluster's tables keep them on
(pipeline/storage/tables.py: replica_state and results their 3 leading key columns; a log topic,
partition, offset and timestamp), and on none.

    .venv/bin/python jobs/bench_stats.py [--repeats 10]

Rows as a round writes them: replica_state rows of 5,000 partitions (15,000 rows) and 6,000 log
rows with 100-byte values, under the round's Spark settings (pipeline.runtime.tuning.FAST_CONFS:
interpreted expressions). The tables are appended to in turn, in one process; medians after the
first two appends. Writes benchmarks/stats.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pyspark.sql import functions as F  # noqa: E402

from bench_round import machine, save  # noqa: E402  (jobs/ is scripts, not a package)
from pipeline import get_spark  # noqa: E402
from pipeline.schemas import LOG_SCHEMA, REPLICA_STATE_SCHEMA, RESULTS_SCHEMA  # noqa: E402
from pipeline.storage import LOG_PROPS, table_props  # noqa: E402

WARM_UP = 2
STATS_KEYS = ("delta.dataSkippingNumIndexedCols", "delta.dataSkippingStatsColumns")


def _settings(table: str) -> dict[str, dict[str, str]]:
    """The statistics settings compared for `table`: Delta's default, the cluster's, none."""
    props = LOG_PROPS if table == "log" else table_props(table)
    return {"default (32 columns)": {}, "the cluster's": {k: v for k, v in props.items() if k in STATS_KEYS},
            "none": {"delta.dataSkippingNumIndexedCols": "0"}}


def _rows(spark, schema, n: int):
    """n rows of `schema`: a constant topic, ids, and 100-byte binary values."""
    columns = []
    for field in schema.fields:
        kind = field.dataType.simpleString()
        if field.name == "topic":
            column = F.lit("events")
        elif kind == "string":
            column = F.concat(F.lit("r"), F.col("id").cast("string"))
        elif kind == "binary":
            column = F.expr("cast(repeat('v', 100) AS binary)")
        else:
            column = (F.col("id") % 1000).cast(kind)
        columns.append(column.alias(field.name))
    return spark.range(n).select(*columns).localCheckpoint()


def measure(spark, scratch: str, repeats: int) -> dict:
    figures = {}
    for name, schema, n in (("replica_state", REPLICA_STATE_SCHEMA, 15_000), ("log", LOG_SCHEMA, 6_000),
                            ("results", RESULTS_SCHEMA, 5_000)):
        rows = _rows(spark, schema, n)
        paths = {}
        for label, props in _settings(name).items():
            path = os.path.join(scratch, f"{name}-{len(paths)}")
            rows.limit(0).write.format("delta").save(path)
            for key, value in props.items():
                spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{key}' = '{value}')")
            paths[label] = path
        seconds = {label: [] for label in paths}
        for _ in range(repeats + WARM_UP):
            for label, path in paths.items():
                started = time.perf_counter()
                rows.write.format("delta").mode("append").save(path)
                seconds[label].append(time.perf_counter() - started)
        medians = {label: statistics.median(s[WARM_UP:]) for label, s in seconds.items()}
        default = medians["default (32 columns)"]
        figures[name] = {"rows": n, "median_s": medians,
                         "ratio_to_default": {label: m / default for label, m in medians.items()}}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/stats.json")
    args = parser.parse_args()
    spark = get_spark(app_name="replog-bench-stats")
    scratch = tempfile.mkdtemp(prefix="replog-stats-")
    try:
        figures = measure(spark, scratch, args.repeats)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    data = {"machine": machine(spark),
            "command": f"jobs/bench_stats.py --repeats {args.repeats}", "results": figures}
    for name, f in figures.items():
        line = ", ".join(f"{label} {s:.3f} s ({f['ratio_to_default'][label]:.2f}x)" for label, s in f["median_s"].items())
        print(f"{name} ({f['rows']} rows): {line}")
    save(data, args.out)


if __name__ == "__main__":
    main()
