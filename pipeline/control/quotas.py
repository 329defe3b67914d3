"""Client quotas (Kafka's design, section 4.9): `producer_byte_rate` and `consumer_byte_rate` in
bytes per second, per (user, client-id), per user or per client-id, measured over sampled windows
by the cluster clock.

- Which quota applies to a (user, client-id) follows Kafka's precedence (`quota_for`): the most
  specific configured entity wins, user entities before client-id ones, a named entity before the
  default (`<default>`) one. A client without a user is Kafka's unauthenticated principal,
  ANONYMOUS; a produce without a client id has Kafka's empty one.
- Clients that match one entity share its measurement (Kafka's quota metric tags): a user-level
  quota is shared by all that user's client ids, a `<default>` one is measured per user (or per
  client id) it applies to (`quota_for`'s sensor key).
- The rate is Kafka's `Rate` over a `WindowedSum` (`WindowedRate`): `quota.window.num` samples of
  `quota.window.size.seconds`, a window padded to `num - 1` full samples (so a new client may burst
  up to the quota times that), and over the quota a throttle time of (rate - quota) / quota x window
  (Kafka's QuotaUtils.throttleTime): how long until the rate is back at the quota with no more bytes.
- Kafka records a request's bytes, then throttles the client: its response carries the throttle
  time and the client sends nothing until it has passed (KIP-219). Here requests queue in the inbox
  while their client is throttled (`admit_within_quota`): a round serves a client's requests in
  order while its rate, before each, is within the quota, records them, and the client's later
  requests wait for a later round. Nothing is dropped; a request's `throttle_time_ms` in
  `produce_results` is how long the quota held it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipeline.errors import ErrorCode, ReplogError

__all__ = ["DEFAULT", "ANONYMOUS", "QUOTA_KEYS", "ENTITY_TYPES", "quota_for", "WindowedRate", "Sensors",
           "check_entity", "check_quota_values", "admit_within_quota", "request_bytes"]

DEFAULT = "<default>"  # Kafka's name of the default entity (kafka-configs --entity-default)
ANONYMOUS = "ANONYMOUS"  # Kafka's principal of a client that did not authenticate
QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate")
ENTITY_TYPES = ("user", "client-id")  # Kafka's ClientQuotaEntity types


def quota_for(entries: Mapping[tuple[str | None, str | None], Mapping[str, Any]], key: str, user: str | None,
              client_id: str | None) -> tuple[tuple[str, str], int] | None:
    """The quota `key` of a client: ((sensor user, sensor client-id), bytes/s), or None (no quota).
    `entries`: (user entity, client-id entity) -> configured values; an entity is a name, DEFAULT,
    or None (not part of it). Kafka's order: users/<user>/clients/<client-id>, users/<user>/clients/
    <default>, users/<user>, users/<default>/clients/<client-id>, users/<default>/clients/<default>,
    users/<default>, clients/<client-id>, clients/<default>."""
    user = ANONYMOUS if user is None else user
    client_id = "" if client_id is None else client_id
    both, user_only, client_only = (user, client_id), (user, ""), ("", client_id)
    order = (((user, client_id), both), ((user, DEFAULT), both), ((user, None), user_only),
             ((DEFAULT, client_id), both), ((DEFAULT, DEFAULT), both), ((DEFAULT, None), user_only),
             ((None, client_id), client_only), ((None, DEFAULT), client_only))
    for entity, sensor in order:
        value = entries.get(entity, {}).get(key)
        if value is not None:
            return sensor, int(value)
    return None


@dataclass
class WindowedRate:
    """Kafka's Rate over a WindowedSum (org.apache.kafka.common.metrics): `samples` windows of
    `window_ms`, each [start_ms, bytes]; a sample is complete once `window_ms` has passed since its
    start, and obsolete (reset) once `samples x window_ms` has."""

    samples: int
    window_ms: int
    windows: list[list[int]] = field(default_factory=list)
    current: int = 0

    def _purge(self, now_ms: int) -> None:
        for w in self.windows:
            if now_ms - w[0] >= self.samples * self.window_ms:
                w[0], w[1] = now_ms, 0

    def record(self, value: int, now_ms: int) -> None:
        if not self.windows:
            self.windows.append([now_ms, 0])
        w = self.windows[self.current]
        if now_ms - w[0] >= self.window_ms:  # complete: the next sample (a new one, or the oldest reused)
            self.current = (self.current + 1) % self.samples
            if self.current >= len(self.windows):
                self.windows.append([now_ms, 0])
            else:
                self.windows[self.current][0], self.windows[self.current][1] = now_ms, 0
            w = self.windows[self.current]
        w[1] += value

    def window_size_ms(self, now_ms: int) -> int:
        """The time the rate divides by: since the oldest live sample began, padded to samples - 1
        full windows (Rate.windowSize)."""
        self._purge(now_ms)
        oldest = min((w[0] for w in self.windows), default=now_ms)
        elapsed = now_ms - oldest
        full = elapsed // self.window_ms
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return elapsed

    def total(self, now_ms: int) -> int:
        self._purge(now_ms)
        return sum(w[1] for w in self.windows)

    def rate(self, now_ms: int) -> float:
        """Bytes per second."""
        size = self.window_size_ms(now_ms)
        return self.total(now_ms) * 1000 / size if size else 0.0

    def throttle_ms(self, quota: int, now_ms: int) -> int:
        """0 within the quota; over it, (rate - quota) / quota x window (QuotaUtils.throttleTime)."""
        rate = self.rate(now_ms)
        if rate <= quota:
            return 0
        return int(round((rate - quota) / quota * self.window_size_ms(now_ms)))


class Sensors:
    """One kind of client quota's measurements, by sensor key (in memory, like a Kafka broker's
    quota metrics: a new process starts them empty): each key's rate and the time its client is
    throttled until."""

    def __init__(self, samples: int, window_ms: int) -> None:
        self.samples, self.window_ms = samples, window_ms
        self.rates: dict[tuple[str, str], WindowedRate] = {}
        self.throttled_until: dict[tuple[str, str], int] = {}

    def reconfigure(self, samples: int, window_ms: int) -> None:
        """A changed quota.window.num or quota.window.size.seconds starts the measurements over."""
        if (samples, window_ms) != (self.samples, self.window_ms):
            self.__init__(samples, window_ms)

    def _rate(self, key: tuple[str, str]) -> WindowedRate:
        if key not in self.rates:
            self.rates[key] = WindowedRate(self.samples, self.window_ms)
        return self.rates[key]

    def state(self, key: tuple[str, str], now_ms: int) -> tuple[int, int, bool]:
        """(bytes in the window, the window in ms, throttled now) of a sensor."""
        rate = self._rate(key)
        return rate.total(now_ms), rate.window_size_ms(now_ms), self.throttled_until.get(key, 0) > now_ms

    def remaining_ms(self, key: tuple[str, str], now_ms: int) -> int:
        return max(self.throttled_until.get(key, 0) - now_ms, 0)

    def record(self, key: tuple[str, str], quota: int, value: int, now_ms: int) -> int:
        """Records `value` bytes and returns the throttle time they cause (0 within the quota); the
        sensor's clients wait that long."""
        rate = self._rate(key)
        rate.record(value, now_ms)
        throttle = rate.throttle_ms(quota, now_ms)
        if throttle > 0:
            self.throttled_until[key] = now_ms + throttle
        return throttle


def check_entity(entity: Any) -> tuple[str | None, str | None]:
    """A ClientQuotaEntity as {"user": name | None, "client-id": name | None} (None: the default;
    a type left out is not part of the entity) -> (user entity, client-id entity)."""
    if not isinstance(entity, Mapping) or not entity or set(entity) - set(ENTITY_TYPES):
        raise ReplogError(ErrorCode.INVALID_REQUEST,
                          f"a client quota entity maps 'user' and/or 'client-id' to a name or None "
                          f"(the default), got {entity!r}")
    parts = []
    for kind in ENTITY_TYPES:
        if kind not in entity:
            parts.append(None)
            continue
        name = entity[kind]
        if name is None:
            parts.append(DEFAULT)
        elif isinstance(name, str) and name and name != DEFAULT:
            parts.append(name)
        else:
            raise ReplogError(ErrorCode.INVALID_REQUEST,
                              f"{kind} must be a non-empty name or None (the default), got {name!r}")
    return parts[0], parts[1]


def check_quota_values(values: Mapping[str, Any], deletes: Iterable[str]) -> dict[str, int]:
    """Quota keys and values to set (bytes/s, > 0), and keys to delete; INVALID_REQUEST names what
    is wrong (Kafka's AlterClientQuotas error)."""
    unknown = sorted({*values, *deletes} - set(QUOTA_KEYS))
    if unknown:
        raise ReplogError(ErrorCode.INVALID_REQUEST,
                          f"unknown client quota keys {unknown} (known: {', '.join(QUOTA_KEYS)})")
    out = {}
    for key, raw in values.items():
        try:
            value = int(raw) if not isinstance(raw, bool) and float(raw) == int(float(raw)) else None
        except (TypeError, ValueError):
            value = None
        if value is None or value <= 0:
            raise ReplogError(ErrorCode.INVALID_REQUEST, f"{key} must be a whole number of bytes/s > 0, got {raw!r}")
        out[key] = value
    return out


def request_bytes(inbox: DataFrame, size: Column) -> DataFrame:
    """One row per produce request of `inbox` rows (inbox columns and `_deferred_since`): its
    client, its place in the inbox's order and its bytes (`size` per record)."""
    return (inbox.groupBy("request_id", "_commit_version", "user", "client_id", "_deferred_since")
            .agg(F.sum(size).alias("bytes")))


def admit_within_quota(requests: DataFrame, sensors: DataFrame) -> DataFrame:
    """Adds `admitted` to each request (request_id, _commit_version, user, client_id, bytes): the
    requests a round serves under its clients' quotas.

    sensors: user, client_id (as the requests carry them) -> sensor_user, sensor_client (the
    measurement they share), quota (bytes/s, null: no quota), window_bytes (recorded in the live
    windows), window_ms, throttled (the client waits for an earlier throttle).

    Kafka records a request, then throttles its client: so of a sensor's requests, in inbox order,
    the first is served unless the client is throttled, and each later one only while the bytes
    recorded before it (the window's and this round's earlier requests') keep the rate within the
    quota; the first request that takes it over is served, the ones after it wait."""
    order = Window.partitionBy("sensor_user", "sensor_client").orderBy("_commit_version", "request_id") \
        .rowsBetween(Window.unboundedPreceding, -1)
    before = F.coalesce(F.sum("bytes").over(order), F.lit(0))
    within = (F.col("window_bytes") + before) * 1000 <= F.col("quota") * F.col("window_ms")
    return (requests.join(F.broadcast(sensors), on=[
        requests["user"].eqNullSafe(sensors["user"]), requests["client_id"].eqNullSafe(sensors["client_id"])],
        how="left").drop(sensors["user"]).drop(sensors["client_id"])
        .withColumn("admitted", F.col("quota").isNull() | (~F.col("throttled") & ((before == 0) | within))))
