"""Benchmarks: figures come from here, never from timed tests.

    make bench                                   # the fetch-sessions scenario with its defaults
    .venv/bin/python jobs/benchmark.py --scenario fetch-sessions --partitions 1000 10000 --rounds 20
    spark-submit --properties-file conf/spark-defaults.conf jobs/benchmark.py --scenario fetch-sessions

Scenario `fetch-sessions` (issue 4, KIP-227): 3 brokers, RF 3, one topic of P partitions. For each
P, an incremental-mode and a full-mode cluster run side by side, round for round (interleaved, so
a noisy neighbour hits both alike). Each measured round first produces one record to each of k
random partitions (the same partitions for both modes), then runs the round; after the active
rounds, the producers stop, the clusters settle, and idle rounds are measured. Reported: medians
of round seconds, the fetch request / response partitions per round, and the driver JVM's peak
RSS (VmHWM) after each P. Writes benchmarks/fetch_sessions.json and .png and prints the README
table (`--readme` also rewrites it in docs/benchmarks.md between its benchmark markers).

Scenario `throughput` (issue 7, target 1): N records of V-byte values over P partitions (3 brokers,
RF 3, acks=1), end to end: from `produce()` of one DataFrame into the inbox until every replica
holds every record (nothing pending, every partition settled). Side by side, in the same Spark
session and the same run: the raw write limit, the same rows appended once to one Delta table.
Rounds advance a manual cluster clock by the default trigger interval (500 ms), so the ISR rules
see rounds, not this machine's speed. Writes benchmarks/throughput.json.

    .venv/bin/python jobs/benchmark.py --scenario throughput --records 5000000 --partitions 100

Scenario `freshness` (issue 7, target 2): the streaming job (`spark-submit jobs/replicate.py`, its
default trigger) runs in its own process on a cluster of P partitions (3 brokers, RF 3) while this
process produces R records per second (one produce() per second, random partitions, acks=1) and
polls `SELECT ... FROM replog.committed` for them, back to back (or `--poll-pause` seconds apart:
the polls share the 2 cores with the job). Per produce: seconds from produce() returning to the end
of the first poll that sees all of its records (an upper bound; each poll's own time is in the
JSON). The producer starts once the job has run its first 3 rounds (the first reads every
partition's metadata and state), and runs in a thread of its own, on its one-second schedule; the
polls run in the main thread. When one produce() takes longer than a second the producer falls
behind the rate asked, and the table shows the rate sent. Writes benchmarks/freshness.json.

    .venv/bin/python jobs/benchmark.py --scenario freshness --partitions 10000 --rate 1000 --seconds 180

Scenario `maintenance` (issue 7, target 4: the job keeps its Delta tables healthy): a cluster of P
partitions (3 brokers, RF 3) runs N rounds of steady traffic (k records into k random partitions
each round); then one table maintenance pass (`Cluster.maintain`, pipeline/storage/maintenance.py) with the
job's defaults. Reported: the pass's seconds; the files in the snapshots of the logs and tables
and in their `_delta_log` directories before and after; the median seconds of `storage.version()`
(a `_delta_log` listing) of the results table over 20 calls, and of W rounds just before and just
after the pass. Writes benchmarks/maintenance.json.

    .venv/bin/python jobs/benchmark.py --scenario maintenance --partitions 100 --rounds 100 --changed 100

Scenario `produce` (issue 7, target 1: getting a bulk load into the inbox): produce() of a DataFrame
of N records (V-byte values, explicit partitions, as the throughput scenario's) writes the inbox
with compiled expressions when Spark estimates it at produce.BULK_BYTES_FOR_CODEGEN or more, where
the session interprets them for rounds. Side by side, repeated
R times (`--rounds`) and interleaved: the inbox write as produce() does it, the same write with
the session's interpreted expressions, and the raw append of the rows to one Delta table both
ways. Reported: medians and the ratio. Writes benchmarks/produce.json.

    .venv/bin/python jobs/benchmark.py --scenario produce --records 1000000 --rounds 3

Scenario `endurance` (issue 7, target 4): a cluster of P partitions (3 brokers, RF 3) runs N
rounds of steady traffic (k records into k random partitions before each round), each followed by
what the replication job does after a round: Delta table maintenance when log.maintenance.interval.ms
has passed, the log cleaner when log.cleaner.backoff.ms has. The cluster clock advances by each
round's own wall time (at least the 500 ms trigger), as the job's does with rounds back to back.
Reported: the median round of rounds 500-1000 and of the last 500 (a run under 1,500 rounds: 5-10%
and the last 5% of it), their ratio (target <= 1.2x), the maintenance passes, and every 100 rounds
the median of those 100, the driver JVM's RSS and the files in the tables' snapshots and
`_delta_log` directories. Writes benchmarks/endurance.json every 100 rounds.

    .venv/bin/python jobs/benchmark.py --scenario endurance --partitions 100 --rounds 10000 --changed 100

Scenario `cli` (the `replog` command line's start): each command is its own process, a JVM and a
Spark session of its own, as an operator types it. A root is made with the command line itself
(cluster --create, topics --create with P partitions, produce of 100 lines, run --until-committed,
each timed once); then each command below runs R times (`--rounds`), interleaved, with nothing
else running in this process (no Spark session here). Reported: the median, lowest and highest
wall seconds of each. Writes benchmarks/cli.json.

    .venv/bin/python jobs/benchmark.py --scenario cli --partitions 100 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock, get_spark

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
        for n in range(1, max_rounds + 1):
            clock.advance(STEP_MS)
            seconds, report = timed_round(cluster)
            rounds.append({"s": seconds, "appended": report.records_appended, "replicated": report.records_replicated})
            print(f"throughput round {n}: {seconds:.1f} s, appended {report.records_appended}, replicated "
                  f"{report.records_replicated}", flush=True)
            if cluster.caught_up(report):
                break
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


JOB_WARM_UP_ROUNDS = 3


def freshness(spark, partitions: int, rate: int, seconds: int, seed: int, poll_pause: float = 0.0,
              config: dict | None = None) -> dict:
    rng = random.Random(seed)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    workdir = tempfile.mkdtemp(prefix="bench-freshness-")
    root = os.path.join(workdir, "cluster")
    cluster = Cluster.create(spark, root, brokers=3, config=config)
    cluster.create_topic("fresh", partitions=partitions, replication_factor=3)
    env = child_env()
    env.update({"PYTHONPATH": repo, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"})
    log = open(os.path.join(workdir, "job.log"), "w")
    job = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", "local[2]",
                            "--properties-file", "conf/spark-defaults.conf", "jobs/replicate.py", "--root", root],
                           cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # the job's first rounds read every partition's metadata and state once (tens of seconds at
        # P = 10,000): the producer starts when they are done, so the figures are the running job's
        waited = time.monotonic()
        while cluster.rounds().count() < JOB_WARM_UP_ROUNDS:
            if job.poll() is not None or time.monotonic() - waited > 600:
                raise RuntimeError(f"the replication job did not run {JOB_WARM_UP_ROUNDS} rounds; see {log.name}")
            time.sleep(2)
        produced, visible, polls, produce_s = {}, {}, [], []
        produced_wall, visible_wall = {}, {}  # epoch ms, to place each produce among the job's rounds
        produced_lock = threading.Lock()  # the producer adds to `produced` while the polls read it
        started = time.monotonic()
        failure: list[BaseException] = []

        def producer() -> None:  # its own thread: the rate does not wait for the polls
            batch = 0
            try:
                while time.monotonic() - started < seconds:
                    pause = started + batch - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                    records = [{"value": f"{batch}:{i}", "partition": rng.randrange(partitions)}
                               for i in range(rate)]
                    call = time.monotonic()
                    cluster.produce("fresh", records, acks=1)
                    returned, returned_wall = time.monotonic(), time.time_ns() // 1_000_000
                    with produced_lock:
                        produced[batch], produced_wall[batch] = returned, returned_wall
                    produce_s.append(returned - call)
                    batch += 1
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                failure.append(e)

        sender = threading.Thread(target=producer, name="freshness-producer", daemon=True)
        sender.start()

        def waiting() -> list[int]:
            with produced_lock:
                return sorted(produced.keys() - visible.keys())

        while sender.is_alive() or (waiting() and time.monotonic() - started < seconds + 120):
            oldest = waiting()
            if not oldest:
                time.sleep(0.05)
                continue
            if polls and poll_pause:  # a reader that looks every so often, not one that takes a core
                time.sleep(poll_pause)
            poll_start = time.monotonic()
            seen = spark.sql(
                "SELECT CAST(substring_index(CAST(value AS STRING), ':', 1) AS INT) AS b, count(*) AS n "
                f"FROM replog.committed WHERE topic = 'fresh' GROUP BY 1 HAVING b >= {oldest[0]}").collect()
            now, now_wall = time.monotonic(), time.time_ns() // 1_000_000
            polls.append(now - poll_start)
            for r in seen:
                if r["n"] == rate and r["b"] in produced and r["b"] not in visible:
                    visible[r["b"]], visible_wall[r["b"]] = now, now_wall
        sender.join()
        if failure:
            raise failure[0]
        latency = {b: visible[b] - produced[b] for b in visible}
        latencies = sorted(latency.values())
        later = [s for b, s in latency.items() if b >= len(produced) // 2]
        rounds = [r.asDict() for r in cluster.rounds().orderBy("round_id").select(
            "round_id", "now_ms", "duration_ms", "records_appended", "active_partitions", "isr_shrinks",
            "isr_expands", "fetch_request_partitions").collect()]
        waited = rounds_waited(produced_wall, visible_wall, rounds)
        durations = [r["duration_ms"] / 1000 for r in rounds if r["records_appended"]]  # rounds with traffic
        return {
            "partitions": partitions, "rate": rate, "seconds": seconds, "poll_pause_s": poll_pause,
            "produces": len(produced),
            "visible": len(visible),
            "p50_s": statistics.median(latencies) if latencies else None,
            "p99_s": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None,
            "max_s": latencies[-1] if latencies else None, "latencies_s": latencies,
            "p50_second_half_s": statistics.median(later) if later else None,
            "poll_median_s": statistics.median(polls) if polls else None,
            "produce_median_s": statistics.median(produce_s) if produce_s else None,
            "round_median_s": statistics.median(durations) if durations else None, "rounds": len(rounds),
            "round_figures": rounds, "job_warm_up_rounds": JOB_WARM_UP_ROUNDS,
            "rounds_waited": {str(n): waited.count(n) for n in sorted(set(waited))},
            "micro_batch_s": _micro_batches(os.path.join(workdir, "job.log")),
            "job_driver_jvm_peak_rss_mb": job_jvm_peak_rss_mb(job.pid),
        }
    finally:
        job.terminate()
        try:
            job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            job.kill()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def rounds_waited(produced_ms: dict, visible_ms: dict, rounds: list[dict]) -> list[int]:
    """For each produce seen: how many of the job's rounds ended (now_ms + duration_ms, the round's
    commits done) after produce() returned and before the poll that saw its records ended. A record
    waits for the round in progress and the round that appends and commits it: 2 at most (issue 7,
    target 2); 3 or more means a round that could have taken it did not, or a slow poll.
    Idle rounds are not counted: one writes only its rounds row (pipeline.round.idle_round), so it
    can make nothing visible, and several of them end during one poll of a quiet job. A round the
    HW can move in fetched, appended or changed an ISR (a row without those figures counts)."""
    def moves(r: dict) -> bool:
        return any(r.get(k, 1) for k in ("fetch_request_partitions", "records_appended", "isr_shrinks", "isr_expands"))
    ends = sorted(r["now_ms"] + r["duration_ms"] for r in rounds if moves(r))
    return [sum(1 for e in ends if produced_ms[b] < e <= visible_ms[b]) for b in sorted(visible_ms)]


def _micro_batches(job_log: str) -> list[float]:
    """The streaming job's micro-batch durations (its log's progress lines): a round, plus the
    cleaner's and maintenance's checks after it, plus Structured Streaming's own bookkeeping."""
    import re
    with open(job_log) as f:
        return [int(m.group(1)) / 1000 for m in re.finditer(r"micro-batch \d+ done in (\d+) ms", f.read())]


def _table_files(cluster: Cluster) -> dict:
    """Data files in the current snapshots of every table and log, and files in their _delta_log."""
    from pipeline.storage.maintenance import table_paths
    in_snapshots, in_logs = 0, 0
    for path in table_paths(cluster.storage, cluster.brokers).values():
        in_snapshots += int(cluster.storage.snapshot(path).numOfFiles())
        in_logs += len(os.listdir(os.path.join(path, "_delta_log")))
    return {"snapshot_files": in_snapshots, "delta_log_files": in_logs}


def _version_s(cluster: Cluster, calls: int = 20) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        cluster.storage.version("results")
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def maintenance_run(spark, partitions: int, rounds: int, changed: int, window: int, seed: int) -> dict:
    rng = random.Random(seed)
    workdir = tempfile.mkdtemp(prefix="bench-maintenance-")
    try:
        clock = ManualClock(start_ms=0)
        cluster = Cluster.create(spark, os.path.join(workdir, "cluster"), brokers=3, clock=clock)
        cluster.create_topic("bench", partitions=partitions, replication_factor=3)
        round_s = []

        def traffic_round() -> float:
            produce_steady(cluster, rng, partitions, changed)
            clock.advance(STEP_MS)
            return timed_round(cluster)[0]

        for n in range(1, rounds + 1):
            round_s.append(traffic_round())
            if n % 25 == 0:
                print(f"maintenance: round {n}/{rounds}, last {round_s[-1]:.2f} s", flush=True)
        before = {**_table_files(cluster), "version_s": _version_s(cluster)}
        started = time.perf_counter()
        report = cluster.maintain()
        pass_s = time.perf_counter() - started
        after = {**_table_files(cluster), "version_s": _version_s(cluster)}
        after_rounds = [traffic_round() for _ in range(window)]
        return {
            "partitions": partitions, "rounds": rounds, "changed": changed, "pass_s": pass_s,
            "before": before, "after": after, "tables": report.tables, "compacted": len(report.compacted),
            "files_removed": report.files_removed, "files_added": report.files_added,
            "round_median_before_s": statistics.median(round_s[-window:]),
            "round_median_after_s": statistics.median(after_rounds), "round_s": round_s + after_rounds,
            "driver_jvm_peak_rss_mb": jvm_status_mb(spark),
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def endurance_windows(rounds: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Issue 7 target 4's two windows of round numbers (1-based, inclusive): rounds 500-1000 and
    the last 500. A run shorter than 1,500 rounds gets the same shares of its length (5-10% and
    the last 5%), so the two never overlap."""
    if rounds >= 1500:
        return (501, 1000), (rounds - 499, rounds)
    share = max(rounds // 20, 1)
    return (share + 1, 2 * share), (rounds - share + 1, rounds)


def endurance_figures(round_s: list[float], rounds: int) -> dict:
    """The medians of the two windows over the rounds measured so far, and their ratio (last /
    early; the target is <= 1.2); None where a window has no rounds yet."""
    (e0, e1), (l0, l1) = endurance_windows(rounds)
    early, last = round_s[e0 - 1:e1], round_s[l0 - 1:l1]
    early_s = statistics.median(early) if early else None
    last_s = statistics.median(last) if last else None
    return {"early_window": [e0, e1], "last_window": [l0, l1], "early_median_s": early_s,
            "last_median_s": last_s,
            "ratio": last_s / early_s if early_s and last_s is not None else None}


def endurance_run(spark, partitions: int, rounds: int, changed: int, seed: int, out: str, command: str,
                  machine: str, config: dict | None = None) -> dict:
    """`rounds` rounds of steady traffic (k records into k random partitions before each), each
    followed by what the replication job does after a round (jobs/replicate.py: maintain_if_due,
    then compact_if_due). The cluster clock advances by each round's wall time, at least the
    trigger interval, as the job's clock does when rounds run back to back, so the maintenance
    interval (log.maintenance.interval.ms) comes round as it would in the job. The JSON is
    rewritten every 100 rounds, so a run that is stopped keeps what it measured."""
    rng = random.Random(seed)
    workdir = tempfile.mkdtemp(prefix="bench-endurance-")
    try:
        clock = ManualClock(start_ms=0)
        cluster = Cluster.create(spark, os.path.join(workdir, "cluster"), brokers=3, clock=clock, config=config)
        cluster.create_topic("bench", partitions=partitions, replication_factor=3)
        round_s, passes, samples = [], [], []

        def result() -> dict:
            return {"partitions": partitions, "rounds": rounds, "changed": changed, "rounds_run": len(round_s),
                    **endurance_figures(round_s, rounds), "maintenance_passes": passes, "samples": samples,
                    "round_s": round_s, "driver_jvm_peak_rss_mb": jvm_status_mb(spark)}

        for n in range(1, rounds + 1):
            produce_steady(cluster, rng, partitions, changed)
            took, _ = timed_round(cluster)
            round_s.append(took)
            clock.advance(max(STEP_MS, int(took * 1000)))
            started = time.perf_counter()
            maintained = cluster.maintain_if_due()
            if maintained is not None:
                passes.append({"after_round": n, "seconds": time.perf_counter() - started,
                               "compacted": len(maintained.compacted), "files_removed": maintained.files_removed,
                               "files_vacuumed": maintained.files_vacuumed})
            cluster.compact_if_due()
            if n % 100 == 0 or n == rounds:
                recent = round_s[-100:]
                samples.append({"after_round": n, "median_s_last_100": statistics.median(recent),
                                "driver_jvm_rss_mb": jvm_status_mb(spark, "VmRSS"), **_table_files(cluster)})
                print(f"endurance: round {n}/{rounds}, median of the last {len(recent)} "
                      f"{samples[-1]['median_s_last_100']:.2f} s, {len(passes)} maintenance passes", flush=True)
                with open(out, "w") as f:
                    json.dump({"scenario": "endurance", "machine": machine, "command": command,
                               "results": result()}, f, indent=2)
        return result()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def endurance_table(data: dict) -> str:
    r = data["results"]
    (e0, e1), (l0, l1) = r["early_window"], r["last_window"]
    early = f"{r['early_median_s']:.2f}" if r["early_median_s"] is not None else "-"
    last = f"{r['last_median_s']:.2f}" if r["last_median_s"] is not None else "-"
    ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
    first, final = r["samples"][0], r["samples"][-1]
    peak = f" Driver JVM peak RSS {r['driver_jvm_peak_rss_mb']:,.0f} MB." if r["driver_jvm_peak_rss_mb"] else ""
    return "\n".join([
        f"Machine: {data['machine']}. Command: `{data['command']}`.", "",
        f"| P | rounds run / asked | median, rounds {e0:,}-{e1:,} (s) | median, rounds {l0:,}-{l1:,} (s) "
        f"| last / early | maintenance passes | driver JVM RSS after round {first['after_round']:,} / "
        f"{final['after_round']:,} (MB) |",
        "|---|---|---|---|---|---|---|",
        f"| {r['partitions']:,} | {r['rounds_run']:,} / {r['rounds']:,} | {early} | {last} | {ratio} "
        f"| {len(r['maintenance_passes'])} | {first['driver_jvm_rss_mb']:,.0f} / {final['driver_jvm_rss_mb']:,.0f} |",
        "", f"Target: the last 500 rounds' median within 1.2x of rounds 500-1000's (10,000 rounds). "
            f"Data files in the snapshots after round {first['after_round']:,} / {final['after_round']:,}: "
            f"{first['snapshot_files']:,} / {final['snapshot_files']:,}; `_delta_log` files: "
            f"{first['delta_log_files']:,} / {final['delta_log_files']:,}." + peak])


def maintenance_table(data: dict) -> str:
    r = data["results"]
    b, a = r["before"], r["after"]
    return "\n".join([
        f"Machine: {data['machine']}. Command: `{data['command']}`.", "",
        "| | before the pass | after |", "|---|---|---|",
        f"| data files in the snapshots ({r['tables']} tables and logs) | {b['snapshot_files']:,} | {a['snapshot_files']:,} |",
        f"| files in their `_delta_log` directories | {b['delta_log_files']:,} | {a['delta_log_files']:,} |",
        f"| `storage.version()` of results, median (ms) | {1000 * b['version_s']:.1f} | {1000 * a['version_s']:.1f} |",
        f"| round median, {len(r['round_s']) - r['rounds']} rounds (s) | {r['round_median_before_s']:.2f} "
        f"| {r['round_median_after_s']:.2f} |",
        "", f"The pass: {r['pass_s']:.1f} s; {r['compacted']} compacted ({r['files_removed']:,} small files into "
            f"{r['files_added']}). The `_delta_log` files stay until Delta's next checkpoint after they are older "
            f"than log.maintenance.log.retention.ms (7 days by default), so a run this short shows none go."])


def freshness_table(data: dict) -> str:
    r = data["results"]
    f = lambda v: "-" if v is None else f"{v:.1f}"
    return "\n".join([
        f"Machine: {data['machine']}. Command: `{data['command']}`.", "",
        "| P | records/s asked / sent | produces seen / sent | p50 (s) | p99 (s) | max (s) | round median, with traffic (s) "
        "| produce() median (s) | poll median (s) |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {r['partitions']:,} | {r['rate']:,} / {r['produces'] * r['rate'] / r['seconds']:,.0f} "
        f"| {r['visible']} / {r['produces']} | {f(r['p50_s'])} | {f(r['p99_s'])} "
        f"| {f(r['max_s'])} | {f(r['round_median_s'])} | {f(r.get('produce_median_s'))} "
        f"| {f(r['poll_median_s'])} |",
        "", "Targets: p50 <= 3 s, p99 <= 6 s, never more than 2 rounds plus the trigger interval.",
        *_round_line(r), *_waited_line(r), *_job_rss_line(r)])


def _job_rss_line(r: dict) -> list[str]:
    rss = r.get("job_driver_jvm_peak_rss_mb")
    return [] if rss is None else ["", f"The replication job's driver JVM peak RSS: {rss:,.0f} MB."]


def _waited_line(r: dict) -> list[str]:
    waited = r.get("rounds_waited")
    if not waited:
        return []
    counts = ", ".join(f"{n}: {c}" for n, c in waited.items())
    return ["", "Rounds that ended while a produce waited to be seen (produce() returning to the poll "
                f"that saw it), produces per count: {counts}."]


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


# the commands the cli scenario repeats: (label, arguments, lines on stdin)
CLI_COMMANDS = [
    ("topics --list", ["topics", "--list"], None),
    ("topics --describe --topic bench", ["topics", "--describe", "--topic", "bench"], None),
    ("produce --topic bench (10 lines)", ["produce", "--topic", "bench"], "".join(f"v{i}\n" for i in range(10))),
    ("consume --topic bench --from-beginning", ["consume", "--topic", "bench", "--from-beginning"], None),
    ("configs --describe --entity-type brokers --entity-default",
     ["configs", "--describe", "--entity-type", "brokers", "--entity-default"], None),
    ("consumer-groups --list", ["consumer-groups", "--list"], None),
    ("run --rounds 1", ["run", "--rounds", "1"], None),
]


def _replog(root: str, args: list[str], stdin: str | None = None) -> float:
    """Wall seconds of one `replog` command on `root`, run as its own process (it must succeed)."""
    replog = os.path.join(os.path.dirname(sys.executable), "replog")
    env = child_env()
    started = time.perf_counter()
    done = subprocess.run([replog, *args, "--root", root], input=stdin, capture_output=True, text=True, env=env,
                          timeout=600)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"replog {' '.join(args)} failed: {done.stderr[-2000:]}")
    return took


def cli_run(partitions: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        root = os.path.join(tmp, "cluster")
        setup = {
            "cluster --create --brokers 3": _replog(root, ["cluster", "--create", "--brokers", "3"]),
            f"topics --create --partitions {partitions} --replication-factor 3": _replog(
                root, ["topics", "--create", "--topic", "bench", "--partitions", str(partitions),
                       "--replication-factor", "3"]),
            "produce --topic bench --acks all (100 lines)": _replog(
                root, ["produce", "--topic", "bench", "--acks", "all"], "".join(f"line-{i}\n" for i in range(100))),
            "run --until-committed": _replog(root, ["run", "--until-committed"]),
        }
        seconds: dict[str, list[float]] = {label: [] for label, _, _ in CLI_COMMANDS}
        for _ in range(repeats):
            for label, args, stdin in CLI_COMMANDS:
                seconds[label].append(_replog(root, args, stdin))
                print(f"{label}: {seconds[label][-1]:.2f} s", flush=True)
    return {"partitions": partitions, "repeats": repeats, "setup_s": setup, "seconds": seconds}


def cli_table(data: dict) -> str:
    r = data["results"]
    rows = [f"| `replog {label}` | {statistics.median(s):.1f} | {min(s):.1f} | {max(s):.1f} |"
            for label, s in r["seconds"].items()]
    once = "; ".join(f"`{label}` {s:.1f} s" for label, s in r["setup_s"].items())
    return "\n".join([
        f"Machine: {data['machine']}. Command: `{data['command']}`.", "",
        f"| command ({r['partitions']} partitions, {r['repeats']} runs each) | median s | lowest | highest |",
        "|---|---|---|---|", *rows, "", f"Making the root, once each: {once}."])


def update_readme(path: str, text: str, scenario: str) -> None:
    mark_begin, mark_end = f"<!-- benchmark:{scenario} -->", f"<!-- /benchmark:{scenario} -->"
    with open(path) as f:
        readme = f.read()
    begin, end = readme.index(mark_begin) + len(mark_begin), readme.index(mark_end)
    with open(path, "w") as f:
        f.write(readme[:begin] + "\n" + text + "\n" + readme[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="fetch-sessions", choices=[
        "fetch-sessions", "throughput", "freshness", "maintenance", "produce", "endurance", "cli"])
    parser.add_argument("--rate", type=int, default=1000, help="freshness: records produced per second")
    parser.add_argument("--seconds", type=int, default=180, help="freshness: how long the producer runs")
    parser.add_argument("--poll-pause", type=float, default=0.0,
                        help="freshness: seconds between one poll's end and the next poll (0: back to back)")
    parser.add_argument("--records", type=int, default=5_000_000, help="throughput: records produced")
    parser.add_argument("--value-bytes", type=int, default=100, help="throughput: bytes per value")
    parser.add_argument("--max-rounds", type=int, default=500, help="throughput: give up after this many")
    parser.add_argument("--partitions", type=int, nargs="+",
                        help="fetch-sessions: P values (default 1000 10000 100000); throughput: one P (default 100)")
    parser.add_argument("--changed", type=int, default=100, help="partitions produced to per round (k)")
    parser.add_argument("--rounds", type=int, default=20, help="measured active rounds per P (maintenance: rounds "
                        "before the pass; produce: repeats; endurance: rounds)")
    parser.add_argument("--warm-up", type=int, default=3)
    parser.add_argument("--idle-rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=227)
    parser.add_argument("--out", help="default benchmarks/<scenario>.json")
    parser.add_argument("--readme", action="store_true", help="rewrite the README's table")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable)")
    parser.add_argument("--cluster-config", action="append", default=[], metavar="KEY=VALUE",
                        help="endurance, throughput, freshness: a cluster setting (repeatable), e.g. "
                        "num.replica.fetchers=2")
    args = parser.parse_args(argv)
    if args.scenario == "cli":  # subprocesses only: no session of its own beside them
        partitions = args.partitions[0] if args.partitions else 100
        data = {"scenario": "cli", "results": cli_run(partitions, args.rounds),
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
                "command": f"jobs/benchmark.py --scenario cli --partitions {partitions} --rounds {args.rounds}"}
        return _write(data, args.out or "benchmarks/cli.json", cli_table(data), args.readme, plotted=False)
    spark = get_spark(extra={"spark.ui.enabled": "false", **dict(c.split("=", 1) for c in args.conf)})
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
               f"Spark {spark.version}, local[*]")
    out = args.out or f"benchmarks/{args.scenario.replace('-', '_')}.json"
    config = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in (c.split("=", 1) for c in args.cluster_config)}
    configured = "".join(f" --cluster-config {c}" for c in args.cluster_config)
    if args.scenario == "throughput":
        partitions = args.partitions[0] if args.partitions else 100
        result = throughput(spark, args.records, partitions, args.value_bytes, args.max_rounds, config or None)
        data = {"scenario": args.scenario, "machine": machine, "results": result,
                "command": f"jobs/benchmark.py --scenario throughput --records {args.records} "
                           f"--partitions {partitions} --value-bytes {args.value_bytes}" + configured}
        return _write(data, out, throughput_table(data), args.readme, plotted=False)
    if args.scenario == "freshness":
        partitions = args.partitions[0] if args.partitions else 10000
        result = freshness(spark, partitions, args.rate, args.seconds, args.seed, args.poll_pause, config or None)
        data = {"scenario": args.scenario, "machine": machine, "results": result,
                "command": f"jobs/benchmark.py --scenario freshness --partitions {partitions} --rate {args.rate} "
                           f"--seconds {args.seconds}"
                           + (f" --poll-pause {args.poll_pause:g}" if args.poll_pause else "") + configured}
        return _write(data, out, freshness_table(data), args.readme, plotted=False)
    if args.scenario == "produce":
        partitions = args.partitions[0] if args.partitions else 100
        result = produce_run(spark, args.records, partitions, args.value_bytes, args.rounds)
        data = {"scenario": args.scenario, "machine": machine, "results": result,
                "command": f"jobs/benchmark.py --scenario produce --records {args.records} --partitions {partitions} "
                           f"--value-bytes {args.value_bytes} --rounds {args.rounds}"}
        return _write(data, out, produce_table(data), args.readme, plotted=False)
    if args.scenario == "maintenance":
        partitions = args.partitions[0] if args.partitions else 100
        window = 20
        result = maintenance_run(spark, partitions, args.rounds, args.changed, window, args.seed)
        data = {"scenario": args.scenario, "machine": machine, "results": result,
                "command": f"jobs/benchmark.py --scenario maintenance --partitions {partitions} --rounds {args.rounds} "
                           f"--changed {args.changed}"}
        return _write(data, out, maintenance_table(data), args.readme, plotted=False)
    if args.scenario == "endurance":
        partitions = args.partitions[0] if args.partitions else 100
        command = (f"jobs/benchmark.py --scenario endurance --partitions {partitions} --rounds {args.rounds} "
                   f"--changed {args.changed}" + configured)
        result = endurance_run(spark, partitions, args.rounds, args.changed, args.seed, out, command, machine,
                               config or None)
        data = {"scenario": args.scenario, "machine": machine, "results": result, "command": command}
        return _write(data, out, endurance_table(data), args.readme, plotted=False)
    args.partitions = args.partitions or [1000, 10000, 100000]
    results = [fetch_sessions(spark, p, args.changed, args.rounds, args.warm_up, args.idle_rounds, args.seed)
               for p in sorted(args.partitions)]
    data = {
        "scenario": args.scenario,
        "machine": machine,
        "command": "jobs/benchmark.py " + " ".join(
            [f"--partitions {' '.join(map(str, sorted(args.partitions)))}", f"--changed {args.changed}",
             f"--rounds {args.rounds}", f"--warm-up {args.warm_up}", f"--idle-rounds {args.idle_rounds}"]),
        "results": results,
        "ratios": ratios(results),
    }
    return _write(data, out, table(data), args.readme, plotted=True)


def _write(data: dict, out: str, text: str, readme: bool, plotted: bool) -> int:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(data, f, indent=2)
    print(text)
    if plotted:
        plot(data, os.path.splitext(out)[0] + ".png")
    if readme:
        update_readme(os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks.md"), text, data["scenario"])
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
