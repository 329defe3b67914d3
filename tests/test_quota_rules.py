"""Client quota rules (pipeline/control/quotas.py): Kafka's precedence of quota entities, its windowed rate
and throttle time, and which produce requests a round serves under a quota."""

import pytest
from chispa import assert_df_equality

from pipeline.control import quotas
from pipeline.errors import ReplogError
from pipeline.control.quotas import DEFAULT, WindowedRate


def test_the_most_specific_entity_wins_in_kafkas_order():
    entries = {
        ("alice", "app"): {"producer_byte_rate": 1},
        ("alice", DEFAULT): {"producer_byte_rate": 2},
        ("alice", None): {"producer_byte_rate": 3},
        (DEFAULT, "app"): {"producer_byte_rate": 4},
        (DEFAULT, DEFAULT): {"producer_byte_rate": 5},
        (DEFAULT, None): {"producer_byte_rate": 6},
        (None, "app"): {"producer_byte_rate": 7},
        (None, DEFAULT): {"producer_byte_rate": 8},
    }
    order = list(entries)
    # sensor keys: (user, client-id) where the entity names both, (user, "") for user-only
    # entities, ("", client-id) for client-only ones
    sensors = [("alice", "app"), ("alice", "app"), ("alice", ""), ("alice", "app"), ("alice", "app"),
               ("alice", ""), ("", "app"), ("", "app")]
    for level, (entity, sensor) in enumerate(zip(order, sensors)):
        remaining = {e: entries[e] for e in order[level:]}
        assert quotas.quota_for(remaining, "producer_byte_rate", "alice", "app") == (sensor, level + 1), entity
    assert quotas.quota_for({}, "producer_byte_rate", "alice", "app") is None
    # another key is not this one; no user is Kafka's ANONYMOUS principal, no client id the empty one
    assert quotas.quota_for(entries, "consumer_byte_rate", "alice", "app") is None
    assert quotas.quota_for({(DEFAULT, None): {"consumer_byte_rate": 9}}, "consumer_byte_rate", None, None) == \
        (("ANONYMOUS", ""), 9)
    assert quotas.quota_for({("bob", None): {"producer_byte_rate": 9}, (None, DEFAULT): {"producer_byte_rate": 10}},
                            "producer_byte_rate", "alice", None) == (("", ""), 10)


def test_the_windowed_rate_pads_to_samples_minus_one_windows_and_throttles_as_kafka():
    rate = WindowedRate(samples=2, window_ms=1000)
    assert rate.window_size_ms(0) == 1000 and rate.rate(0) == 0.0
    rate.record(2000, now_ms=0)
    # 2000 bytes over a padded 1 s window: 2000 B/s; at a 1000 B/s quota, (2000-1000)/1000 x 1000 ms
    assert (rate.rate(0), rate.throttle_ms(1000, 0)) == (2000.0, 1000)
    assert rate.throttle_ms(2000, 0) == 0  # at the quota: acceptable
    rate.record(1000, now_ms=1000)  # a second sample; the window is now 1 s since the oldest
    assert (rate.total(1000), rate.window_size_ms(1000), rate.throttle_ms(1000, 1000)) == (3000, 1000, 2000)
    rate.record(500, now_ms=2500)  # the 0 ms sample is reused; the 1000 ms one is still live
    assert (rate.total(2500), rate.window_size_ms(2500)) == (1500, 1500)
    assert rate.total(5000) == 0  # both older than samples x window: obsolete
    thirty = WindowedRate(samples=30, window_ms=1000)
    thirty.record(29_000, now_ms=0)  # a new client may burst the quota times 29 s
    assert thirty.throttle_ms(1000, 0) == 0 and WindowedRate(30, 1000).window_size_ms(0) == 29_000


def test_a_sensor_throttles_its_clients_until_the_rate_is_back():
    sensors = quotas.Sensors(samples=2, window_ms=1000)
    key = ("", "loader")
    assert sensors.record(key, 1000, 1000, now_ms=0) == 0 and sensors.state(key, 0) == (1000, 1000, False)
    assert sensors.record(key, 1000, 1000, now_ms=0) == 1000
    assert sensors.state(key, 999)[2] and not sensors.state(key, 1000)[2]
    assert (sensors.remaining_ms(key, 400), sensors.remaining_ms(("", "other"), 400)) == (600, 0)
    sensors.reconfigure(3, 1000)  # new windows start the measurement over
    assert sensors.state(key, 0) == (0, 2000, False)


def test_admit_within_quota_serves_in_order_until_the_rate_goes_over(spark):
    requests = spark.createDataFrame([
        # a client at 1000 B/s with 500 bytes in a 1 s window: 1 and 2 fit, 3 takes it over, 4 waits
        ("r1", 1, None, "loader", 300), ("r2", 2, None, "loader", 200), ("r3", 3, None, "loader", 600),
        ("r4", 4, None, "loader", 10),
        # a throttled client waits; a client without a quota is always served
        ("t1", 1, "bob", "app", 1), ("f1", 1, None, "free", 10_000_000),
        # the first request of a fresh client is served however large
        ("b1", 5, None, "big", 5000), ("b2", 6, None, "big", 1),
    ], "request_id string, _commit_version long, user string, client_id string, bytes long")
    sensors = spark.createDataFrame([
        (None, "loader", "", "loader", 1000, 500, 1000, False),
        ("bob", "app", "bob", "app", 1000, 0, 1000, True),
        (None, "free", None, None, None, 0, 1, False),
        (None, "big", "", "big", 1000, 0, 1000, False),
    ], "user string, client_id string, sensor_user string, sensor_client string, quota long, window_bytes long, "
       "window_ms long, throttled boolean")
    got = quotas.admit_within_quota(requests, sensors).select("request_id", "admitted")
    expected = spark.createDataFrame([("r1", True), ("r2", True), ("r3", True), ("r4", False), ("t1", False),
                                      ("f1", True), ("b1", True), ("b2", False)], "request_id string, admitted boolean")
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


@pytest.mark.parametrize("entity, words", [
    ({}, "entity"), ({"group": "g"}, "entity"), ("alice", "entity"), ({"user": ""}, "user"),
    ({"client-id": "<default>"}, "client-id"), ({"user": 5}, "user"),
])
def test_a_bad_entity_is_invalid_request(entity, words):
    with pytest.raises(ReplogError) as e:
        quotas.check_entity(entity)
    assert e.value.code == "INVALID_REQUEST" and words in str(e.value)


def test_quota_values_must_be_known_keys_and_positive_rates():
    assert quotas.check_quota_values({"producer_byte_rate": "1024", "consumer_byte_rate": 2048.0}, []) == \
        {"producer_byte_rate": 1024, "consumer_byte_rate": 2048}
    for values, deletes, words in [({"request_percentage": 5}, [], "unknown"), ({}, ["nope"], "unknown"),
                                   ({"producer_byte_rate": 0}, [], "> 0"), ({"producer_byte_rate": "x"}, [], "> 0"),
                                   ({"consumer_byte_rate": 1.5}, [], "whole"), ({"producer_byte_rate": True}, [], "> 0")]:
        with pytest.raises(ReplogError) as e:
            quotas.check_quota_values(values, deletes)
        assert e.value.code == "INVALID_REQUEST" and words in str(e.value), values
