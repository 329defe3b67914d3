"""Configuration with Kafka's key names and defaults, validated before anything is written."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from pipeline.errors import ErrorCode, ReplogError

__all__ = ["ConfigKey", "CLUSTER_KEYS", "TOPIC_KEYS", "validate_cluster_config", "validate_topic_config",
           "effective_topic_config", "to_json", "with_defaults", "compacted", "deletes", "read_properties"]


@dataclass(frozen=True)
class ConfigKey:
    name: str
    kind: type
    default: Any
    check: Callable[[Any], bool]
    rule: str
    doc: str


FETCH_MODES = ("incremental", "full")
LONG_MAX = 9223372036854775807  # Kafka's Long.MaxValue default of max.compaction.lag.ms


def _positive(v: Any) -> bool:
    return v > 0


def _non_negative(v: Any) -> bool:
    return v >= 0


def _any(_v: Any) -> bool:
    return True


def _retention(v: Any) -> bool:
    return v == -1 or v >= 0


def _policy(v: str) -> bool:
    parts = [p.strip() for p in v.split(",")]
    return bool(parts) and all(p in ("delete", "compact") for p in parts) and len(set(parts)) == len(parts)


def _throttled_replicas(v: str) -> bool:
    """Kafka's throttled-replica list: empty, `*`, or partition:broker entries separated by commas."""
    v = v.strip()
    if v in ("", "*"):
        return True
    for entry in v.split(","):
        partition, sep, broker = entry.strip().partition(":")
        if not sep or not partition.isdigit() or not broker.isdigit():
            return False
    return True


def throttled_entries(v: str) -> str:
    """A throttled-replica list as stored: `*`, or sorted `partition:broker` entries."""
    v = v.strip()
    if v in ("", "*"):
        return v
    return ",".join(sorted({f"{int(p)}:{int(b)}" for p, b in (e.strip().split(":") for e in v.split(","))}))


def _ratio(v: float) -> bool:
    return 0.0 <= v <= 1.0


def compacted(policy: str) -> bool:
    """cleanup.policy `compact` or `compact,delete`: the log cleaner compacts the topic."""
    return "compact" in [p.strip() for p in policy.split(",")]


def deletes(policy: str) -> bool:
    """cleanup.policy `delete` or `compact,delete`: retention.ms / retention.bytes apply."""
    return "delete" in [p.strip() for p in policy.split(",")]


_KEYS = [
    # name, type, Kafka's default, check, rule text, doc
    ConfigKey("replica.lag.time.max.ms", int, 30000, _positive, "> 0",
              "a follower not caught up for longer than this leaves the ISR"),
    ConfigKey("min.insync.replicas", int, 1, _positive, ">= 1",
              "acks=all needs at least this many in-sync replicas"),
    ConfigKey("unclean.leader.election.enable", bool, False, _any, "true|false",
              "may an out-of-sync replica become leader"),
    ConfigKey("replica.fetch.max.bytes", int, 1048576, _positive, "> 0",
              "bytes per partition in one fetch response (at least one record)"),
    ConfigKey("replica.fetch.response.max.bytes", int, 10485760, _positive, "> 0",
              "bytes in one fetch response (at least one record)"),
    ConfigKey("replica.fetch.wait.max.ms", int, 500, _positive, "> 0",
              "the streaming job's trigger interval"),
    ConfigKey("num.replica.fetchers", int, 1, _positive, "> 0",
              "parallelism of a round's fetch stage"),
    ConfigKey("message.max.bytes", int, 1048588, _positive, "> 0", "largest record accepted"),
    ConfigKey("broker.session.timeout.ms", int, 9000, _positive, "> 0",
              "a broker without heartbeat for this long is fenced"),
    ConfigKey("broker.heartbeat.interval.ms", int, 2000, _positive, "> 0", "heartbeat period"),
    ConfigKey("retention.ms", int, 604800000, _retention, "-1 or >= 0", "time retention of log records"),
    ConfigKey("retention.bytes", int, -1, _retention, "-1 or >= 0", "size retention per partition"),
    ConfigKey("log.retention.check.interval.ms", int, 300000, _positive, "> 0",
              "how often a round applies retention.ms / retention.bytes"),
    ConfigKey("cleanup.policy", str, "delete", _policy, "delete|compact|compact,delete",
              "delete: retention removes old records; compact: the log cleaner keeps the last value per key"),
    ConfigKey("min.compaction.lag.ms", int, 0, _non_negative, ">= 0",
              "a record stays uncompacted for at least this long"),
    ConfigKey("max.compaction.lag.ms", int, LONG_MAX, _positive, "> 0",
              "a record is compacted at the latest this long after it is written, whatever the dirty ratio"),
    ConfigKey("min.cleanable.dirty.ratio", float, 0.5, _ratio, "in [0, 1]",
              "the cleaner compacts a log when its dirty bytes exceed this share of its bytes"),
    ConfigKey("delete.retention.ms", int, 86400000, _non_negative, ">= 0",
              "a tombstone stays at least this long after the cleaner first compacted past it"),
    ConfigKey("log.cleaner.enable", bool, True, _any, "true|false", "the replication job runs the log cleaner"),
    ConfigKey("log.cleaner.backoff.ms", int, 15000, _positive, "> 0",
              "the replication job runs a cleaner pass at most this often (cluster clock)"),
    # Delta table maintenance by the replication job (pipeline/storage/maintenance.py; not Kafka keys)
    ConfigKey("log.maintenance.interval.ms", int, 3600000, _positive, "> 0",
              "the replication job compacts small files and vacuums at most this often (cluster clock)"),
    ConfigKey("log.maintenance.min.files", int, 64, _positive, "> 0",
              "a table or log is compacted (OPTIMIZE) once its snapshot holds this many files"),
    # at least an hour: recovery RESTOREs the versions before an interrupted round, and Delta
    # refuses time travel beyond a table's file retention
    ConfigKey("log.maintenance.file.retention.ms", int, 604800000, lambda v: v >= 3600000, ">= 3600000 (1 hour)",
              "VACUUM deletes files no snapshot of this age needs (Delta's default: 7 days); an interrupted "
              "round can be recovered for this long"),
    ConfigKey("log.maintenance.log.retention.ms", int, 604800000, _positive, ">= log.maintenance.file.retention.ms",
              "Delta log history kept by the tables rounds write (inbox and admin keep Delta's 30 days)"),
    ConfigKey("max.incremental.fetch.session.cache.slots", int, 1000, _non_negative, ">= 0",
              "fetch sessions each leader broker keeps (KIP-227)"),
    ConfigKey("replication.fetch.mode", str, "incremental", lambda v: v in FETCH_MODES, "incremental|full",
              "incremental: KIP-227 fetch sessions; full: every partition in every fetch (for comparison)"),
    # KIP-73 replication quotas: bytes per second each broker sends (leader) or receives (follower)
    # for throttled replicas outside the ISR, by the cluster clock (Kafka's default: unlimited)
    ConfigKey("leader.replication.throttled.rate", int, LONG_MAX, _positive, "> 0",
              "bytes/s a leader broker sends to throttled replicas outside the ISR"),
    ConfigKey("follower.replication.throttled.rate", int, LONG_MAX, _positive, "> 0",
              "bytes/s a follower broker fetches for its throttled replicas outside the ISR"),
    ConfigKey("leader.replication.throttled.replicas", str, "", _throttled_replicas, "'' | * | partition:broker,...",
              "replicas (partition:leader broker) whose leader-side replication is throttled"),
    ConfigKey("follower.replication.throttled.replicas", str, "", _throttled_replicas,
              "'' | * | partition:broker,...", "replicas (partition:follower broker) whose fetches are throttled"),
    # client quotas (Kafka's design 4.9; pipeline/control/quotas.py): the windows rates are measured over.
    # Kafka's broker default for quota.window.num is 11; its design text, and this project, use 30
    ConfigKey("quota.window.num", int, 30, _positive, "> 0",
              "samples a client quota's rate is measured over"),
    ConfigKey("quota.window.size.seconds", int, 1, _positive, "> 0", "the length of one such sample"),
]
CLUSTER_KEYS: dict[str, ConfigKey] = {k.name: k for k in _KEYS}
_TOPIC_NAMES = ["replica.lag.time.max.ms", "min.insync.replicas", "unclean.leader.election.enable",
                "retention.ms", "retention.bytes", "message.max.bytes", "cleanup.policy", "min.compaction.lag.ms",
                "max.compaction.lag.ms", "min.cleanable.dirty.ratio", "delete.retention.ms",
                "leader.replication.throttled.replicas", "follower.replication.throttled.replicas"]
TOPIC_KEYS: dict[str, ConfigKey] = {name: CLUSTER_KEYS[name] for name in _TOPIC_NAMES}


def _parse(key: ConfigKey, raw: Any) -> Any:
    bad = ReplogError(ErrorCode.INVALID_CONFIG,
                      f"'{key.name}' must be {key.kind.__name__} {key.rule}, got {raw!r}")
    if key.kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        raise bad
    if key.kind is str:
        value = raw.strip() if isinstance(raw, str) else raw
        if not isinstance(value, str) or not key.check(value):
            raise bad
        if key.name == "cleanup.policy":
            return ",".join(sorted(p.strip() for p in value.split(",")))
        return throttled_entries(value) if key.name.endswith(".throttled.replicas") else value
    if isinstance(raw, bool):
        raise bad
    if key.kind is float:
        try:
            value = float(raw.strip()) if isinstance(raw, str) else float(raw) if isinstance(raw, (int, float)) else None
        except ValueError:
            value = None
        if value is None or value != value or not key.check(value):
            raise bad
        return value
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        value = int(raw.strip())
    else:
        raise bad
    if not key.check(value):
        raise bad
    return value


def _validate(config: Mapping[str, Any] | None, keys: Mapping[str, ConfigKey], scope: str) -> dict[str, Any]:
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise ReplogError(ErrorCode.INVALID_CONFIG, f"{scope} config must be a dict, got {type(config).__name__}")
    out = {}
    for name, raw in config.items():
        if name not in keys:
            raise ReplogError(ErrorCode.INVALID_CONFIG, f"unknown {scope} config key '{name}'")
        out[name] = _parse(keys[name], raw)
    return out


def validate_cluster_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every key known and well typed; returns the full config with Kafka's defaults filled in."""
    given = _validate(config, CLUSTER_KEYS, "cluster")
    full = {name: given.get(name, key.default) for name, key in CLUSTER_KEYS.items()}
    log_ms, file_ms = full["log.maintenance.log.retention.ms"], full["log.maintenance.file.retention.ms"]
    if log_ms < file_ms:  # Delta refuses a table whose log would go before its files
        raise ReplogError(ErrorCode.INVALID_CONFIG,
                          f"'log.maintenance.log.retention.ms' ({log_ms}) must be at least "
                          f"'log.maintenance.file.retention.ms' ({file_ms}): Delta keeps a table's log as long as "
                          "its files")
    return full


def validate_topic_config(config: Mapping[str, Any] | None, replication_factor: int) -> dict[str, Any]:
    """A topic's overrides, validated; min.insync.replicas may not exceed the replication factor."""
    given = _validate(config, TOPIC_KEYS, "topic")
    min_isr = given.get("min.insync.replicas")
    if min_isr is not None and min_isr > replication_factor:
        raise ReplogError(ErrorCode.INVALID_CONFIG,
                          f"'min.insync.replicas' ({min_isr}) exceeds the replication factor ({replication_factor})")
    return given


def with_defaults(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A cluster config stored by an older release, with Kafka's defaults for keys added since and
    without the keys removed since (`replication.round`: one round remains)."""
    return {**{name: key.default for name, key in CLUSTER_KEYS.items()},
            **{name: value for name, value in stored.items() if name in CLUSTER_KEYS}}


def effective_topic_config(cluster_config: Mapping[str, Any], topic_overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The topic's view: its overrides over the cluster's values."""
    return {name: topic_overrides.get(name, cluster_config[name]) for name in TOPIC_KEYS}


def to_json(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(sorted(config.items())))


def read_properties(path: str) -> dict[str, str]:
    """`key=value` lines; `#` and `!` start comments (Java properties, as Kafka's files are)."""
    values: dict[str, str] = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line[0] in "#!":
                continue
            sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
            if sep <= 0:
                raise ValueError(f"{path}:{number}: expected key=value, got {line!r}")
            values[line[:sep].strip()] = line[sep + 1:].strip()
    return values
