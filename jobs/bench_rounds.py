"""The benchmark's round scenarios (jobs/benchmark.py has their descriptions): fetch-sessions
(incremental against full rounds), throughput (a bulk load end to end against a raw Delta append)
and produce (the inbox write of a bulk load); and the helpers every scenario shares."""

from __future__ import annotations

import os
import random
import shutil
import statistics
import tempfile
import time

from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock
from pipeline.cli.progress import CatchUpProgress


MODES = ("incremental", "full")


STEP_MS = 500  # the default trigger interval: replica.fetch.wait.max.ms


def process_status_mb(pid: int, field: str = "VmHWM") -> float | None:
    """A memory figure of a process from Linux /proc, MB: VmHWM its peak resident set, VmRSS the
    resident set now."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def jvm_status_mb(spark, field: str = "VmHWM") -> float | None:
    """process_status_mb of this session's driver JVM."""
    try:
        pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    except AttributeError:
        return None
    return process_status_mb(pid, field)


def job_jvm_peak_rss_mb(pid: int) -> float | None:
    """The peak resident set of a spark-submit job's driver JVM, MB: spark-submit execs the JVM, so
    it is the subprocess's own pid (None when that process is not a JVM)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != "java":
                return None
    except OSError:
        return None
    return process_status_mb(pid)


def child_env() -> dict[str, str]:
    """This process's environment without the variables that tie pyspark to its own JVM, for a
    subprocess that starts a session of its own (spark-submit, replog)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_GATEWAY", "SPARK_"))}


def produce_steady(cluster: Cluster, rng: random.Random, partitions: int, changed: int) -> None:
    """Steady traffic before a round: one record into each of `changed` random partitions, acks=1."""
    cluster.produce("bench", [{"value": f"v{rng.random()}", "partition": p}
                              for p in rng.sample(range(partitions), min(changed, partitions))], acks=1)


def timed_round(cluster: Cluster) -> tuple[float, object]:
    started = time.perf_counter()
    report = cluster.run_round()
    return time.perf_counter() - started, report


def fetch_sessions(spark, partitions: int, changed: int, rounds: int, warm_up: int, idle_rounds: int,
                   seed: int) -> dict:
    rng = random.Random(seed)
    workdir = tempfile.mkdtemp(prefix=f"bench-{partitions}-")
    clock = ManualClock(start_ms=0)
    clusters = {}
    try:
        for mode in MODES:
            cluster = Cluster.create(spark, os.path.join(workdir, mode), brokers=3, clock=clock,
                                     config={"replication.fetch.mode": mode})
            cluster.create_topic("bench", partitions=partitions, replication_factor=3)
            clusters[mode] = cluster
        samples = {mode: {"active": [], "idle": [], "request": [], "response": []} for mode in MODES}
        for i in range(warm_up + rounds):
            chosen = rng.sample(range(partitions), min(changed, partitions))
            clock.advance(STEP_MS)
            for mode in MODES:
                clusters[mode].produce("bench", [{"value": "v" * 100, "partition": p} for p in chosen], acks=1)
                seconds, report = timed_round(clusters[mode])
                if i >= warm_up:
                    samples[mode]["active"].append(seconds)
                    samples[mode]["request"].append(report.fetch_request_partitions)
                    samples[mode]["response"].append(report.fetch_response_partitions)
            print(f"P={partitions} round {i + 1}/{warm_up + rounds}: "
                  + ", ".join(f"{m} {samples[m]['active'][-1]:.2f} s" for m in MODES if samples[m]["active"]),
                  flush=True)
        for _ in range(5):  # let the last changes settle
            clock.advance(STEP_MS)
            for mode in MODES:
                clusters[mode].run_round()
        for _ in range(idle_rounds):
            clock.advance(STEP_MS)
            for mode in MODES:
                seconds, _ = timed_round(clusters[mode])
                samples[mode]["idle"].append(seconds)
        out = {"partitions": partitions, "changed_per_round": changed, "rounds": rounds, "idle_rounds": idle_rounds}
        for mode in MODES:
            s = samples[mode]
            out[mode] = {
                "active_median_s": statistics.median(s["active"]),
                "idle_median_s": statistics.median(s["idle"]),
                "request_partitions_median": statistics.median(s["request"]),
                "response_partitions_median": statistics.median(s["response"]),
                "active_s": s["active"], "idle_s": s["idle"],
            }
        out["driver_jvm_peak_rss_mb"] = jvm_status_mb(spark)
        return out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def ratios(results: list[dict]) -> dict:
    small, large = results[0], results[-1]
    inc, full = "incremental", "full"
    return {
        "incremental_large_over_small": large[inc]["active_median_s"] / small[inc]["active_median_s"],
        "full_over_incremental_at_largest": large[full]["active_median_s"] / large[inc]["active_median_s"],
        "idle_large_over_small": large[inc]["idle_median_s"] / small[inc]["idle_median_s"],
        "small_partitions": small["partitions"], "large_partitions": large["partitions"],
    }


def table(data: dict) -> str:
    lines = [f"Machine: {data['machine']}. Command: `{data['command']}`.", "",
             "| P | incremental round (s) | full round (s) | idle round (s) | request partitions inc / full "
             "| response partitions inc / full | driver JVM peak RSS (MB) |",
             "|---|---|---|---|---|---|---|"]
    for r in data["results"]:
        inc, full = r["incremental"], r["full"]
        rss = f"{r['driver_jvm_peak_rss_mb']:.0f}" if r["driver_jvm_peak_rss_mb"] else "-"
        lines.append(f"| {r['partitions']:,} | {inc['active_median_s']:.2f} | {full['active_median_s']:.2f} "
                     f"| {inc['idle_median_s']:.2f} | {inc['request_partitions_median']:.0f} / "
                     f"{full['request_partitions_median']:.0f} | {inc['response_partitions_median']:.0f} / "
                     f"{full['response_partitions_median']:.0f} | {rss} |")
    q = data["ratios"]
    lines += ["", f"Incremental at P={q['large_partitions']:,} / at P={q['small_partitions']:,}: "
                  f"{q['incremental_large_over_small']:.2f}x (target <= 1.5x); full / incremental at "
                  f"P={q['large_partitions']:,}: {q['full_over_incremental_at_largest']:.2f}x (target >= 10x); idle at "
                  f"P={q['large_partitions']:,} / at P={q['small_partitions']:,}: {q['idle_large_over_small']:.2f}x "
                  f"(target <= 1.2x)."]
    return "\n".join(lines)


def plot(data: dict, path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (make bench installs it): no plot")
        return False
    ps = [r["partitions"] for r in data["results"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ps, [r["incremental"]["active_median_s"] for r in data["results"]], "o-", label="incremental, active")
    ax.plot(ps, [r["full"]["active_median_s"] for r in data["results"]], "s-", label="full, active")
    ax.plot(ps, [r["incremental"]["idle_median_s"] for r in data["results"]], "^--", label="incremental, idle")
    ax.set_xscale("log")
    ax.set_xlabel("partitions (P)")
    ax.set_ylabel("round median (s)")
    ax.set_title(f"KIP-227 rounds, k={data['results'][0]['changed_per_round']} changed partitions per round")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def _bulk_rows(spark, records: int, partitions: int, value_bytes: int):
    """N records of V-byte values with explicit partitions (the throughput and produce scenarios')."""
    return spark.range(records).select(
        (F.col("id") % partitions).cast("int").alias("partition"),
        F.expr(f"CAST(repeat('x', {value_bytes}) AS BINARY)").alias("value"))


def _bench_cluster(workdir: str, spark, partitions: int, config: dict | None = None) -> tuple:
    """(cluster, clock): 3 brokers, one RF-3 topic `bench` of P partitions, under workdir."""
    clock = ManualClock(start_ms=0)
    cluster = Cluster.create(spark, os.path.join(workdir, "cluster"), brokers=3, clock=clock, config=config)
    cluster.create_topic("bench", partitions=partitions, replication_factor=3)
    return cluster, clock


def throughput(spark, records: int, partitions: int, value_bytes: int, max_rounds: int,
               config: dict | None = None) -> dict:
    workdir = tempfile.mkdtemp(prefix="bench-throughput-")
    try:
        rows = _bulk_rows(spark, records, partitions, value_bytes)
        started = time.perf_counter()  # the raw write limit: the same rows, appended once
        rows.write.format("delta").save(os.path.join(workdir, "raw"))
        raw_s = time.perf_counter() - started

        cluster, clock = _bench_cluster(workdir, spark, partitions, config)
        rounds = []
        started = time.perf_counter()
        cluster.produce("bench", rows, acks=1)
        produce_s = time.perf_counter() - started
        # records left: the copies the 3 replicas still have to write (a live bar on a terminal)
        progress, left = CatchUpProgress(3 * records), 3 * records
        for n in range(1, max_rounds + 1):
            clock.advance(STEP_MS)
            seconds, report = timed_round(cluster)
            rounds.append({"s": seconds, "appended": report.records_appended, "replicated": report.records_replicated})
            left -= report.records_appended + report.records_replicated
            progress.left(report.round_id, left)
            if cluster.caught_up(report):
                break
        progress.close()
        replicated_s = time.perf_counter() - started
        leo = {r["broker"]: r["leo"] for r in cluster.replicas("bench").groupBy("broker").agg(
            F.sum("log_end_offset").alias("leo")).collect()}
        done = all(v == records for v in leo.values()) and len(leo) == 3
        mb = records * value_bytes / 1e6
        return {
            "records": records, "partitions": partitions, "value_bytes": value_bytes, "complete": done,
            "raw_s": raw_s, "raw_records_per_s": records / raw_s, "raw_mb_per_s": mb / raw_s,
            "replicated_s": replicated_s, "produce_s": produce_s, "rounds": len(rounds),
            "replicated_records_per_s": records / replicated_s, "replicated_mb_per_s": mb / replicated_s,
            "ratio": raw_s / replicated_s, "round_s": [r["s"] for r in rounds],
            "driver_jvm_peak_rss_mb": jvm_status_mb(spark),
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def produce_run(spark, records: int, partitions: int, value_bytes: int, repeats: int) -> dict:
    from pipeline.produce import records_frame
    from pipeline.runtime import compiled_expressions

    workdir = tempfile.mkdtemp(prefix="bench-produce-")
    try:
        rows = _bulk_rows(spark, records, partitions, value_bytes)
        cluster, _ = _bench_cluster(workdir, spark, partitions)
        times: dict[str, list[float]] = {k: [] for k in ("produce", "interpreted_inbox", "raw_compiled",
                                                         "raw_interpreted")}
        for n in range(repeats):
            started = time.perf_counter()
            cluster.produce("bench", rows, acks=1)  # compiled for its write when bulk
            times["produce"].append(time.perf_counter() - started)
            # the same inbox write with the session's own (interpreted) settings
            df = records_frame(rows, "bench", partitions, f"interpreted-{n}", 1, 0)
            started = time.perf_counter()
            cluster.storage.append_table(df, "inbox")
            times["interpreted_inbox"].append(time.perf_counter() - started)
            for name, compiled in (("raw_compiled", True), ("raw_interpreted", False)):
                with compiled_expressions(spark, when=compiled):
                    started = time.perf_counter()
                    rows.write.format("delta").mode("append").save(os.path.join(workdir, name))
                    times[name].append(time.perf_counter() - started)
            print(f"produce repeat {n + 1}/{repeats}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()),
                  flush=True)
        medians = {f"{k}_median_s": statistics.median(v) for k, v in times.items()}
        return {"records": records, "partitions": partitions, "value_bytes": value_bytes, "repeats": repeats,
                "seconds": times, **medians,
                "interpreted_over_produce": medians["interpreted_inbox_median_s"] / medians["produce_median_s"]}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def produce_table(data: dict) -> str:
    r = data["results"]

    def rate(seconds: float) -> str:
        return f"{r['records'] / seconds:,.0f}"
    return "\n".join([
        f"Machine: {data['machine']}. Command: `{data['command']}`.", "",
        "| medians of {} | seconds | records/s |".format(r["repeats"]), "|---|---|---|",
        f"| produce() of the DataFrame (compiled when bulk) | {r['produce_median_s']:.1f} "
        f"| {rate(r['produce_median_s'])} |",
        f"| the same inbox write, interpreted | {r['interpreted_inbox_median_s']:.1f} "
        f"| {rate(r['interpreted_inbox_median_s'])} |",
        f"| raw Delta append, compiled | {r['raw_compiled_median_s']:.1f} | {rate(r['raw_compiled_median_s'])} |",
        f"| raw Delta append, interpreted | {r['raw_interpreted_median_s']:.1f} "
        f"| {rate(r['raw_interpreted_median_s'])} |",
        "", f"Interpreted / compiled inbox write: {r['interpreted_over_produce']:.1f}x."])


def _round_line(r: dict) -> list[str]:
    """The job's rounds with traffic: how many, what one appended, and its micro-batch (the round and
    what follows it; the round's own median is the table's)."""
    figures, batches = r.get("round_figures") or [], r.get("micro_batch_s") or []
    active = [f for f in figures if f["records_appended"]]
    if not active:
        return []
    median = lambda k: statistics.median(f[k] for f in active)
    # micro-batch i ran round i + 1 (the job's rounds are the only ones on the benchmark's cluster)
    mine = [batches[f["round_id"] - 1] for f in active if f["round_id"] <= len(batches)]
    batch = f", their micro-batches {statistics.median(mine):.1f} s" if mine else ""
    later = r.get("p50_second_half_s")
    return ["", f"Rounds that appended: {len(active)} of {len(figures)}; per such round, medians: "
                f"{median('records_appended'):,.0f} records appended, {median('active_partitions'):,.0f} active "
                f"partitions{batch}."
                + (f" p50 of the second half of the produces: {later:.1f} s." if later is not None else "")]


def throughput_table(data: dict) -> str:
    r = data["results"]
    rss = f"{r['driver_jvm_peak_rss_mb']:.0f}" if r["driver_jvm_peak_rss_mb"] else "-"
    return "\n".join([
        f"Machine: {data['machine']}. Command: `{data['command']}`.", "",
        "| | seconds | records/s | MB/s (values) |", "|---|---|---|---|",
        f"| raw: one Delta append of the same rows | {r['raw_s']:.1f} | {r['raw_records_per_s']:,.0f} "
        f"| {r['raw_mb_per_s']:.1f} |",
        f"| replicated: produce, then rounds until all 3 replicas hold everything ({r['rounds']} rounds) "
        f"| {r['replicated_s']:.1f} | {r['replicated_records_per_s']:,.0f} | {r['replicated_mb_per_s']:.1f} |",
        "", f"Replicated / raw throughput: {100 * r['ratio']:.0f}% (target >= 40%). Produce into the inbox: "
            f"{r['produce_s']:.1f} s; round median {statistics.median(r['round_s']):.1f} s; driver JVM peak RSS "
            f"{rss} MB; every replica complete: {r['complete']}."])
