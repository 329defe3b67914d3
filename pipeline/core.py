"""The state one open cluster keeps in its process, shared by the facade's parts (admin.py,
brokers.py, consume.py, housekeeping.py, reads.py and round/driver.py): the session, the root's
storage, the clock, the cluster config, the metadata cache, the one-writer lease, and what the
rounds of this process hand on (the newest round's report, the carry, the recovery state, the
KIP-73 tokens and the quota sensors), as a Kafka broker keeps them in memory."""

from __future__ import annotations

import json
import random
from typing import Any, Mapping

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipeline.control import quotas
from pipeline.control import session_cache as sessions
from pipeline.clock import Clock
from pipeline.config import with_defaults
from pipeline.metadata_cache import MetadataCache
from pipeline.round import Carry, RoundReport
from pipeline.storage import Storage, recovery, views
from pipeline.storage.lease import Lease

__all__ = ["ClusterCore"]

_UNREAD = object()  # ClusterCore.last_report before the rounds table is read


def newest_report(storage: Storage) -> RoundReport | None:
    """The newest complete round's report, read from the rounds table (None before any round). A
    row whose round's last wave did not land whole is not a complete round's (storage/recovery.py)."""
    last = storage.read("rounds").orderBy(F.col("round_id").desc()).limit(2).collect()
    if last and recovery.last_complete_round(storage, last[0]["round_id"])[0] < last[0]["round_id"]:
        last = last[1:]
    return RoundReport(**last[0].asDict()) if last else None


class ClusterCore:
    """One open cluster's process state (see the module's docstring)."""

    def __init__(self, spark: SparkSession, storage: Storage, clock: Clock, config: dict[str, Any],
                 brokers: list[int], views_wanted: bool = True):
        self.spark = spark
        self.storage = storage
        self.clock = clock
        self.config = config
        self.brokers = brokers
        self.views_wanted = views_wanted
        self.metadata = MetadataCache(self)
        self.rng = random.Random()  # fetch session ids
        self.config_version = storage.version("cluster")  # alter_configs(brokers) changes it
        # the one-writer lease: every commit of a round checks it first
        self.lease = Lease(spark, storage, clock)
        storage.before_commit = self.lease.hold
        # what the rounds of this process hand on (round/driver.py)
        self._last: RoundReport | None | object = _UNREAD
        self.seen: tuple | None = None  # table versions and broker states at the last round
        self.carry: Carry | None = None  # the last round's state, pinned (round.Carry)
        self.restarted = False  # set by Cluster.open: the next round is this process's first
        # recovery (storage/recovery.py): checked by this object's first round and after a failed
        # round; the inputs of an interrupted round to replay, once found
        self.recovery_checked = False
        self.replay: recovery.Replay | None = None
        # KIP-73: ("leader" | "follower", broker) -> bytes of throttled replication left over
        self.throttle_tokens: dict[tuple[str, int], float] = {}
        # client quotas (quotas.py): the rates measured in this process (produce: by its rounds;
        # consume: by its consumers' reads), as a Kafka broker keeps its quota metrics in memory
        window = (config["quota.window.num"], config["quota.window.size.seconds"] * 1000)
        self.sensors = {key: quotas.Sensors(*window) for key in quotas.QUOTA_KEYS}
        # consumers of this process: their last fetch's requests and throttle time
        self.consumer_requests: dict[str, list[sessions.Context]] = {}
        self.fetch_throttles: dict[str, int] = {}
        # work beside the rounds (housekeeping.py): the cleaner's and maintenance's last pass
        self.last_clean_ms: int | None = None
        self.last_maintenance_ms: int | None = None

    def set_clock(self, clock: Clock) -> None:
        """Another clock from now on (a test's, after a restart)."""
        self.clock = self.lease.clock = clock

    # -- the newest round ------------------------------------------------------------------------
    @property
    def last_report(self) -> RoundReport | None:
        """The newest round's report, read from the rounds table when first asked for (a command
        that runs no round and needs no round id never reads it)."""
        if self._last is _UNREAD:
            self._last = newest_report(self.storage)
        return self._last  # type: ignore[return-value]

    @last_report.setter
    def last_report(self, report: RoundReport | None) -> None:
        self._last = report

    def forget_rounds(self) -> None:
        """Drops what the rounds handed on: the next round reads the tables (and the rounds table)
        again, as after a failed round or a replay found."""
        self.carry, self.seen, self._last = None, None, _UNREAD

    @property
    def round_id(self) -> int:
        return self.last_report.round_id if self.last_report else 0

    def admin_now_ms(self) -> int:
        """The time an admin call stamps on what the rounds measure time from (a new replica's
        last fetch, a restarted broker's registration, a resumed fetcher): the clock, but never
        before the newest round's time. A clock that stepped back runs the rounds at the last
        round's time, and a stamp before it would date a change before rounds that preceded it."""
        now = self.clock.now_ms()
        return max(now, self.last_report.now_ms) if self.last_report else now

    def last_round_ms(self) -> int:
        """The newest round's time (a broker's last heartbeat or fetch), else the clock's."""
        return self.last_report.now_ms if self.last_report else self.clock.now_ms()

    # -- client quotas (quotas.py) ---------------------------------------------------------------
    def quota_sensors(self, key: str, now: int):
        """For a round: (user, client_id) pairs -> their `key` quota's sensor rows (see
        round.client_quotas); None when no client has that quota. Brings the sensors' windows up
        to the config's."""
        entries = self.metadata.quota_entries()
        if not any(key in v for v in entries.values()):
            return None
        sensors = self.sensors[key]
        sensors.reconfigure(self.config["quota.window.num"], self.config["quota.window.size.seconds"] * 1000)

        def rows(pairs: list[tuple]) -> list[tuple]:
            out = []
            for user, client_id in pairs:
                found = quotas.quota_for(entries, key, user, client_id)
                if found is None:
                    out.append((user, client_id, None, None, None, 0, 1, False))
                    continue
                sensor, quota = found
                out.append((user, client_id, *sensor, quota, *sensors.state(sensor, now)))
            return out
        return rows

    def record_quota(self, key: str, recorded: Mapping[tuple[str, str], tuple[int, int]], now: int) -> None:
        """Records the bytes a round (or a consumer's fetch) served per sensor, (bytes, quota); over
        its quota, the sensor's clients wait the throttle time."""
        for sensor, (value, quota) in recorded.items():
            self.sensors[key].record(sensor, quota, value, now)

    # -- config and views ------------------------------------------------------------------------
    def reload_config(self) -> None:
        """The cluster-wide config as another process may have altered it (a version check, ~4 ms);
        a change drops the carried state, whose partitions hold the effective topic settings. A new
        version with the same config (a maintenance pass records its time in the table's
        properties) keeps it: dropping it would make the next round read every partition again."""
        version = self.storage.version("cluster")
        if version != self.config_version:
            row = self.storage.read("cluster").first()
            config = with_defaults(json.loads(row["config"]))
            self.config_version = version
            if config == self.config:
                return
            self.config, self.carry, self.seen = config, None, None
            self.register_views()

    def register_views(self, force: bool = False) -> None:
        """The replog.* views again, over the logs there are now (a halted broker's may be gone);
        `force`: also in a process that did not ask for views (the brokers changed)."""
        if self.views_wanted or force:
            views.register_views(self.spark, self.storage, self.brokers, self.config["min.insync.replicas"])
