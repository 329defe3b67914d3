"""The Airflow DAG (jobs/replog_dag.py), in Airflow's own environment (`make test-airflow`).

The DAG file is copied into a fresh AIRFLOW_HOME's dags folder, as a deployment would; REPLOG_HOME
points its tasks at this checkout. `dag.test()` runs it for real: both tasks are spark-submit
subprocesses of the project's own .venv. The cluster root is prepared and inspected with that
.venv's Python (airflow_tests/cluster_setup.py), never with Airflow's.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROJECT_PYTHON = REPO / ".venv" / "bin" / "python"


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow_home")
    (home / "dags").mkdir()
    shutil.copy(REPO / "jobs" / "replog_dag.py", home / "dags" / "replog_dag.py")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPARK_", "PYSPARK"))},
           "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "REPLOG_HOME": str(REPO),
           "AIRFLOW_CONN_REPLOG_SPARK": json.dumps({"conn_type": "spark", "host": "local[2]"})}
    migrated = subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=env,
                              capture_output=True, text=True, timeout=300)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    return env


def dag_run(env, root=None):
    """dag_run.py in Airflow's Python: the DagBag's import errors, the DAG's shape, a run's states."""
    done = subprocess.run([sys.executable, str(REPO / "airflow_tests" / "dag_run.py"), *([root] if root else [])],
                          env=env, capture_output=True, text=True, timeout=1200)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-5000:]
    return json.loads(lines[-1][len("RESULT "):]), done.stdout + done.stderr


def cluster_step(step, root):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPARK_", "PYSPARK"))}
    done = subprocess.run([str(PROJECT_PYTHON), str(REPO / "airflow_tests" / "cluster_setup.py"), step, root],
                          env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("STATE ")]
    return json.loads(lines[-1][len("STATE "):]) if lines else None


def test_the_dag_loads_without_import_errors(airflow_env):
    result, _ = dag_run(airflow_env)
    assert result["import_errors"] == {}
    assert result["dags"] == ["replog_replicate"]
    assert result["tasks"] == {"replicate": ["check_health"], "check_health": []}
    assert result["schedule"] == "*/10 * * * *"


def test_a_run_replicates_then_the_check_fails_on_under_min_isr(airflow_env, tmp_path):
    root = str(tmp_path / "cluster")
    cluster_step("create", root)  # 30 records produced with acks=all, min.insync.replicas = 3

    healthy, log = dag_run(airflow_env, root)
    assert healthy["state"] == "success", log[-5000:]
    assert healthy["task_states"] == {"replicate": "success", "check_health": "success"}
    assert "check_health: healthy: 2 partitions: 0 offline, 0 under min ISR, 0 under-replicated" in log
    state = cluster_step("state", root)
    assert state == {"committed": 30, "isr": {"0": [0, 1, 2], "1": [1, 2, 0]}, "statuses": ["acked"]}

    cluster_step("shrink", root)  # broker 2's fetcher paused: it leaves both ISRs
    unhealthy, log = dag_run(airflow_env, root)
    assert unhealthy["state"] == "failed"
    assert unhealthy["task_states"] == {"replicate": "success", "check_health": "failed"}
    assert "check_health: UNHEALTHY: 2 partitions: 0 offline, 2 under min ISR, 2 under-replicated" in log
    assert cluster_step("state", root)["isr"] == {"0": [0, 1], "1": [1, 0]}
