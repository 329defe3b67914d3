"""A round carries its pinned state to the next round of the same process (round.Carry: the
partition state after the round) instead of re-reading the tables it has just written; a commit by
anyone else to those tables makes the next round read them again. A produced DataFrame gets Spark
settings of its own for its duration."""

import pytest
from pyspark.sql import functions as F

from pipeline import Cluster
from pipeline.round import run as round_run
from pipeline.round import table_versions


def committed(cluster, topic):
    return {r["partition"]: r["high_watermark"] for r in cluster.describe(topic).collect()}


# a follower of a partition the round left unchanged (at its leader's LEO) is not written: its
# fetch times are its broker's last fetch, which a round works out again (replica.effective_fetch_state)
_RECOMPUTED = ("round_id", "last_fetch_time_ms", "last_caught_up_time_ms")


def carried_rows(cluster):
    """The replica_state rows of the partition state the cluster carries, without _RECOMPUTED."""
    state = cluster.core.carry.state.withColumn("round_id", F.lit(0).cast("long"))
    return sorted(round_run._replica_state_rows(state).drop(*_RECOMPUTED).collect())


def current_rows(storage):
    return sorted(storage.replica_state().drop(*_RECOMPUTED).collect())


def test_a_carried_round_sees_what_another_writer_committed_in_between(new_cluster, spark, clock):
    cluster = new_cluster(brokers=2)
    cluster.create_topic("t", partitions=1, replication_factor=2)
    cluster.produce("t", [{"value": "a"}], acks="all")
    clock.advance(500)
    cluster.run_round()
    carry = cluster.core.carry
    assert carry is not None and carry.versions == table_versions(cluster.storage)

    other = Cluster.open(spark, cluster.storage.root, clock=clock)  # another process, same root
    other.create_topic("u", partitions=2, replication_factor=2)
    other.produce("u", [{"value": "b", "partition": 1}], acks="all")
    assert table_versions(cluster.storage) != carry.versions

    for _ in range(2):
        clock.advance(500)
        cluster.run_round()
    assert committed(cluster, "t") == {0: 1}
    assert committed(cluster, "u") == {0: 0, 1: 1}
    assert [bytes(r["value"]) for r in cluster.read("u").collect()] == [b"b"]
    # the state it carries now is the tables' state, row for row
    assert carried_rows(cluster) == current_rows(cluster.storage)


def test_a_round_works_on_the_partitions_that_changed_and_replica_state_is_compacted(new_cluster, clock,
                                                                                    monkeypatch):
    """Eight partitions, one produced to: the rounds after it carry only that partition's replicas
    (a working set), the partition counts stay those of every partition, and replica_state, which
    rounds append to, is rewritten as its current rows once the superseded ones are as many."""
    monkeypatch.setattr(round_run, "STATE_COMPACTION_MIN_ROWS", 0)
    monkeypatch.setattr(round_run, "STATE_COMPACTION_RATIO", 1)
    cluster = new_cluster(brokers=3)
    cluster.create_topic("t", partitions=8, replication_factor=3, config={"min.insync.replicas": "3"})
    clock.advance(500)
    first = cluster.run_round()  # no carry yet: every partition, full fetches open the sessions
    assert (first.fetch_request_partitions, first.at_min_isr_partitions) == (16, 8)
    storage = cluster.storage
    read_back = _reads_of_replica_state(monkeypatch, storage)
    reports, table_rows = [], [storage.read("replica_state").count()]
    for i in range(4):
        if i < 2:
            cluster.produce("t", [{"value": f"v{i}", "partition": 3}], acks="all")
        clock.advance(500)
        reports.append(cluster.run_round())
        table_rows.append(storage.read("replica_state").count())
    # the appended record, fetched by both followers, whose follow-up fetches prove it and get the
    # HW (2 + 2 partitions in the responses): settled in the round; then nothing
    assert [(r.records_appended, r.records_replicated, r.fetch_response_partitions, r.active_partitions)
            for r in reports] == [(1, 2, 4, 0), (1, 2, 4, 0), (0, 0, 0, 0), (0, 0, 0, 0)]
    assert all(r.at_min_isr_partitions == 8 and r.under_replicated_partitions == 0 for r in reports)
    assert committed(cluster, "t") == {p: (2 if p == 3 else 0) for p in range(8)}
    # 24 current rows. The first round rewrote all 24 (every replica's fetch state and session):
    # 24 superseded rows, as many as the current ones, so it compacted the table to the 24. Then
    # partition 3's three replicas per active round, and nothing in the idle ones.
    assert table_rows == [24, 27, 30, 30, 30]
    history = storage.spark.sql(f"DESCRIBE HISTORY delta.`{storage.path('replica_state')}`").collect()
    assert any("step=compact" in (h["userMetadata"] or "") for h in history)
    assert read_back == []  # it wrote the rows it carries: it did not read the table it had just written
    current = storage.replica_state()
    assert current.count() == 24 and cluster.core.carry is not None
    assert carried_rows(cluster) == current_rows(storage)


def _kept_and_replicating(cluster, clock):
    """replica_state holds the 9 rows of topics t (2 partitions) and u (1), RF 3, after a
    compaction, and the new topic u replicates."""
    table = cluster.storage.read("replica_state")
    assert table.count() == 9 and table.filter(F.col("topic") == "u").count() == 3
    cluster.produce("u", [{"value": "x"}], acks="all")
    for _ in range(2):
        clock.advance(500)
        cluster.run_round()
    assert committed(cluster, "u") == {0: 1}


def _reads_of_replica_state(monkeypatch, storage) -> list[int]:
    """The versions of replica_state that compact_replica_state reads back (a list that grows)."""
    read, versions = storage.read_version, []

    def reading(path, at):
        if path == storage.path("replica_state"):
            versions.append(at)
        return read(path, at)

    monkeypatch.setattr(storage, "read_version", reading)
    return versions


def test_a_round_compacts_from_the_table_when_another_writer_committed_during_it(new_cluster, spark, clock,
                                                                                  monkeypatch):
    """A round's carried rows are the table's current rows only when nobody else wrote it. Another
    process creates a topic while a round runs (after the round read replica_state, before its
    compaction): the compaction reads the table again instead, so the new topic's replicas stay, and
    the next round reads the tables again too."""
    monkeypatch.setattr(round_run, "STATE_COMPACTION_MIN_ROWS", 0)
    monkeypatch.setattr(round_run, "STATE_COMPACTION_RATIO", 1)
    cluster = new_cluster(brokers=3)
    cluster.create_topic("t", partitions=2, replication_factor=3)
    storage, other = cluster.storage, Cluster.open(spark, cluster.storage.root, clock=clock)
    read_back = _reads_of_replica_state(monkeypatch, storage)
    commit_round_row = storage.commit_round_row

    def committing(row, outputs, round_id):  # the round's last wave, then another writer before its compaction
        commit_round_row(row, outputs, round_id)
        other.create_topic("u", partitions=1, replication_factor=3)

    with monkeypatch.context() as patched:
        patched.setattr(storage, "commit_round_row", committing)
        clock.advance(500)
        cluster.run_round()  # the first round rewrites every replica's row: its compaction is due
    # (it read the table again, and the carry it left is of older versions: the next round reads the tables)
    assert len(read_back) == 1 and cluster.core.carry.versions != table_versions(storage)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{storage.path('replica_state')}`").collect()
    assert "step=compact" in (history[0]["userMetadata"] or "")
    _kept_and_replicating(cluster, clock)


def test_rounds_that_move_replicas_compact_from_what_they_carry(new_cluster, clock, monkeypatch):
    """A reassignment's rounds add replicas' rows and delete the dropped ones' (commits of the round
    itself): the rows they carry stay the table's current rows, and their compactions write them."""
    monkeypatch.setattr(round_run, "STATE_COMPACTION_MIN_ROWS", 0)
    monkeypatch.setattr(round_run, "STATE_COMPACTION_RATIO", 1)
    cluster = new_cluster(brokers=3)
    cluster.add_broker()
    cluster.create_topic("t", partitions=2, replication_factor=2)
    storage = cluster.storage
    read_back = _reads_of_replica_state(monkeypatch, storage)
    old = cluster.describe("t").filter(F.col("partition") == 0).first()["replicas"]
    cluster.produce("t", [{"value": f"v{i}", "partition": 0} for i in range(3)], acks="all")
    for _ in range(2):
        clock.advance(500)
        cluster.run_round()
    compactions = lambda: sum("step=compact" in (h["userMetadata"] or "") for h in storage.spark.sql(  # noqa: E731
        f"DESCRIBE HISTORY delta.`{storage.path('replica_state')}`").collect())
    before = compactions()
    cluster.reassign_partitions({("t", 0): [b for b in range(4) if b not in old]})
    for _ in range(8):
        clock.advance(500)
        cluster.run_round()
        current = storage.replica_state().drop("round_id")
        assert cluster.core.carry is not None
        assert carried_rows(cluster) == current_rows(storage)
    assert cluster.reassignments().count() == 0 and current.count() == 4
    assert sorted(r["broker"] for r in current.filter("partition = 0").collect()) == [b for b in range(4) if b not in old]
    assert compactions() > before and read_back == []
    assert sorted(r["value"] for r in cluster.read("t", partition=0).collect()) == [b"v0", b"v1", b"v2"]


def _another_writer_in_compaction(monkeypatch, storage, other, after_overwrite=False):
    """Another process creates a topic (its replica_state rows) after compact_replica_state has
    read the table's rows and before its overwrite begins; with `after_overwrite`, it creates one
    more right after the overwrite's commit."""
    read, version, topics = storage.read_version, storage.table_version, iter(["u", "w"])

    def reading(path, at):
        rows = read(path, at)
        other.create_topic(next(topics), partitions=1, replication_factor=3)
        return rows

    calls = {"n": 0}

    def versions(path):
        calls["n"] += 1
        if after_overwrite and calls["n"] == 2:
            other.create_topic(next(topics), partitions=1, replication_factor=3)
        return version(path)

    monkeypatch.setattr(storage, "read_version", reading)
    monkeypatch.setattr(storage, "table_version", versions)


def test_a_compaction_that_replaced_another_writers_rows_gives_them_back(new_cluster, spark, clock, monkeypatch):
    """Delta checks an overwrite against the commits after its transaction began, not against one
    that landed between reading the rows and writing them: that commit's rows (a new topic's
    replicas) would be replaced with the rest. The compaction finds it from the version its
    commit replaced, restores the table to that version, and reports that it did not compact."""
    cluster = new_cluster(brokers=3)
    cluster.create_topic("t", partitions=2, replication_factor=3)
    clock.advance(500)
    cluster.run_round()
    storage, other = cluster.storage, Cluster.open(spark, cluster.storage.root, clock=clock)
    with monkeypatch.context() as patched:
        _another_writer_in_compaction(patched, storage, other)
        assert storage.compact_replica_state(round_id=50) is False
    current = storage.replica_state()
    assert current.filter(F.col("topic") == "u").count() == 3 and current.count() == 9
    last = storage.commit_info(storage.path("replica_state"), storage.version("replica_state"))
    assert "step=compact-undone" in last["userMetadata"]
    # nobody writing in between: compact, every topic's rows kept
    assert storage.compact_replica_state(round_id=51) is True
    _kept_and_replicating(cluster, clock)


def test_carried_rows_that_another_writer_overtakes_before_the_overwrite_are_given_back(new_cluster, spark, clock,
                                                                                        monkeypatch):
    """With the rows a round carries, the window is between checking the table's version and the
    overwrite: a commit landing there is found from the version the overwrite replaced, as above."""
    cluster = new_cluster(brokers=3)
    cluster.create_topic("t", partitions=2, replication_factor=3)
    storage, other = cluster.storage, Cluster.open(spark, cluster.storage.root, clock=clock)
    carried, at = storage.replica_state().localCheckpoint(), storage.version("replica_state")
    version, calls = storage.table_version, {"n": 0}

    def versions(path):
        newest = version(path)
        calls["n"] += 1
        if calls["n"] == 1:  # the compaction has checked the version: now another writer commits
            other.create_topic("u", partitions=1, replication_factor=3)
        return newest

    with monkeypatch.context() as patched:
        patched.setattr(storage, "table_version", versions)
        assert storage.compact_replica_state(round_id=50, rows=carried, version=at) is False
    current = storage.replica_state()
    assert current.count() == 9 and current.filter(F.col("topic") == "u").count() == 3
    last = storage.commit_info(storage.path("replica_state"), storage.version("replica_state"))
    assert "step=compact-undone" in last["userMetadata"]


def test_a_replaced_commit_that_cannot_be_given_back_is_an_error(new_cluster, spark, clock, monkeypatch):
    """When yet another commit followed the overwrite, restoring would undo it: KAFKA_STORAGE_ERROR
    names the version to restore."""
    cluster = new_cluster(brokers=3)
    cluster.create_topic("t", partitions=1, replication_factor=3)
    storage, other = cluster.storage, Cluster.open(spark, cluster.storage.root, clock=clock)
    before = storage.version("replica_state")
    with monkeypatch.context() as patched:
        _another_writer_in_compaction(patched, storage, other, after_overwrite=True)
        with pytest.raises(Exception, match="KAFKA_STORAGE_ERROR: replica_state .* RESTORE the table to version "
                                            f"{before + 1} "):
            storage.compact_replica_state(round_id=50)


def test_a_bulk_produced_dataframe_is_written_with_compiled_expressions_and_the_session_keeps_its_own(
        new_cluster, spark, clock, monkeypatch):
    """produce() of a DataFrame that Spark estimates at BULK_BYTES_FOR_CODEGEN bytes or more (a bulk
    load) writes the inbox with compiled expressions, which the session's small-round settings leave
    off; a smaller DataFrame, or a list of dicts, is written with the session's own. The session's
    settings are back afterwards, also when the write fails."""
    from pipeline import produce as produce_module
    cluster = new_cluster(brokers=2)
    cluster.create_topic("t", partitions=2, replication_factor=2)
    keys = ("spark.sql.codegen.wholeStage", "spark.sql.codegen.factoryMode")
    configured = tuple(spark.conf.get(k) for k in keys)
    assert configured == ("false", "NO_CODEGEN")
    seen = []
    append_table = type(cluster.storage).append_table

    def observed(storage, df, table, *args, **kwargs):
        if table == "inbox":
            seen.append(tuple(spark.conf.get(k) for k in keys))
        return append_table(storage, df, table, *args, **kwargs)

    monkeypatch.setattr(type(cluster.storage), "append_table", observed)
    rows = spark.range(6).select((F.col("id") % 2).cast("int").alias("partition"),
                                 F.concat(F.lit("d"), F.col("id").cast("string")).alias("value"))
    assert not produce_module.is_bulk(rows)
    cluster.produce("t", rows, acks="all")  # 6 rows: the session's settings
    monkeypatch.setattr(produce_module, "BULK_BYTES_FOR_CODEGEN", 1)
    assert produce_module.is_bulk(rows)
    cluster.produce("t", rows, acks="all")  # "bulk": compiled
    cluster.produce("t", [{"value": "l0", "partition": 0}], acks="all")
    assert seen == [configured, ("true", "FALLBACK"), configured]
    assert tuple(spark.conf.get(k) for k in keys) == configured

    def failing(storage, df, table, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(type(cluster.storage), "append_table", failing)
    with pytest.raises(OSError):
        cluster.produce("t", rows)
    assert tuple(spark.conf.get(k) for k in keys) == configured
    monkeypatch.setattr(type(cluster.storage), "append_table", append_table)
    for _ in range(3):
        clock.advance(500)
        cluster.run_round()
    assert sorted(bytes(r["value"]).decode() for r in cluster.read("t").collect()) == sorted(
        [f"d{i}" for i in range(6)] * 2 + ["l0"])


def test_a_round_that_finds_replica_state_compact_and_writes_no_state_row_keeps_its_carry(new_cluster, clock,
                                                                                         monkeypatch):
    """A round without a carry that writes no replica_state row, on a table holding only current
    rows, commits nothing to it: it must not count a compaction it did not commit (its carry was
    dropped, and the next round read every partition again)."""
    monkeypatch.setattr(round_run, "STATE_COMPACTION_MIN_ROWS", 0)
    monkeypatch.setattr(round_run, "STATE_COMPACTION_RATIO", 1)
    cluster = new_cluster(brokers=2)
    cluster.create_topic("t", partitions=2, replication_factor=2)
    storage = cluster.storage
    clock.advance(500)
    cluster.run_round()  # rewrites every replica's row, then compacts the table to the current 4
    assert storage.read("replica_state").count() == 4 and cluster.core.carry is not None
    cluster.alter_configs("brokers", set={"log.cleaner.backoff.ms": 20_000})  # a config change drops it
    assert cluster.core.carry is None
    version = storage.version("replica_state")
    clock.advance(500)
    cluster.run_round()  # every partition read again; nothing to write to replica_state
    assert storage.version("replica_state") == version
    assert cluster.core.carry is not None and cluster.core.carry.versions == table_versions(storage)


def test_a_maintenance_pass_time_recorded_in_the_cluster_table_keeps_the_carry_and_a_config_change_drops_it(
        new_cluster, clock):
    """The job's first maintenance step records its time in the cluster table's properties, which
    moves the table's version as alter_configs does. The config is the same, so the carried state
    stays, and the next round with nothing to do is idle (before: a round over every partition,
    52 s at P = 100,000 in the freshness benchmark's job)."""
    cluster = new_cluster(brokers=2)
    cluster.create_topic("t", partitions=2, replication_factor=2)
    for _ in range(2):
        clock.advance(500)
        cluster.run_round()
    carry, version = cluster.core.carry, cluster.storage.version("cluster")
    assert carry is not None
    assert cluster.maintain_if_due() is None  # no pass yet: records the time to count from
    assert cluster.storage.version("cluster") == version + 1
    clock.advance(500)
    idle = cluster.run_round()
    assert cluster.core.carry is carry and idle.fetch_request_partitions == 0
    cluster.alter_configs("brokers", set={"replica.lag.time.max.ms": 20_000})
    assert cluster.core.carry is None and cluster.config["replica.lag.time.max.ms"] == 20_000


def test_a_maintenance_pass_over_the_carried_tables_keeps_the_carry_and_another_writers_rows_drop_it(
        new_cluster, spark, clock, monkeypatch):
    """A pass compacts the carried tables' files and sets their properties: commits that change no
    row (Delta's dataChange), so the next round goes on from its carry. Another writer's rows (a
    new topic) still make it read the tables."""
    cluster = new_cluster(brokers=2, config={"log.maintenance.min.files": 2})
    cluster.create_topic("t", partitions=2, replication_factor=2)
    for i in range(3):
        cluster.produce("t", [{"value": f"v{i}", "partition": 0}], acks="all")
        clock.advance(500)
        cluster.run_round()
    storage, before = cluster.storage, table_versions(cluster.storage)
    report = cluster.maintain()
    assert {"replica_state", "partitions", "results"} <= set(report.compacted)
    assert "replica_state" in report.properties_set
    assert all(a > b for a, b in zip(table_versions(storage)[:2], before[:2]))  # replica_state, partitions moved
    reads = []
    read_meta = round_run.partition_meta
    monkeypatch.setattr(round_run, "partition_meta", lambda *a: reads.append(1) or read_meta(*a))
    cluster.produce("t", [{"value": "after", "partition": 1}], acks="all")
    clock.advance(500)
    cluster.run_round()
    assert reads == [] and cluster.core.carry is not None and cluster.core.carry.versions == table_versions(storage)
    assert committed(cluster, "t") == {0: 3, 1: 1}
    assert carried_rows(cluster) == current_rows(storage)

    Cluster.open(spark, storage.root, clock=clock).create_topic("u", partitions=1, replication_factor=2)
    clock.advance(500)
    cluster.run_round()
    assert reads == [1] and committed(cluster, "u") == {0: 0}


def test_catch_up_rounds_that_answer_no_request_keep_their_carry(new_cluster, clock, monkeypatch):
    """Rounds in which a follower only catches up (the acks=all request waits for the HW) append no
    result row (their last wave records an empty commit: Storage.commit_round_row): the carry's
    versions are the tables' own, so the next round goes on from it instead of reading the tables.
    Many such rounds in a row keep it (their plans' size estimates do not grow:
    spark.without_size_estimate)."""
    # 5,000 1-byte records, 5 record batches (of 1,024 indexes); a response of 11,000 bytes: the
    # first round takes two batches (KIP-74: a first batch goes over the limit), each later round
    # about 1,000 records read from the leader's log, and the request waits until the last
    cluster = new_cluster(brokers=2, config={"replica.fetch.response.max.bytes": 11_000})
    cluster.create_topic("t", partitions=1, replication_factor=2)
    request = cluster.produce("t", [{"value": "v", "partition": 0} for _ in range(5000)], acks="all")
    clock.advance(100)
    cluster.run_round()
    reads = []
    read_meta = round_run.partition_meta
    monkeypatch.setattr(round_run, "partition_meta", lambda *a: reads.append(1) or read_meta(*a))
    caught_up_only = 0
    while cluster.produce_results().filter(F.col("request_id") == request).first()["status"] == "pending":
        results_rows = cluster.storage.read("results").count()
        clock.advance(100)
        report = cluster.run_round()
        if report.requests_acked == 0:
            assert report.records_replicated > 0
            assert cluster.storage.read("results").count() == results_rows  # (no result row)
            caught_up_only += 1
        assert cluster.core.carry.versions == table_versions(cluster.storage)
    assert caught_up_only >= 2 and reads == [] and committed(cluster, "t") == {0: 5000}
    assert carried_rows(cluster) == current_rows(cluster.storage)
