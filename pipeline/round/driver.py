"""What runs one round for an open cluster: the lease, halting brokers whose location failed,
recovery of an interrupted round, the round's inputs gathered on the driver (O(brokers): the
controller's decisions, the KIP-227 fetch contexts, the KIP-73 budgets, the quota sensors), then
the round itself (run.py, or inputs.idle_round when nothing changed), and what it hands to the next."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pipeline import brokers as broker_ops
from pipeline.consume import sessions as consumer
from pipeline.control import controller
from pipeline.control import session_cache as sessions
from pipeline.config import LONG_MAX
from pipeline.errors import LogDirFailure
from pipeline.metadata_cache import broker_state
from pipeline.round.inputs import RoundInputs, RoundReport, idle_round
from pipeline.round.run import run_round as run_active_round
from pipeline.schemas import BROKERS_SCHEMA
from pipeline.storage import recovery

if TYPE_CHECKING:
    from pipeline.core import ClusterCore

__all__ = ["run_round", "caught_up", "nothing_waiting", "hold_lease_recovered", "round_sessions",
           "THROTTLE_BURST_SECONDS"]

# KIP-73 measures replication rates over replication.quota.window.num (11) windows of
# replication.quota.window.size.seconds (1): a throttled broker's unused budget accrues for at most
# that long
THROTTLE_BURST_SECONDS = 11

_log = logging.getLogger(__name__)


def nothing_waiting(report: RoundReport) -> bool:
    """After this round: no acks pending, no request held by a client quota, every partition settled."""
    return report.pending_requests == 0 and report.active_partitions == 0 and not report.throttled_requests


def caught_up(core: "ClusterCore", report: RoundReport) -> bool:
    """Whether the cluster is done after the round of `report` (Cluster.caught_up)."""
    return nothing_waiting(report) and core.storage.version("inbox") <= report.inbox_version


def run_round(core: "ClusterCore", batch_id: int | None = None) -> RoundReport:
    """One round (Cluster.run_round): a broker whose location fails halts, and a round that met
    the failure mid-way runs again after recovery undoes what it had committed."""
    core.lease.hold()
    while True:
        try:
            broker_ops.halt_failed_brokers(core)
            if not core.recovery_checked:
                _recover(core)
            core.reload_config()
            return _one_round(core, batch_id)
        except BaseException as err:
            # the round may have committed part of its writes: the next round undoes them first (or,
            # if its last wave landed whole, it is complete: the rounds table is read again)
            core.recovery_checked = False
            core.forget_rounds()
            failed = {err.broker: err.problem} if isinstance(err, LogDirFailure) and err.broker is not None else {}
            if not isinstance(err, Exception) or not broker_ops.halt_failed_brokers(core, failed):
                raise


def hold_lease_recovered(core: "ClusterCore") -> None:
    """The one-writer lease, for work beside the rounds that writes the tables rounds write
    (the cleaner, maintenance): an interrupted round is undone and replayed first."""
    core.lease.hold()
    if not core.recovery_checked or core.replay is not None:
        run_round(core)


def _recover(core: "ClusterCore") -> None:
    """Undoes what an interrupted round committed, and takes its inputs for the replay
    (storage/recovery.py). A halted broker's log is left as it is: when it holds a commit of such a
    round, that broker restarts empty."""
    failed = [r["broker"] for r in core.metadata.broker_rows() if r["log_dir_failure"] is not None]
    for broker in recovery.stale_logs(core.storage, failed, core.round_id):
        broker_ops.set_broker(core, broker, log_lost=True)
    replay = recovery.recover(core.storage, [b for b in core.brokers if b not in failed], core.round_id)
    core.recovery_checked = True
    if replay is not None:  # (the rounds table is read again: the replayed round's row may have been undone)
        core.replay = replay
        core.forget_rounds()


def _round_time(core: "ClusterCore", last: RoundReport | None) -> int:
    """The round's time: a replay's recorded one, else the clock's, but never before the last
    round's. A clock that stepped back runs the round at the last round's time, so no rule sees
    time go back (a lag, a session or a quota measured backwards) and no HW can move back by it."""
    replay = core.replay
    if replay is not None and replay.now_ms is not None:
        return replay.now_ms
    now = core.clock.now_ms()
    if last is not None and now < last.now_ms:
        _log.warning("the clock reads %d ms, %d ms before the last round's time: the round runs at %d ms",
                     now, last.now_ms - now, last.now_ms)
        return last.now_ms
    return now


def _inputs(core: "ClusterCore", batch_id: int | None, now: int, decisions: dict[str, Any],
            partitions_version: int, paused: dict, throttles: dict, retention_due: bool) -> RoundInputs:
    """The round's inputs, gathered on the driver from the metadata cache and the last round."""
    last, replay = core.last_report, core.replay
    down = set(decisions["down"])
    checked = last.retention_checked_ms if last else None
    return RoundInputs(
        round_id=core.round_id + 1, now_ms=now,
        last_inbox_version=last.inbox_version if last else 0,
        cluster_config=core.config, brokers=core.brokers, paused_brokers=paused, throttles=throttles,
        previous_round_ms=last.now_ms if last else None,
        last_admin_version=last.admin_version if last else 0,
        retention_due=retention_due, last_retention_check_ms=checked or 0,
        last_pending_requests=last.pending_requests if last else None, batch_id=batch_id,
        last_records_replicated=last.records_replicated if last else 0,
        reassigning=core.metadata.reassigning(partitions_version),
        throttle_budgets=_throttle_budgets(core, now, last.now_ms if last else None),
        quota_sensors=core.quota_sensors("producer_byte_rate", now),
        last_throttled_requests=last.throttled_requests if last else None,
        restarted=replay.restarted if replay is not None else core.restarted, controller=decisions,
        **_session_inputs(core, paused, down, core.metadata.fetch_pairs(partitions_version), now),
        plan_sessions=lambda pairs: _session_inputs(core, paused, down, pairs, now),
        inbox_to_version=replay.inbox_version if replay is not None else None,
        admin_to_version=replay.admin_version if replay is not None else None)


def _one_round(core: "ClusterCore", batch_id: int | None) -> RoundReport:
    paused, throttles = core.metadata.fetch_states()
    last, replay = core.last_report, core.replay
    now = _round_time(core, last)
    decisions = _controller_inputs(core, now)
    partitions_version = core.storage.version("partitions")
    checked = last.retention_checked_ms if last else None
    retention_due = checked is None or now - checked >= core.config["log.retention.check.interval.ms"]
    inputs = _inputs(core, batch_id, now, decisions, partitions_version, paused, throttles, retention_due)
    now_at = (core.storage.version("inbox"), partitions_version, core.storage.version("admin"), paused, throttles)
    quiet = (last is not None and nothing_waiting(last)
             and not retention_due and not decisions["fence"] and not decisions["unfence"]
             and all(c.kind == "incremental" for c in inputs.contexts))
    if quiet and now_at == core.seen and replay is None:
        report = idle_round(core.spark, core.storage, inputs, last)
    else:
        report, core.carry = run_active_round(core.spark, core.storage, inputs, core.carry)
        _after_controller(core, decisions)
    # a replay runs at its recorded time: the time this process was down after it must still not
    # count against the followers, so a restarted process's next round resets them (again)
    core.restarted = core.restarted and replay is not None
    # what the round has read: the inbox and admin requests up to the versions it fixed (a replay
    # only as far as the interrupted round did, and a request that came after the check above is
    # not read), so the next round is idle only if nothing came after those versions
    core.last_report, core.replay = report, None
    core.seen = (report.inbox_version, partitions_version, report.admin_version, paused, throttles)
    core.throttle_tokens = {k: float(v - report.throttled_bytes.get(k, 0)) for k, v in inputs.throttle_budgets.items()}
    core.record_quota("producer_byte_rate", report.client_quota_bytes, now)
    return report


def _controller_inputs(core: "ClusterCore", now: int) -> dict[str, Any]:
    """What the round's controller step does (O(brokers) decisions on the driver): the brokers
    to fence now (a stopped broker whose session expired: expired_broker_sessions, and a
    restarted one, whose old session ends as it registers again), the live brokers before and
    after the restarted ones are unfenced, and the brokers that lost their log."""
    rows = core.metadata.broker_rows()
    state = {r["broker"]: broker_state(r) for r in rows}
    expiring = [r for r in rows if state[r["broker"]] == controller.STOPPED]
    expired = []
    if expiring:
        df = core.spark.createDataFrame([(r["broker"], r["state"], r["last_heartbeat_ms"]) for r in expiring],
                                        "broker int, state string, last_heartbeat_ms long")
        expired = sorted(r["broker"] for r in controller.expired_broker_sessions(
            df, now, core.config["broker.session.timeout.ms"]).collect())
    starting = sorted(b for b, s in state.items() if s == controller.STARTING)
    fenced = {b for b, s in state.items() if s == controller.FENCED} | set(expired)
    return {
        "fence": expired, "unfence": starting,
        "live_before_start": [b for b in core.brokers if b not in fenced and b not in starting],
        "live": [b for b in core.brokers if b not in fenced],
        "lost_log": sorted(r["broker"] for r in rows if state[r["broker"]] == controller.STARTING and r["log_lost"]),
        "down": sorted(b for b, s in state.items() if s in controller.DOWN),
    }


def _after_controller(core: "ClusterCore", decisions: dict[str, Any]) -> None:
    """The brokers' new states once the round that fenced or unfenced them has committed."""
    rows = {r["broker"]: r.asDict() for r in core.metadata.broker_rows()}
    # compare-and-set: a broker stopped or started by another process meanwhile keeps that state
    for brokers, before, after in ((decisions["fence"], controller.STOPPED, {"state": controller.FENCED}),
                                   (decisions["unfence"], controller.STARTING,
                                    {"state": controller.RUNNING, "log_lost": False})):
        if brokers:
            core.storage.update_if(core.spark.createDataFrame(
                [tuple({**rows[b], **after}[f] for f in BROKERS_SCHEMA.fieldNames()) for b in brokers],
                BROKERS_SCHEMA), "brokers", ["broker"], only_if=f"t.state = '{before}'")


def round_sessions(core: "ClusterCore") -> tuple[list[sessions.Session], list[sessions.Handle]]:
    """The sessions and handles after the newest round (its consumers' sessions are stale
    copies: consumer.ClientSessions.cache keeps only the followers' from them)."""
    return sessions.sessions_from_json(core.last_report.fetch_sessions if core.last_report else None)


def _session_inputs(core: "ClusterCore", paused: dict[int, int | None], down: set[int],
                    fetch_pairs: dict[tuple[int, int], int], now: int) -> dict[str, Any]:
    """The round's fetch requests as their leaders take them (KIP-227), for the (follower,
    leader) -> partitions pairs. A round whose controller elects new leaders plans them again
    with the pairs after its elections (RoundInputs.plan_sessions): the second plan starts from
    the same sessions, so only its outcome counts, except that consumers' sessions the first
    evicted stay evicted."""
    last, handles = round_sessions(core)
    clients = core.metadata.client_sessions()
    before = clients.cache(last)
    # a broker that is down neither fetches nor answers fetches
    pairs = {k: v for k, v in fetch_pairs.items() if k[1] not in down}
    contexts, after, handles, evictions = sessions.round_contexts(
        before, handles, pairs, set(paused), now,
        core.config["max.incremental.fetch.session.cache.slots"], core.rng,
        sessionless=core.config["replication.fetch.mode"] == "full")
    survivors = consumer.client_cache_after_round(clients, after)
    if survivors is not None:  # followers' sessions evicted consumers' (privileged first)
        consumer.save_client_sessions(core.storage, survivors)
    return {"contexts": contexts, "sessions_after": after, "handles_after": handles,
            "session_evictions": evictions}


def _throttle_budgets(core: "ClusterCore", now: int, previous_ms: int | None) -> dict[tuple[str, int], int]:
    """Each throttled broker's bytes for this round (KIP-73, `leader.replication.throttled.rate`
    and `follower.replication.throttled.rate`, bytes/s by the cluster clock): what it left
    unused plus the rate times the time since the last round, at most THROTTLE_BURST_SECONDS'
    worth. Brokers without a rate are absent (unlimited)."""
    elapsed = max(now - previous_ms, 0) if previous_ms is not None else 0
    budgets = {}
    for side in ("leader", "follower"):
        rate = core.config[f"{side}.replication.throttled.rate"]
        if rate >= LONG_MAX:
            continue
        for broker in core.brokers:
            tokens = core.throttle_tokens.get((side, broker), 0.0) + rate * elapsed / 1000
            budgets[(side, broker)] = min(tokens, float(rate * THROTTLE_BURST_SECONDS))
    return {k: int(v) for k, v in budgets.items()}
