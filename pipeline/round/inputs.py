"""What a round reads before it starts and reports after it: RoundInputs (O(brokers) values the
driver knows), RoundReport (one row of `replog.rounds`), the table versions a carry is valid for,
and the idle round, which writes only its report."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from pyspark.sql import SparkSession

from pipeline.control import session_cache as sessions
from pipeline.schemas import ROUNDS_SCHEMA
from pipeline.storage import Storage

REQUEST_KEY = ["request_id", "topic", "partition"]

@dataclass(frozen=True)
class RoundReport:
    """What one round did (also one row of `replog.rounds`)."""

    round_id: int
    now_ms: int
    inbox_version: int
    fetch_request_partitions: int
    fetch_response_partitions: int
    records_appended: int
    records_replicated: int
    requests_acked: int
    requests_failed: int
    isr_shrinks: int
    isr_expands: int
    under_replicated_partitions: int
    under_min_isr_partitions: int
    at_min_isr_partitions: int
    offline_partitions: int
    max_lag: int
    active_partitions: int
    pending_requests: int
    admin_version: int
    retention_checked_ms: int
    duration_ms: int
    batch_id: int | None = None
    incremental_fetch_sessions: int = 0  # Kafka's NumIncrementalFetchSessions (all leaders)
    incremental_fetch_partitions_cached: int = 0  # NumIncrementalFetchPartitionsCached
    fetch_session_evictions: int = 0  # this round's; IncrementalFetchSessionEvictionsPerSec in metrics
    fetch_sessions: str | None = None  # JSON: every leader's session cache and fetcher's handle after it
    throttled_requests: int | None = 0  # produce requests left waiting for their client's quota
    hw_advances: int | None = 0  # partitions whose leader's high watermark moved up
    broker_gauges: str | None = None  # JSON: each broker's replica-manager gauges (round/figures.py)
    # ("leader" | "follower", broker) -> bytes moved for throttled replicas (KIP-73); not a column
    throttled_bytes: dict = field(default_factory=dict, compare=False)
    # a produce quota's sensor key -> (bytes of the requests it let through, quota); not a column
    client_quota_bytes: dict = field(default_factory=dict, compare=False)
    # seconds on the driver by phase of an active round (jobs/profile_round.py); not a column
    phases: dict = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict[str, Any]:
        row = asdict(self)
        for name in ("throttled_bytes", "client_quota_bytes", "phases"):
            row.pop(name)
        return row

@dataclass(frozen=True)
class RoundInputs:
    """What the driver knows before a round: O(brokers) values, never per-partition data."""

    round_id: int
    now_ms: int
    last_inbox_version: int
    cluster_config: dict[str, Any]
    brokers: list[int]
    paused_brokers: dict[int, int | None]  # broker -> its last fetch time before the pause
    throttles: dict[int, int]  # broker -> max bytes per partition per round
    previous_round_ms: int | None
    last_admin_version: int = 0
    retention_due: bool = False
    last_retention_check_ms: int = 0
    last_pending_requests: int | None = None  # None: unknown, read the results table
    last_records_replicated: int = 0  # by the last round: followers far behind make a bulk round
    batch_id: int | None = None  # the streaming job's micro-batch, recorded in the rounds row
    # KIP-227: what each leader made of each follower's fetch request this round, and the caches and
    # handles after them (see fetch_session.round_contexts)
    contexts: list = field(default_factory=list)
    sessions_after: list = field(default_factory=list)
    handles_after: list = field(default_factory=list)
    session_evictions: int = 0
    # the fetch sessions planned again for the (follower, leader) -> partitions pairs after the
    # controller's elections (round/driver.py's _session_inputs): returns contexts, sessions_after,
    # handles_after and session_evictions, so a follower fetches from its new leader in the round
    # that elected it, as Kafka's fetcher adds the partition at the leader change
    plan_sessions: Callable[[dict], dict] | None = None
    # the first round of a process that opened an existing cluster: its brokers (re)start
    restarted: bool = False
    # the controller's decisions (round/driver.py's _controller_inputs): fence, unfence, live_before_start,
    # live, lost_log, down (brokers stopped or fenced before this round)
    controller: dict | None = None
    # the inbox and admin versions the round reads up to (None: the newest; a replayed round reads
    # what it read the first time, see storage/recovery.py)
    inbox_to_version: int | None = None
    admin_to_version: int | None = None
    # a partition has a reassignment in progress (KIP-455): the controller checks for completions
    reassigning: bool = False
    # KIP-73 replication quotas: ("leader" | "follower", broker) -> bytes that broker may still move
    # for throttled replicas this round (absent: unlimited); see round/driver.py's _throttle_budgets
    throttle_budgets: dict = field(default_factory=dict)
    # client quotas (pipeline/control/quotas.py): (user, client_id) pairs -> their produce quota's sensor
    # rows (ClusterCore.quota_sensors; None: no producer_byte_rate is configured), and the requests
    # the last round left waiting (None: unknown, 0: none)
    quota_sensors: Callable[[list[tuple]], list[tuple]] | None = None
    last_throttled_requests: int | None = None

def with_input_versions(storage: Storage, inputs: RoundInputs) -> RoundInputs:
    """`inputs` with the inbox and admin versions it reads fixed, once, and the round's commits
    tagged with them (storage.commit_tag), so an interrupted round can be replayed as it ran."""
    inbox = inputs.inbox_to_version if inputs.inbox_to_version is not None else storage.version("inbox")
    admin = inputs.admin_to_version if inputs.admin_to_version is not None else storage.version("admin")
    inputs = replace(inputs, inbox_to_version=max(inbox, inputs.last_inbox_version),
                     admin_to_version=max(admin, inputs.last_admin_version))
    storage.round_inputs = (f"now={inputs.now_ms};inbox={inputs.inbox_to_version};"
                            f"admin={inputs.admin_to_version};restarted={int(inputs.restarted)}")
    return inputs

# the tables whose content a round carries over to the next round of the same process
CARRIED_TABLES = ("replica_state", "partitions", "topics", "results")


def table_versions(storage: Storage) -> tuple[int, ...]:
    return tuple(storage.version(t) for t in CARRIED_TABLES)

def rows_changed(storage: Storage, carried: tuple[int, ...], seen: tuple[int, ...]) -> bool:
    """Whether another writer changed the rows of a carried table since the carry's versions. A
    commit that changes no rows (a maintenance pass's compaction or properties) keeps the carry:
    at P = 100,000 a round without one reads every partition again (33-53 s)."""
    return any(c != s and storage.rows_changed(t, c, s) for t, c, s in zip(CARRIED_TABLES, carried, seen))

def session_figures(inputs: RoundInputs, after: list, handles: list) -> dict[str, Any]:
    return {"incremental_fetch_sessions": len(after),
            "incremental_fetch_partitions_cached": sum(s.size for s in after),
            "fetch_session_evictions": inputs.session_evictions,
            "fetch_sessions": sessions.sessions_to_json(after, handles, inputs.contexts)}

def idle_round(spark: SparkSession, storage: Storage, inputs: RoundInputs, previous: RoundReport) -> RoundReport:
    """A round with nothing to do (no new produce, every partition settled, no pending request, no
    broker change): it writes only its metrics row, carrying the cluster's health over."""
    started = time.perf_counter()
    storage.round_inputs = f"now={inputs.now_ms}"
    report = replace(
        previous, round_id=inputs.round_id, now_ms=inputs.now_ms, inbox_version=inputs.last_inbox_version,
        fetch_request_partitions=0, fetch_response_partitions=0, records_appended=0, records_replicated=0,
        requests_acked=0, requests_failed=0, isr_shrinks=0, isr_expands=0, hw_advances=0, batch_id=inputs.batch_id,
        throttled_bytes={}, client_quota_bytes={}, phases={},
        duration_ms=int((time.perf_counter() - started) * 1000),
        **session_figures(inputs, inputs.sessions_after, inputs.handles_after))
    storage.append_table(spark.createDataFrame([tuple(report.as_dict().values())], ROUNDS_SCHEMA), "rounds",
                         inputs.round_id)
    return report
