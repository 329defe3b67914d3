"""The replication job, run from a checkout:

    spark-submit --properties-file conf/spark-defaults.conf jobs/replicate.py --root PATH [...]

The job itself is pipeline/jobs/replicate.py (its flags: `--help`); an installed package starts it
with `replog job`."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.jobs.replicate import (install_stop_handlers, main, parse_interval_ms, read_properties,  # noqa: E402
                                     run_available_now, run_streaming)

__all__ = ["main", "parse_interval_ms", "read_properties", "run_available_now", "run_streaming",
           "install_stop_handlers"]

if __name__ == "__main__":
    sys.exit(main())
