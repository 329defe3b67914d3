"""Airflow DAG `replog_replicate`: run the replication job on a schedule, then check partition health.

    replicate     spark-submit jobs/replicate.py --root ROOT --conf-file conf/replog.properties --available-now
    check_health  spark-submit jobs/check_health.py --root ROOT   (fails on offline / under-min-ISR partitions)

Airflow runs in its own environment (`make airflow-setup`: .venv-airflow): the Spark provider
brings `pyspark-client`, which cannot share an environment with the `pyspark` this project needs.
So the tasks call the project's own spark-submit, from the checkout's .venv, as a subprocess.

Settings (environment of the Airflow worker; `root` can also be given per run as the `root` param):
    REPLOG_ROOT      the cluster root the tasks replicate (a local path or an object-store URI)
    REPLOG_HOME      the project checkout holding .venv and conf/ (default: this file's parent dir)
    REPLOG_SCHEDULE  cron or preset (default: "*/10 * * * *")
The Spark master comes from the Airflow connection `replog_spark` (conn_type spark; host
`local[2]` or `spark://host:7077`), e.g.
    AIRFLOW_CONN_REPLOG_SPARK='{"conn_type": "spark", "host": "local[2]"}'
"""

from __future__ import annotations

import glob
import os
from datetime import datetime, timedelta

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param

HOME = os.environ.get("REPLOG_HOME", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(HOME, ".venv", "bin")
# spark-submit and the Python it starts are the project's own; the job imports `pipeline` from HOME
JOB_ENV = {
    "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    "PYSPARK_PYTHON": os.path.join(VENV_BIN, "python"),
    "PYSPARK_DRIVER_PYTHON": os.path.join(VENV_BIN, "python"),
    "PYTHONPATH": HOME,
}

# spark-defaults.conf names the Delta jars relative to the checkout; the tasks run elsewhere
DELTA_JARS = ",".join(sorted(glob.glob(os.path.join(HOME, ".cache", "jars", "delta-*.jar"))))


def spark_job(task_id: str, script: str, *args: str) -> SparkSubmitOperator:
    return SparkSubmitOperator(
        task_id=task_id,
        conn_id="replog_spark",
        application=os.path.join(HOME, "jobs", script),
        application_args=["--root", "{{ params.root }}", *args],
        properties_file=os.path.join(HOME, "conf", "spark-defaults.conf"),
        jars=DELTA_JARS,
        env_vars=JOB_ENV,
        name=f"replog-{task_id}",
        verbose=False,
    )


with DAG(
    dag_id="replog_replicate",
    description="Replicate every produced record to its followers, then fail if any partition is "
                "offline or under min.insync.replicas",
    schedule=os.environ.get("REPLOG_SCHEDULE", "*/10 * * * *"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # one writer: a run never overlaps the previous one
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    # a scheduled run replicates $REPLOG_ROOT; a manual run may name another root (an empty root
    # fails the first task with "--root is required")
    params={"root": Param(os.environ.get("REPLOG_ROOT", ""), type="string",
                          description="the cluster root to replicate")},
    tags=["replog"],
) as dag:
    replicate = spark_job("replicate", "replicate.py", "--conf-file", os.path.join(HOME, "conf", "replog.properties"),
                          "--available-now")
    check = spark_job("check_health", "check_health.py")
    check.retries = 0  # unhealthy is an answer, not a transient failure
    replicate >> check
