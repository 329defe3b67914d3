"""The replication job: one fetch round per Structured Streaming micro-batch.

    spark-submit jobs/replicate.py --root PATH [--conf-file conf/replog.properties]
                                   [--trigger-interval 500ms | --available-now] [--checkpoint PATH]

Streaming (the default): a `rate-micro-batch` source gives one micro-batch per trigger whether or
not anything was produced (lag expiry needs time, not data), and foreachBatch runs
`Cluster.run_round()`, the same function the API calls, then the log cleaner's pass when
`log.cleaner.backoff.ms` has passed (`Cluster.compact_if_due()`) and Delta table maintenance when
`log.maintenance.interval.ms` has (`Cluster.maintain_if_due()`: compaction of the small files rounds
leave, VACUUM, Delta log retention; pipeline/storage/maintenance.py). The trigger interval defaults to the
cluster's `replica.fetch.wait.max.ms`. SIGTERM (or Ctrl-C) to the job's Python process, or SIGTERM
to the spark-submit JVM (both pids are logged at start), stops the job after the round in
progress; a restart resumes from the checkpoint. The Spark UI stays on (its address is logged).

`--conf-file`: every key it holds becomes the cluster's setting before the first round (as
kafka-configs --alter on the brokers' default would make it); a key that is not a cluster key, a
bad value or other `broker.<id>.log.dirs` than the cluster's are refused (exit 2) before anything
is written.

`--metrics-port PORT`: Kafka's replica-manager, fetcher, fetch-session, partition and log metrics in
the Prometheus text format at http://127.0.0.1:PORT/metrics (pipeline/metrics_export.py), read
from the tables at each scrape.

`--available-now`: rounds until every produced record is appended, replicated and acknowledged, or
until `--max-stalled-rounds` rounds in a row change nothing (a stuck follower, say), then exit 0:
what a scheduled Airflow task wants.

One job per root: a job takes ROOT/.replicate.lock for its life, and a second job started on the
root is refused at once with REPLICATION_JOB_RUNNING (pipeline/storage/job_lock.py). Any other writer that
runs rounds takes the replication lease over, and this job's next round then fails with
FENCED_INSTANCE_ID.

Exit codes: 0 done, 1 the cluster or Spark could not be opened or another job runs on the root,
2 bad arguments or configuration (a `--conf-file` whose `broker.<id>.log.dirs` differ from the
cluster's locations too), 3 a round failed with one of replog's errors (printed, e.g.
FENCED_INSTANCE_ID, or KAFKA_STORAGE_ERROR for a cluster table; such a round writes nothing). A
broker whose storage location fails does not stop the job: a round halts that broker and goes on.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

try:
    from pipeline.config import read_properties
except ImportError:  # run as a file from a checkout whose package is not installed: its root on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from pipeline.config import read_properties

LOG = logging.getLogger("replog.replicate")


def parse_interval_ms(text: str) -> int:
    """'500ms', '2s', '1 minute' or a bare number of milliseconds."""
    t = text.strip().lower().replace(" ", "")
    for suffix, scale in (("ms", 1), ("milliseconds", 1), ("seconds", 1000), ("second", 1000), ("s", 1000),
                          ("minutes", 60000), ("minute", 60000), ("min", 60000)):
        if t.endswith(suffix) and t[: -len(suffix)].isdigit():
            return int(t[: -len(suffix)]) * scale
    if t.isdigit():
        return int(t)
    raise ValueError(f"trigger interval {text!r} is not like 500ms, 2s or 1min")


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="replicate.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.environ.get("REPLOG_ROOT"), help="cluster root (default $REPLOG_ROOT)")
    parser.add_argument("--conf-file", help="replog.properties: its keys are checked, then applied to the cluster")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--trigger-interval", help="time between rounds (default: replica.fetch.wait.max.ms)")
    mode.add_argument("--available-now", action="store_true", help="rounds until all is committed, then exit")
    parser.add_argument("--checkpoint", help="streaming checkpoint (default ROOT/checkpoints/replicate)")
    parser.add_argument("--max-stalled-rounds", type=int, default=3,
                        help="--available-now stops after this many rounds in a row that change nothing")
    parser.add_argument("--figures-interval", metavar="INTERVAL",
                        help="how often the replog-rounds query reports the rounds' figures in its progress "
                             "(default: the trigger interval, one report per round; off: no such query)")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Kafka's metrics for Prometheus at http://ADDR:PORT/metrics (default: not served)")
    parser.add_argument("--metrics-addr", default="127.0.0.1", metavar="ADDR",
                        help="the address --metrics-port listens on (default 127.0.0.1; 0.0.0.0: every interface)")
    args = parser.parse_args(argv)
    if not args.root:
        parser.error("--root is required (or set REPLOG_ROOT)")
    if args.max_stalled_rounds < 1:
        parser.error("--max-stalled-rounds must be >= 1")
    return args


def _progress(report: Any) -> str:
    return (f"round {report.round_id}: appended {report.records_appended}, replicated {report.records_replicated}, "
            f"acked {report.requests_acked}, failed {report.requests_failed}, pending {report.pending_requests}, "
            f"active partitions {report.active_partitions}, hw moved {report.hw_advances or 0}, "
            f"isr -{report.isr_shrinks}/+{report.isr_expands}, "
            f"{report.duration_ms} ms")


def _clean(cluster: Any) -> None:
    """After a round: the log cleaner's pass when log.cleaner.backoff.ms has passed
    (Cluster.compact_if_due), and Delta table maintenance when log.maintenance.interval.ms has
    (Cluster.maintain_if_due: compaction of small files, VACUUM, log retention)."""
    started = time.monotonic()
    maintained = cluster.maintain_if_due()
    if maintained is not None:
        LOG.info("table maintenance: %d tables and logs, compacted %d (%d small files into %d), vacuumed %d files, "
                 "retention set on %d, %.1f s", maintained.tables, len(maintained.compacted), maintained.files_removed,
                 maintained.files_added, maintained.files_vacuumed, len(maintained.properties_set),
                 time.monotonic() - started)
    report = cluster.compact_if_due()
    if report is not None:
        LOG.info("log cleaner run %d: cleaned %d of %d compacted partitions (%d replicas), removed %d records, "
                 "%d ms, max compaction delay %d ms, %d uncleanable", report.run_id, report.partitions_cleaned,
                 report.compacted_partitions, report.replicas_cleaned, report.records_removed, report.clean_time_ms,
                 report.max_compaction_delay_ms, report.uncleanable_partitions)


def install_stop_handlers(spark: Any, stopping: threading.Event) -> None:
    """SIGTERM or SIGINT to this Python process, or SIGTERM to the driver JVM that spark-submit
    runs (what a scheduler or `kill <spark-submit pid>` sends), sets `stopping`: the job stops
    after the round in progress. The JVM's handler replaces its default one, which would stop
    Spark at once, mid-round; it calls back into this process through Py4J's callback server."""
    def stop(signum: int, _frame: Any = None) -> None:
        LOG.info("signal %d: stopping after the current round", signum)
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    class JvmHandler:
        def handle(self, _signal: Any) -> None:
            stop(signal.SIGTERM)

        class Java:
            implements = ["sun.misc.SignalHandler"]

    from pyspark.java_gateway import ensure_callback_server_started
    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    jvm = spark.sparkContext._jvm
    jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal("TERM"), JvmHandler())
    LOG.info("SIGTERM to pid %d (or to the driver JVM, pid %s) stops after the current round", os.getpid(),
             jvm.java.lang.ProcessHandle.current().pid())


def run_available_now(cluster: Any, max_stalled: int, stopping: threading.Event | None = None,
                      stream: Any = None) -> int:
    """Rounds until the cluster has caught up (Cluster.caught_up: every produce request read, nothing
    pending or waiting for a client quota, every partition settled), stalled or `stopping` is set;
    the round count. When `stream` (default stderr) is a terminal, a live progress bar there
    (requests and partitions left, records per second, ETA: pipeline/cli/progress.py) stands for
    the log line of each round."""
    from pipeline.cli.progress import RoundProgress
    progress = RoundProgress(stream=stream or sys.stderr)
    try:
        return _available_now_rounds(cluster, max_stalled, stopping, progress if progress.live else None)
    finally:
        progress.close()


def _available_now_rounds(cluster: Any, max_stalled: int, stopping: threading.Event | None,
                          progress: Any) -> int:
    stalled, rounds = 0, 0
    while stopping is None or not stopping.is_set():
        report = cluster.run_round()
        rounds += 1
        if progress is not None:
            progress.update(report)
        else:
            LOG.info(_progress(report))
        _clean(cluster)
        if cluster.caught_up(report):
            return rounds
        moved = (report.records_appended or report.records_replicated or report.requests_acked
                 or report.requests_failed or report.isr_shrinks or report.isr_expands)
        stalled = 0 if moved else stalled + 1
        if stalled >= max_stalled:
            LOG.warning("stopping: %d rounds in a row changed nothing (%d partitions still active)",
                        stalled, report.active_partitions)
            return rounds
    LOG.info("stopped by a signal after %d rounds", rounds)
    return rounds


FIGURES_QUERY = "replog-rounds"


def start_round_figures(spark: Any, cluster: Any, interval_ms: int) -> Any:
    """The job's second streaming query, `replog-rounds`, triggered every `interval_ms`: it reads
    the rows the rounds append to the rounds table, from those after its start, and observes their
    figures (pipeline/round/figures.py), so each of its micro-batches' progress (a
    StreamingQueryListener, `query.lastProgress`, the Spark UI's Structured Streaming tab) holds
    observedMetrics["round"]: the records appended and replicated, HW moves, ISR shrinks and
    expands and the rest, of one round when it keeps up (a micro-batch reads one round's file)
    and of the rounds since its last micro-batch when its interval is longer than the rounds'.
    (The replication query's own micro-batches cannot carry them: observed metrics are computed
    over the rows a micro-batch reads, and its round happens after they were read.) It keeps no
    checkpoint: a restarted job reports the rounds from its start on."""
    from pipeline.round.figures import observe_round_figures
    rounds = (spark.readStream.format("delta").option("startingVersion", "latest")
              .option("skipChangeCommits", "true")
              .load(cluster.storage.path("rounds")))
    return (observe_round_figures(rounds).writeStream.queryName(FIGURES_QUERY).format("noop")
            .trigger(processingTime=f"{interval_ms} milliseconds").start())


def run_streaming(spark: Any, cluster: Any, interval_ms: int, checkpoint: str,
                  stopping: threading.Event | None = None, figures_ms: int | None = None) -> None:
    """One round per micro-batch until SIGTERM/SIGINT; the stop waits for the round in progress. A
    round that fails stops the query, and its error is raised here. Beside it the `replog-rounds`
    query (start_round_figures) reports the rounds' figures every `figures_ms` (None: every
    `interval_ms`; 0: no such query)."""
    from pyspark.sql.streaming import StreamingQueryListener

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event):
            LOG.info("replication query started: id %s, run %s", event.id, event.runId)

        def onQueryProgress(self, event):
            p = event.progress
            if p.name == FIGURES_QUERY:  # (at INFO when the rounds moved something)
                from pipeline.round.figures import ROUND_FIGURES, moved
                seen = p.observedMetrics[ROUND_FIGURES].asDict()
                LOG.log(logging.INFO if moved(seen) else logging.DEBUG, "%s batch %s observed: %s", p.name,
                        p.batchId, ", ".join(f"{k} {v}" for k, v in seen.items()))
            else:
                LOG.info("micro-batch %s done in %s ms", p.batchId, p.durationMs.get("triggerExecution"))

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            LOG.info("replication query stopped%s", f": {event.exception}" if event.exception else "")

    stopping = stopping or threading.Event()
    in_round = threading.Lock()

    # a micro-batch replayed from an existing checkpoint (the job stopped after its round, before
    # Spark recorded the batch) already ran its round; a new checkpoint numbers batches from 0
    resuming = cluster.storage.path_exists(checkpoint.rstrip("/") + "/commits")
    done_through = cluster.last_batch_id() if resuming else None

    failures: list[BaseException] = []

    def one_round(_batch: Any, batch_id: int) -> None:
        with in_round:
            if stopping.is_set():
                return
            if done_through is not None and batch_id <= done_through:
                LOG.info("batch %d: its round already ran before the restart; skipped", batch_id)
                return
            try:
                LOG.info("batch %d: %s", batch_id, _progress(cluster.run_round(batch_id=batch_id)))
                _clean(cluster)
            except BaseException as err:  # the query stops with it; main() prints it and exits 3
                failures.append(err)
                raise

    listener = Progress()
    spark.streams.addListener(listener)
    figures_ms = interval_ms if figures_ms is None else figures_ms
    figures = start_round_figures(spark, cluster, figures_ms) if figures_ms else None
    query = (
        spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
        .writeStream.queryName("replog-replicate").foreachBatch(one_round)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{interval_ms} milliseconds").start()
    )

    LOG.info("replicating every %d ms", interval_ms)
    from pyspark.errors import StreamingQueryException
    while query.isActive and not stopping.is_set():
        try:
            query.awaitTermination(0.2)
        except StreamingQueryException:
            if not failures:  # not a round's error (those are raised below, as they were raised)
                raise
    with in_round:  # the round in progress finishes first; later batches do nothing
        stopping.set()
    query.stop()
    if figures is not None:
        figures.processAllAvailable()  # (the last rounds' figures reach the progress before it stops)
        figures.stop()
    spark.streams.removeListener(listener)
    if failures:
        raise failures[0]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr, force=True)
    args = _args(argv)
    from pipeline.storage.locations import split_dirs_config
    from pipeline.config import validate_cluster_config
    from pipeline.errors import ReplogError

    try:
        dirs, overrides = split_dirs_config(read_properties(args.conf_file) if args.conf_file else {})
        file_config = validate_cluster_config(overrides)
        interval_ms = parse_interval_ms(args.trigger_interval) if args.trigger_interval else None
        figures_ms = (None if args.figures_interval is None else
                      0 if args.figures_interval.strip().lower() == "off" else parse_interval_ms(args.figures_interval))
    except (ReplogError, ValueError, OSError) as err:
        print(f"replicate: {err}", file=sys.stderr)
        return 2

    from pipeline import Cluster, get_spark
    from pipeline.storage.job_lock import hold_job_lock
    from pipeline.runtime import SparkSetupError

    try:
        lock = hold_job_lock(args.root)  # before Spark starts: a refused job costs nothing
        spark = get_spark(app_name="replog-replicate")
        cluster = Cluster.open(spark, args.root)
    except (ReplogError, SparkSetupError) as err:
        print(f"replicate: {err}", file=sys.stderr)
        return 1
    metrics = None
    try:
        if args.metrics_port is not None:
            from pipeline.metrics_export import serve_metrics
            metrics = serve_metrics(cluster, args.metrics_port, args.metrics_addr)
            LOG.info("metrics for Prometheus at http://%s:%d/metrics", args.metrics_addr, metrics.port)
        elsewhere = {b: cluster.storage.broker_root(b) for b, where in dirs.items()
                     if b not in cluster.brokers or cluster.storage.broker_root(b) != cluster.storage.location(where)}
        if elsewhere:  # a broker's location is the cluster's, set when it was made: the file must agree
            print(f"replicate: INVALID_CONFIG: {args.conf_file} gives brokers {sorted(elsewhere)} locations other "
                  f"than the cluster's ({elsewhere})", file=sys.stderr)
            return 2
        applied = {k: file_config[k] for k in overrides if cluster.config.get(k) != file_config[k]}
        if applied:  # the file is the cluster's configuration from now on (as kafka-configs --alter)
            cluster.alter_configs("brokers", None, set=applied)
            LOG.info("applied %s from %s", ", ".join(f"{k}={v}" for k, v in sorted(applied.items())), args.conf_file)
        stopping = threading.Event()
        install_stop_handlers(spark, stopping)
        if spark.sparkContext.uiWebUrl:
            LOG.info("Spark UI at %s", spark.sparkContext.uiWebUrl)
        if args.available_now:
            rounds = run_available_now(cluster, args.max_stalled_rounds, stopping)
            LOG.info("available-now: %d round%s", rounds, "" if rounds == 1 else "s")
            return 0
        if interval_ms is None:
            key = "replica.fetch.wait.max.ms"
            interval_ms = int(overrides[key]) if key in overrides else cluster.config.get(key, file_config[key])
        checkpoint = args.checkpoint or cluster.storage.join("checkpoints", "replicate")
        run_streaming(spark, cluster, interval_ms, checkpoint, stopping, figures_ms)
        return 0
    except ReplogError as err:
        print(f"replicate: round failed: {err}", file=sys.stderr)
        return 3
    finally:
        if metrics is not None:
            metrics.shutdown()
        if lock is not None:
            lock.close()


if __name__ == "__main__":
    sys.exit(main())
