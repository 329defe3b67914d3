"""Delta at the edge: the root's tables (tables.py, layout.py, history.py), each broker's storage
location (locations.py), recovery of an interrupted round (recovery.py), the one-writer lease
(lease.py) and the job lock (job_lock.py), maintenance (maintenance.py) and the SQL views (views.py)."""

from pipeline.storage.failures import is_concurrent_conflict, unwritable_error
from pipeline.storage.history import RECOVERY_APP_ID, TXN_APP_ID, WRITTEN_WITH, added_rows, all_null, commit_tag, parse_tag
from pipeline.storage.layout import (CLUSTER_TABLES, LAYOUT, LAYOUT_PROPERTY, LOG_PROPS, log_stamp, table_properties,
                                     table_props)
from pipeline.storage.tables import Storage, current_rows, current_rows_sql, is_uri

__all__ = ["Storage", "current_rows", "current_rows_sql", "is_uri", "is_concurrent_conflict", "unwritable_error",
           "TXN_APP_ID", "RECOVERY_APP_ID", "WRITTEN_WITH", "commit_tag", "parse_tag", "added_rows", "all_null",
           "CLUSTER_TABLES", "LAYOUT", "LAYOUT_PROPERTY", "LOG_PROPS", "table_props", "table_properties", "log_stamp"]
