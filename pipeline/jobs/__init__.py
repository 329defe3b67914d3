"""The jobs spark-submit runs: the replication job (replicate.py) and the health check
(check_health.py). From a checkout, jobs/ holds thin scripts that run them; an installed package
starts the replication job with `replog job`."""
