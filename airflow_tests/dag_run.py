"""Run in the Airflow environment: load the DAG folder, report import errors, and run the DAG once
with `dag.test()`; prints one JSON line with the DAG's shape and the run's task states."""

import json
import os
import sys


def main() -> None:
    root = sys.argv[1] if len(sys.argv) > 1 else None
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    out = {"import_errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": sorted(bag.dag_ids)}
    dag = bag.dags.get("replog_replicate")
    if dag is not None:
        out["tasks"] = {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks}
        out["schedule"] = str(dag.schedule)
        if root:
            run = dag.test(run_conf={"root": root})
            out["state"] = str(run.state)
            out["task_states"] = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
