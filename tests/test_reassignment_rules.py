"""KIP-455 reassignment rules, each against an exact expected DataFrame: the grow step
(AlterPartitionReassignments), the completion once every adding replica is in the ISR, and a
bootstrapping replica that unclean election passes over."""

from chispa import assert_df_equality

from pipeline.control.controller import complete_reassignments, elect_leaders, start_reassignments

COLS = ("topic string, partition int, leader int, leader_epoch int, partition_epoch int, replicas array<int>, "
        "isr array<int>, adding_replicas array<int>, removing_replicas array<int>")
CHANGED = COLS + ", added array<int>, dropped array<int>, previous_leader int, election string"


def _frame(spark, rows, cols=COLS):
    return spark.createDataFrame(rows, cols)


def test_a_reassignment_grows_the_replicas_to_the_target_then_the_replicas_it_removes(spark):
    partitions = _frame(spark, [
        ("t", 0, 1, 3, 5, [1, 2], [1, 2], [], []),           # RF 2 -> 3: adds 3
        ("t", 1, 1, 0, 0, [1, 2, 3], [1, 2], [], []),        # move 3 -> 4 (3 out of the ISR)
        ("t", 2, 2, 0, 0, [2, 1], [2, 1], [], []),           # remove 1 only: nothing to add
        ("t", 3, 1, 0, 0, [1, 2], [1, 2], [], []),           # the same replicas: no change
        ("t", 4, 1, 0, 2, [3, 1, 2], [1, 2], [3], []),       # a new target replaces one adding 3 with 4
        ("t", 5, 1, 0, 0, [1, 2], [1], [], []),              # target [2, 3]: 1 leads until 3 is in
        ("t", 7, 3, 1, 1, [3, 1, 2], [3], [3], []),          # target [1, 2]: the adding 3 is the whole ISR
        ("t", 6, 1, 0, 0, [1, 2], [1, 2], [], []),           # not asked
    ])
    requests = spark.createDataFrame([
        ("t", 0, [1, 2, 3]), ("t", 1, [1, 2, 4]), ("t", 2, [2]), ("t", 3, [1, 2]), ("t", 4, [4, 1, 2]),
        ("t", 5, [2, 3]), ("t", 7, [1, 2]),
    ], "topic string, partition int, target array<int>")
    expected = _frame(spark, [
        ("t", 0, 1, 3, 6, [1, 2, 3], [1, 2], [3], [], [3], [], 1, None),
        ("t", 1, 1, 0, 1, [1, 2, 4, 3], [1, 2], [4], [3], [4], [], 1, None),
        ("t", 2, 2, 0, 1, [2, 1], [2, 1], [], [1], [], [], 2, None),
        ("t", 4, 1, 0, 3, [4, 1, 2], [1, 2], [4], [], [4], [3], 1, None),
        ("t", 5, 1, 0, 1, [2, 3, 1], [1], [3], [1], [3], [], 1, None),
    ], CHANGED)
    assert_df_equality(start_reassignments(partitions, requests, live_brokers=[1, 2, 3, 4]), expected,
                       ignore_row_order=True, ignore_nullable=True)


def test_a_reassignment_completes_once_every_adding_replica_is_in_the_isr(spark):
    partitions = _frame(spark, [
        ("t", 0, 1, 3, 6, [1, 2, 3], [1, 2, 3], [3], []),        # RF 3 reached: epochs + 1
        ("t", 1, 3, 0, 1, [1, 2, 4, 3], [1, 2, 3, 4], [4], [3]),  # the leader is removed: 1 leads
        ("t", 2, 2, 0, 1, [2, 1], [2, 1], [], [1]),              # removal only
        ("t", 3, 1, 0, 1, [1, 2, 4, 3], [1, 2, 3], [4], [3]),    # 4 still catching up
        ("t", 4, -1, 2, 3, [1, 2, 4, 3], [3, 4], [4], [3]),      # offline: waits for a leader
        ("t", 5, 3, 0, 1, [1, 2, 3], [3, 2], [], [3]),           # the only live successor is 2
        ("t", 6, 1, 0, 0, [1, 2], [1, 2], [], []),               # no reassignment
    ])
    expected = _frame(spark, [
        ("t", 0, 1, 4, 7, [1, 2, 3], [1, 2, 3], [], [], [], [], 1, None),
        ("t", 1, 1, 1, 2, [1, 2, 4], [1, 2, 4], [], [], [], [3], 3, "reassignment"),
        ("t", 2, 2, 1, 2, [2], [2], [], [], [], [1], 2, None),
        ("t", 5, 2, 1, 2, [1, 2], [2], [], [], [], [3], 3, "reassignment"),
    ], CHANGED)
    assert_df_equality(complete_reassignments(partitions, live_brokers=[2, 3, 4, 1]), expected,
                       ignore_row_order=True, ignore_nullable=True)
    # with broker 1 down, partition 1's leader (3, being removed) has no live successor but 2
    only_2 = complete_reassignments(partitions.filter("partition = 1"), live_brokers=[2, 3, 4])
    assert [(r["leader"], r["replicas"]) for r in only_2.collect()] == [(2, [1, 2, 4])]


def test_unclean_election_passes_over_a_replica_that_is_being_added(spark):
    partitions = spark.createDataFrame([
        ("t", 0, 1, 0, 0, [3, 2, 1], [1], [3], [], True),
        ("t", 1, 1, 0, 0, [3, 1], [1], [3], [], True),
    ], COLS + ", unclean boolean")
    elected = {r["partition"]: (r["leader"], r["election"], r["isr"])
               for r in elect_leaders(partitions, live_brokers=[2, 3]).collect()}
    # partition 0: 2 (not the bootstrapping 3); partition 1: offline, the ISR keeps its last member
    assert elected == {0: (2, "unclean", [2]), 1: (-1, "offline", [1])}


def test_kafkas_reassignment_json_is_read_and_what_is_not_that_is_refused():
    from pipeline.cli import reassignment_json
    from pipeline.errors import ReplogError
    import pytest
    text = ('{"version": 1, "partitions": [{"topic": "a", "partition": 0, "replicas": [1, 2], "log_dirs": ["any", "any"]},'
            ' {"topic": "b", "partition": 3, "replicas": [0]}]}')
    assert reassignment_json(text) == {("a", 0): [1, 2], ("b", 3): [0]}
    for bad, words in [("nope", "not JSON"), ('{"version": 2, "partitions": []}', "version 2"),
                       ('{"partitions": [{"topic": "a", "partition": 0}]}', "needs topic, partition and replicas"),
                       ('{"partitions": {}}', "expected"),
                       ('{"partitions": [{"topic": "a", "partition": 0, "replicas": [1]},'
                        ' {"topic": "a", "partition": 0, "replicas": [2]}]}', "listed twice")]:
        with pytest.raises(ReplogError) as error:
            reassignment_json(bad)
        assert error.value.code == "INVALID_REPLICA_ASSIGNMENT" and words in str(error.value)
