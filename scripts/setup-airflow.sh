#!/usr/bin/env bash
# Idempotent: .venv-airflow with the pinned Airflow and its Spark provider (requirements-airflow.txt).
# The project itself is not installed there; the DAG's tasks run the checkout's .venv spark-submit.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-airflow/bin/python ]; then
  python3.11 -m venv .venv-airflow 2>/dev/null || python3 -m venv .venv-airflow
fi
stamp=.venv-airflow/.installed-$(sha1sum requirements-airflow.txt | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv-airflow/bin/pip install -q -r requirements-airflow.txt
  touch "$stamp"
fi
