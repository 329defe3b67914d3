"""What making a cluster costs: its 21 tables and 3 brokers' logs created one after another
(Storage._create for each) and at once (Storage.create_tables, from threads), in turn in one
process; then Cluster.create and create_topic as a user calls them.

    .venv/bin/python jobs/bench_create.py [--repeats 6]

Medians after the first of each. Writes benchmarks/create.json.
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

from bench_round import machine, save  # noqa: E402  (jobs/ is scripts, not a package)
from pipeline import Cluster, ManualClock, get_spark  # noqa: E402
from pipeline.storage import CLUSTER_TABLES, Storage, table_props  # noqa: E402

BROKERS = 3


def one_after_another(storage: Storage) -> None:
    for name, schema in CLUSTER_TABLES.items():
        if name != "cluster":
            storage._create(storage.path(name), schema, table_props(name))
    for broker in range(BROKERS):
        storage.create_log(broker)


def at_once(storage: Storage) -> None:
    storage.create_tables(list(range(BROKERS)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--out", default="benchmarks/create.json")
    args = parser.parse_args()
    spark = get_spark(app_name="replog-bench-create")
    scratch = tempfile.mkdtemp(prefix="replog-create-")
    ways = {"one after another": one_after_another, "at once": at_once}
    seconds = {way: [] for way in ways}
    create_s, topic_s = [], []
    try:
        for i in range(args.repeats + 1):
            for way, make in ways.items():
                storage = Storage(spark, os.path.join(scratch, f"{len(seconds[way])}-{way.replace(' ', '-')}"))
                started = time.perf_counter()
                make(storage)
                seconds[way].append(time.perf_counter() - started)
            started = time.perf_counter()
            cluster = Cluster.create(spark, os.path.join(scratch, f"cluster{i}"), brokers=BROKERS,
                                     clock=ManualClock(start_ms=0))
            create_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            cluster.create_topic("orders", partitions=3, replication_factor=3)
            topic_s.append(time.perf_counter() - started)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    medians = {way: statistics.median(s[1:]) for way, s in seconds.items()}
    data = {"machine": machine(spark),
            "command": f"jobs/bench_create.py --repeats {args.repeats}",
            "results": {"tables_median_s": medians, "ratio": medians["at once"] / medians["one after another"],
                        "cluster_create_median_s": statistics.median(create_s[1:]),
                        "create_topic_median_s": statistics.median(topic_s[1:]),
                        "tables_s": seconds, "cluster_create_s": create_s, "create_topic_s": topic_s}}
    for way, m in medians.items():
        print(f"tables {way}: {m:.2f} s")
    r = data["results"]
    print(f"ratio {r['ratio']:.2f}; Cluster.create {r['cluster_create_median_s']:.2f} s, "
          f"create_topic {r['create_topic_median_s']:.2f} s")
    save(data, args.out)


if __name__ == "__main__":
    main()
