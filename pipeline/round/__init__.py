"""The round (docs/design.md, "Round v2"): one fetch round of every broker, the function the
replication job's foreachBatch calls through Cluster.run_round.

- inputs.py: what the driver knows before a round (RoundInputs) and what it reports (RoundReport);
  the idle round.
- reads.py: the tables a round reads.
- controller.py: the controller's wave (elections, reassignments, leader-epoch checks), when due.
- client_quotas.py: the produce requests the clients' quotas let through.
- control_job.py: Kafka's rules (pipeline/control/) over buckets of partitions, one Spark job.
- active.py: the control job, the records written once per broker, the control outputs.
- run.py: the cluster's round on its tables, and what it carries to the next (Carry).
- driver.py: an open cluster's round: the lease, halts, recovery, the inputs gathered on the driver.
"""

from pipeline.round.inputs import CARRIED_TABLES, RoundInputs, RoundReport, idle_round, table_versions
from pipeline.round.run import Carry, run_round

__all__ = ["RoundInputs", "RoundReport", "Carry", "CARRIED_TABLES", "run_round", "idle_round", "table_versions"]
