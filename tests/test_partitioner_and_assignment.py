"""Kafka's default partitioner and replica assignment, against the numbers in Kafka's own tests."""

import pytest

from pipeline.control.assignment import assign_replicas
from pipeline.data.partitioner import murmur2, partition_for_key

# Kafka clients UtilsTest.testMurmur2
MURMUR2_CASES = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize("data,expected", MURMUR2_CASES)
def test_murmur2_matches_kafka(data, expected):
    assert murmur2(data) == expected


def test_partition_for_key_is_positive_murmur2_modulo():
    # -973932308 & 0x7fffffff = 1173551340; % 7 = 1173551340 - 7*167650191 = 3
    assert partition_for_key(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7 == 3
    assert all(0 <= partition_for_key(d, 5) < 5 for d, _ in MURMUR2_CASES)


def test_replica_assignment_matches_kafka_fixed_start_index():
    # AdminUtils' rack-unaware assignment, 5 brokers, 10 partitions, RF 3, start index 0
    expected = [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 0], [4, 0, 1],
                [0, 2, 3], [1, 3, 4], [2, 4, 0], [3, 0, 1], [4, 1, 2]]
    assert assign_replicas([0, 1, 2, 3, 4], 10, 3, start_index=0) == expected


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 8, 30])
def test_leaders_are_balanced_and_replicas_distinct(partitions):
    assignment = assign_replicas([0, 1, 2], partitions, 3)
    leaders = [r[0] for r in assignment]
    counts = [leaders.count(b) for b in (0, 1, 2)]
    assert max(counts) - min(counts) <= 1
    assert all(len(set(r)) == 3 for r in assignment)
