"""jobs/compare_settings.py's own parts: a setting holds for one cluster's rounds only, and the
session gets back what it had."""

import argparse

import pytest

from jobs.compare_settings import _setting, _switch

ABSENT = "spark.sql.replog.test.absent"
PRESENT = "spark.sql.crossJoin.enabled"


def test_the_settings_hold_while_switched_on_and_the_session_gets_its_own_values_back(spark):
    spark.conf.unset(ABSENT)
    spark.conf.set(PRESENT, "true")
    try:
        use = _switch(spark, {ABSENT: "7", PRESENT: "false"})
        use(True)
        assert (spark.conf.get(ABSENT), spark.conf.get(PRESENT)) == ("7", "false")
        use(False)
        assert (spark.conf.get(ABSENT, None), spark.conf.get(PRESENT)) == (None, "true")
    finally:
        spark.conf.unset(ABSENT)


def test_a_setting_is_key_equals_value():
    assert _setting(" spark.sql.shuffle.partitions = 2 ") == ("spark.sql.shuffle.partitions", "2")
    assert _setting("k=a=b") == ("k", "a=b")
    for bad in ("spark.sql.shuffle.partitions", "=2"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected KEY=VALUE"):
            _setting(bad)
