"""Work beside the rounds that writes what rounds write, so it holds the one-writer lease and
finishes an interrupted round first: the log cleaner (cleaner.py) and Delta maintenance
(storage/maintenance.py), each on demand or when its interval has passed by the cluster clock."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from pipeline import brokers as broker_ops
from pipeline.control import cleaner
from pipeline.control import controller
from pipeline.metadata_cache import broker_state
from pipeline.round.driver import hold_lease_recovered
from pipeline.storage import maintenance

if TYPE_CHECKING:
    from pipeline.core import ClusterCore

__all__ = ["compact", "compact_if_due", "maintain", "maintain_if_due"]


def compact(core: "ClusterCore") -> cleaner.CleanerReport | None:
    """One pass of the log cleaner (Cluster.compact) over the running brokers' logs."""
    hold_lease_recovered(core)
    down = {r["broker"] for r in core.metadata.broker_rows() if broker_state(r) != controller.RUNNING}
    return cleaner.run_cleaner(core.spark, core.storage, core.brokers, core.config, core.clock.now_ms(),
                               down, lambda broker: broker_ops.log_readable(core, broker), core.lease.hold)


def compact_if_due(core: "ClusterCore") -> cleaner.CleanerReport | None:
    """A compact() pass when log.cleaner.enable is on and log.cleaner.backoff.ms has passed since
    the last pass; None otherwise."""
    if not core.config["log.cleaner.enable"]:
        return None
    now = core.clock.now_ms()
    if core.last_clean_ms is None:
        core.last_clean_ms = core.storage.read("cleaner_runs").agg(F.max("now_ms")).first()[0]
    if core.last_clean_ms is not None and now - core.last_clean_ms < core.config["log.cleaner.backoff.ms"]:
        return None
    core.last_clean_ms = now
    return compact(core)


def maintain(core: "ClusterCore") -> maintenance.MaintenanceReport:
    """One maintenance pass (Cluster.maintain) over every table and every sound broker log (not
    a halted one's)."""
    hold_lease_recovered(core)
    healthy = [r["broker"] for r in core.metadata.broker_rows() if r["log_dir_failure"] is None]
    report = maintenance.maintain(core.storage, healthy, core.config)
    core.last_maintenance_ms = core.clock.now_ms()
    maintenance.record_pass(core.storage, core.last_maintenance_ms)
    return report


def maintain_if_due(core: "ClusterCore") -> maintenance.MaintenanceReport | None:
    """A maintain() pass when log.maintenance.interval.ms has passed since the last pass by any
    job; None otherwise. A cluster that never had one starts counting now (recorded, no pass)."""
    now = core.clock.now_ms()
    if core.last_maintenance_ms is None:
        core.last_maintenance_ms = maintenance.last_pass_ms(core.storage)
        if core.last_maintenance_ms is None:
            maintenance.record_pass(core.storage, now)
            core.last_maintenance_ms = now
    if now - core.last_maintenance_ms < core.config["log.maintenance.interval.ms"]:
        return None
    return maintain(core)
