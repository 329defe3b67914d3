"""Kafka's replication rules for round v2 (DESIGN.md, "Round v2"), pure and vectorised.

Each rule works on numpy arrays laid out as the partition state is (pipeline/control/state.py):
one row per partition, and per replica a column of a `[partitions, replicas]` matrix in replica
order. A rule is named as Kafka names it, and is tested alone with Kafka's numbers; the control
job (pipeline/control/fetch_round.py) composes them over a bucket of partitions, one Spark task a
bucket. Nothing here reads or writes a table, looks at a clock, or knows about Spark.
"""
