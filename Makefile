PY := .venv/bin/python
ROOT ?= demo-root

.PHONY: setup test test-java21 test-integration test-airflow airflow-setup demo notebook clean profile bench bench-round soak soak-model

setup:
	@bash scripts/setup.sh

# two pytest workers, one test file each at a time (module fixtures stay in one worker): a round
# is mostly driver-side latency, so two processes use the two cores (8:43 vs 9:59 sequential)
test: setup
	$(PY) -m pytest -n 2 --dist loadfile --durations=15

# the suite on Java 21 where the machine packages none (Debian 12): Debian 13's runtime, unpacked
# into .cache/java21 (scripts/debian13_java21.sh)
test-java21:
	JAVA_HOME=$$(scripts/debian13_java21.sh) $(MAKE) test

# the jobs run as users run them: spark-submit and CLI subprocesses (minutes; CI runs it after make
# test). Two workers that take test by test (a few tests of minutes each, in few files: whole files
# per worker left one worker idle for most of the run)
test-integration: setup
	$(PY) -m pytest -m integration -n 2 --dist worksteal --durations=15

# the fault-injection soak (tests/soak/): SEEDS seeds from SEED, EVENTS events each; a failing
# history is minimized with at most MAX_REPLAYS replays and saved; REPLAY=file replays a saved one;
# MINUTES=m time-boxes the run (no event starts after it; what ran still heals and is checked)
SEED ?= 1
SEEDS ?= 1
EVENTS ?= 300
MAX_REPLAYS ?= 150
soak: setup
	$(PY) -m tests.soak.run $(if $(REPLAY),--replay $(REPLAY),--seed $(SEED) --seeds $(SEEDS) --events $(EVENTS) --max-replays $(MAX_REPLAYS) $(if $(RECORD),--record $(RECORD)) $(if $(MINUTES),--minutes $(MINUTES)))

# the lockstep soak: the same events on the reference model (tests/soak/model.py) and a real cluster,
# compared after every round (tests/soak/lockstep.py)
soak-model: setup
	$(PY) -m tests.soak.run --model --seed $(SEED) --seeds $(SEEDS) --events $(EVENTS) --max-replays $(MAX_REPLAYS) $(if $(RECORD),--record $(RECORD))

demo: setup
	$(PY) jobs/demo.py --root $(ROOT)

# executes notebooks/walkthrough.ipynb and saves it with its outputs (tables, plots) for a code host
notebook: setup
	$(PY) scripts/run_notebook.py

clean:
	rm -rf demo-root notebook-root notebook-root-disk* spark-warehouse .pytest_cache

profile: setup
	$(PY) jobs/profile_round.py

# benchmarks (minutes to hours): figures for the README, never timed tests; BENCH_ARGS to override
bench: setup
	@$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q -e '.[bench]'
	$(PY) jobs/benchmark.py --scenario fetch-sessions --readme $(BENCH_ARGS)

# the round as users run it: seconds and Spark jobs at P = 100 and 10,000 (minutes), then the
# README's round table and its chart from every saved figure (jobs/round_table.py names the others)
bench-round: setup
	@$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q -e '.[bench]'
	$(PY) jobs/bench_round.py --partitions 100 --rounds 12
	$(PY) jobs/bench_round.py --partitions 10000 --rounds 6
	$(PY) jobs/round_table.py --readme --png benchmarks/round_targets.png

# Airflow lives in its own environment (.venv-airflow): its Spark provider brings pyspark-client,
# which cannot share one with pyspark. The DAG's tasks call this checkout's .venv spark-submit.
airflow-setup: setup
	@bash scripts/setup-airflow.sh

test-airflow: airflow-setup
	.venv-airflow/bin/python -m pytest -o addopts="-q -p no:cacheprovider" airflow_tests
