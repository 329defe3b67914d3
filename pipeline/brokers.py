"""A broker's life as an operator (or a fault) changes it: a paused or throttled fetcher, a crash
(stop_broker), a restart (start_broker), and a halt when its storage location fails, as Kafka
halts a broker whose only log dir fails (ReplicaManager.handleLogDirFailure). The rounds read the
states written here (metadata_cache.py) and the controller acts on them (round/driver.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping

from pyspark.sql import functions as F

from pipeline.control import controller
from pipeline.errors import ErrorCode, ReplogError
from pipeline.metadata_cache import broker_state
from pipeline.schemas import BROKERS_SCHEMA
from pipeline.storage.locations import log_problem, write_problem

if TYPE_CHECKING:
    from pipeline.core import ClusterCore

__all__ = ["set_broker", "pause_fetcher", "resume_fetcher", "throttle_fetcher", "stop_broker", "start_broker",
           "halt_failed_brokers", "log_readable"]

_log = logging.getLogger(__name__)


def set_broker(core: "ClusterCore", broker: int, **changes: Any) -> None:
    """Changes columns of one broker's row (one MERGE); BROKER_NOT_AVAILABLE for no such broker."""
    if broker not in core.brokers:
        raise ReplogError(ErrorCode.BROKER_NOT_AVAILABLE, f"no broker {broker!r}")
    row = core.storage.read("brokers").filter(F.col("broker") == broker).first().asDict()
    row.update(changes)
    core.storage.upsert(core.spark.createDataFrame([tuple(row[f] for f in BROKERS_SCHEMA.fieldNames())],
                                                   BROKERS_SCHEMA), "brokers", ["broker"])


def pause_fetcher(core: "ClusterCore", broker: int) -> None:
    # remembered: the time of its last fetch, which Kafka's lag rule measures from
    set_broker(core, broker, fetcher_paused=True, changed_ms=core.last_round_ms())


def resume_fetcher(core: "ClusterCore", broker: int) -> None:
    set_broker(core, broker, fetcher_paused=False, changed_ms=core.admin_now_ms())


def throttle_fetcher(core: "ClusterCore", broker: int, max_bytes_per_round: int | None) -> None:
    if max_bytes_per_round is not None and (not isinstance(max_bytes_per_round, int) or max_bytes_per_round < 1):
        raise ValueError(f"max_bytes_per_round must be an int >= 1 or None, got {max_bytes_per_round!r}")
    set_broker(core, broker, fetch_max_bytes_per_round=max_bytes_per_round)


def stop_broker(core: "ClusterCore", broker: int, log_dir_failure: str | None = None) -> None:
    """A crash (Cluster.stop_broker). A broker still starting (no round has registered it yet)
    can crash too: its last heartbeat is its registration, and a lost log it restarted with stays
    on record for its next start."""
    state = broker_state(core.metadata.broker_row(broker))
    if state == controller.STARTING:
        set_broker(core, broker, state=controller.STOPPED, log_dir_failure=log_dir_failure)
        return
    if state != controller.RUNNING:
        raise ReplogError(ErrorCode.BROKER_NOT_AVAILABLE, f"broker {broker} is not running ({state})")
    set_broker(core, broker, state=controller.STOPPED, last_heartbeat_ms=core.last_round_ms(),
               log_dir_failure=log_dir_failure)


def start_broker(core: "ClusterCore", broker: int) -> None:
    """A restart (Cluster.start_broker): refused (KAFKA_STORAGE_ERROR) while its location cannot be
    written; a missing, corrupted or foreign log restarts empty, once a round has fenced the
    broker's previous incarnation (DUPLICATE_BROKER_REGISTRATION before that)."""
    row = core.metadata.broker_row(broker)
    state = broker_state(row)
    if state not in controller.DOWN:
        raise ReplogError(ErrorCode.BROKER_NOT_AVAILABLE, f"broker {broker} is not stopped ({state})")
    where = core.storage.broker_root(broker)
    unwritable = write_problem(core.storage, where)
    if unwritable:
        raise ReplogError(ErrorCode.KAFKA_STORAGE_ERROR, f"broker {broker} cannot start: its location {where} "
                          f"{unwritable}")
    # a missing, corrupted or foreign log restarts empty, as Kafka does with a failed log dir; so
    # does a log an interrupted round wrote to after the broker halted (recovery could not undo it),
    # and an empty log from a start that crashed before a round registered it is still a lost one
    lost = bool(row["log_lost"]) or log_problem(core.storage, broker) is not None
    if lost and state == controller.STOPPED:
        _refuse_an_empty_leader(core, broker, row)
    if lost:
        _recreate_log(core, broker)
    set_broker(core, broker, state=controller.STARTING, last_heartbeat_ms=core.admin_now_ms(), log_lost=lost,
               log_dir_failure=None)
    core.register_views()


def _refuse_an_empty_leader(core: "ClusterCore", broker: int, row: Any) -> None:
    """DUPLICATE_BROKER_REGISTRATION when `broker`, not fenced yet, still leads a partition and would
    restart with an empty log. Kafka's controller refuses a new incarnation's registration while the
    old one's session is valid (ClusterControlManager.registerBroker) and, when it expires, fences the
    old one: its leaderships move. Here the rounds fence, and the clock may stand still (a clock that
    stepped back); an empty log in place of a leader's would take its partitions' HW back to 0. (An
    empty follower that restarts unfenced is taken out of the ISR by the next round.)"""
    led = core.storage.read("partitions").filter(F.col("leader") == broker).count()
    if led:
        timeout = core.config["broker.session.timeout.ms"]
        raise ReplogError(ErrorCode.DUPLICATE_BROKER_REGISTRATION,
                          f"broker {broker} would restart with an empty log while its previous incarnation, not "
                          f"fenced yet, leads {led} partition(s): the first round broker.session.timeout.ms "
                          f"({timeout} ms) after its last heartbeat (cluster time {row['last_heartbeat_ms']}) fences "
                          f"it; start it after that round")


def _recreate_log(core: "ClusterCore", broker: int) -> None:
    """An empty log for `broker` and its replicas' offsets back to 0 (they refetch from the
    leaders' log start offsets)."""
    core.storage.remove_log(broker)
    core.storage.create_log(broker)
    zero = ("log_start_offset", "log_end_offset", "high_watermark", "fetch_offset", "last_fetch_leader_leo",
            "last_caught_up_time_ms", "validated_leader_epoch", "session_id")
    core.storage.reset_replica_state(broker, {c: "0" for c in zero})


def log_readable(core: "ClusterCore", broker: int) -> bool:
    return log_problem(core.storage, broker) is None


def halt_failed_brokers(core: "ClusterCore", failed: Mapping[int, str] | None = None) -> list[int]:
    """Halts every running (or starting) broker whose storage location has failed: those in
    `failed` (broker -> what a write met) and those whose log a check of its Delta snapshot finds
    gone, unreadable, of another schema or another cluster's (no Spark job). A halted broker is
    stopped as by stop_broker, and its brokers row says why. Returns the brokers it halted."""
    problems = {}
    for r in core.metadata.broker_rows():
        broker = r["broker"]
        if broker_state(r) in controller.DOWN:
            continue
        problem = (failed or {}).get(broker)
        if problem is None:
            found = log_problem(core.storage, broker)
            problem = found and f"the log of broker {broker} at {core.storage.log_path(broker)} {found}"
        if problem:
            problems[broker] = problem
    for broker, problem in sorted(problems.items()):
        _log.warning("broker %d halts: its log directory failed (%s); start_broker(%d) restarts it", broker,
                     problem, broker)
        stop_broker(core, broker, log_dir_failure=problem)
    if problems:
        core.register_views()
    return sorted(problems)
