"""Run with the project's own Python (.venv), not Airflow's: prepares and inspects the cluster root
the DAG test replicates.

    python airflow_tests/cluster_setup.py create ROOT   a 3-broker cluster, topic `orders` (2 partitions,
                                                       RF 3, min.insync.replicas 3), 30 records produced
    python airflow_tests/cluster_setup.py shrink ROOT   broker 2's fetcher paused, 10 more records, rounds
                                                       until its replicas leave the ISR (manual clock)
    python airflow_tests/cluster_setup.py state ROOT    one JSON line: committed records, ISRs, request statuses
"""

import json
import sys
import time

from pipeline import Cluster, ManualClock, get_spark


def main() -> None:
    what, root = sys.argv[1], sys.argv[2]
    spark = get_spark(app_name="replog-airflow-test")
    if what == "create":
        cluster = Cluster.create(spark, root, brokers=3)
        cluster.create_topic("orders", partitions=2, replication_factor=3, config={"min.insync.replicas": "3"})
        cluster.produce("orders", [{"key": f"k{i}", "value": f"v{i}"} for i in range(30)], acks="all")
    elif what == "shrink":
        # the cluster clock runs a minute behind the wall here, so the job's later system-clock
        # rounds never see time go backwards
        clock = ManualClock(start_ms=time.time_ns() // 1_000_000 - 60_000)
        cluster = Cluster.open(spark, root, clock=clock)
        cluster.pause_fetcher(2)
        cluster.produce("orders", [{"key": f"k{i}", "value": f"v{i}"} for i in range(30, 40)], acks="1")
        cluster.run_round()
        clock.advance(cluster.config["replica.lag.time.max.ms"] + 1)
        cluster.run_round()
    elif what == "state":
        cluster = Cluster.open(spark, root)
        print("STATE " + json.dumps({
            "committed": cluster.read("orders").count(),
            "isr": {r["partition"]: r["isr"] for r in cluster.describe("orders").collect()},
            "statuses": sorted({r["status"] for r in cluster.produce_results().collect()}),
        }), flush=True)
    else:
        raise SystemExit(f"unknown step {what!r}")


if __name__ == "__main__":
    main()
