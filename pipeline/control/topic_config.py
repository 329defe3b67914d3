"""A topic's effective setting: its override in the topics table's `config` (a JSON object of
strings and numbers), else the cluster's value (Kafka's topic config falling back to the broker
default). One Spark SQL expression, used by the round's partition metadata (round/reads.py) and
the `replog.partitions` view (storage/views.py) alike."""

from __future__ import annotations

from typing import Any

__all__ = ["effective_setting_sql"]


def _literal(value: Any) -> str:
    text = str(value).lower()  # (a boolean as Spark casts it; every other value is a number or lower case)
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def effective_setting_sql(key: str, cluster_value: Any, config_column: str = "config") -> str:
    """The effective value of `key` as a string expression (cast it where it is used): the
    topic's override in `config_column`, else `cluster_value`, lower case."""
    return f"coalesce(from_json({config_column}, 'map<string,string>')[{_literal(key)}], {_literal(cluster_value)})"
