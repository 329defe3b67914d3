"""The Spark runtime: the session (session.py), its tuning (tuning.py) and the Py4J lookup cache
(jvm_lookups.py), which get_spark() switches on; importing `pipeline` patches nothing."""

from pipeline.runtime.session import (PARALLEL_GC, QUIET_CDS_LOG, SparkSetupError, delta_jars,
                                      driver_java_options, forget_table_logs, get_spark, jvm_archive)
from pipeline.runtime.tuning import (COMPILED_EXPRESSIONS, FAST_CONFS, compiled_expressions, settings_restored,
                                     without_size_estimate)

__all__ = ["get_spark", "delta_jars", "SparkSetupError", "forget_table_logs", "driver_java_options", "jvm_archive",
           "PARALLEL_GC", "QUIET_CDS_LOG", "FAST_CONFS", "COMPILED_EXPRESSIONS", "compiled_expressions",
           "settings_restored", "without_size_estimate"]
