"""The health check an Airflow task runs after the replication job, run from a checkout:

    spark-submit --properties-file conf/spark-defaults.conf jobs/check_health.py --root PATH

The check itself is pipeline/jobs/check_health.py (exit 1 on an offline or under-min-ISR partition)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.jobs.check_health import main  # noqa: E402

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
