"""The benchmark's job scenarios (jobs/benchmark.py has their descriptions): freshness (the
replication job under spark-submit, produce to visible), maintenance and endurance (the job's
Delta tables over many rounds), and cli (the command line's start)."""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from pipeline import Cluster, ManualClock
from pipeline.cli.progress import RoundProgress

from bench_rounds import (STEP_MS, _round_line, child_env, job_jvm_peak_rss_mb, jvm_status_mb,  # noqa: E402
                          produce_steady, timed_round)


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

        progress = RoundProgress(total=rounds)  # a live bar on a terminal, the lines below otherwise
        for n in range(1, rounds + 1):
            produce_steady(cluster, rng, partitions, changed)
            took, report = timed_round(cluster)
            if progress.live:
                progress.update(report)
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
        progress.close()
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
