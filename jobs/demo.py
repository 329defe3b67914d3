"""`make demo`: the main job on an embedded default.

A local cluster root under the working directory, 3 brokers, a demo topic (6 partitions, RF 3,
min.insync.replicas 2), a producer sending acks=all records, rounds until every record is
committed, then the describe table, the replica table and a Spark SQL query of committed data.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time

from pyspark.sql import functions as F

from pipeline import Cluster, get_spark
from pipeline.runtime import SparkSetupError

MAX_ROUNDS = 10


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default="demo-root", help="cluster root (recreated)")
    parser.add_argument("--records", type=int, default=1000)
    args = parser.parse_args(argv)

    try:
        spark = get_spark(app_name="replog-demo")
    except SparkSetupError as err:
        print(f"demo: {err}", file=sys.stderr)
        return 1
    shutil.rmtree(args.root, ignore_errors=True)
    cluster = Cluster.create(spark, args.root, brokers=3)
    cluster.create_topic("demo", partitions=6, replication_factor=3, config={"min.insync.replicas": "2"})
    records = [{"key": f"user-{i % 50}", "value": f"event {i}"} for i in range(args.records)]
    request_id = cluster.produce("demo", records, acks="all")
    print(f"produced {args.records} records to 'demo' (acks=all), request {request_id}")

    for _ in range(MAX_ROUNDS):
        started = time.perf_counter()
        report = cluster.run_round()
        print(f"round {report.round_id}: appended {report.records_appended}, replicated "
              f"{report.records_replicated}, acked {report.requests_acked}, pending {report.pending_requests} "
              f"({time.perf_counter() - started:.1f} s)")
        if cluster.caught_up(report):
            break
    print("\nkafka-topics --describe:")
    cluster.describe("demo").orderBy("partition").show(truncate=False)
    print("replicas:")
    cluster.replicas("demo").orderBy("partition", "broker").show(truncate=False)
    print("committed records per partition (Spark SQL on replog.committed):")
    spark.sql("SELECT partition, count(*) AS records, max(offset) AS last_offset FROM replog.committed "
              "WHERE topic = 'demo' GROUP BY partition ORDER BY partition").show()
    statuses = cluster.produce_results().groupBy("status").agg(F.count(F.lit(1)).alias("partitions")).collect()
    print("produce request status per partition:", {r["status"]: r["partitions"] for r in statuses})
    committed = spark.sql("SELECT count(*) AS n FROM replog.committed WHERE topic = 'demo'").first()["n"]
    return 0 if committed == args.records else 1


if __name__ == "__main__":
    sys.exit(main())
