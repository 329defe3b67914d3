PY := .venv/bin/python
ROOT ?= demo-root

.PHONY: setup test test-integration demo clean profile

setup:
	@bash scripts/setup.sh

test: setup
	$(PY) -m pytest

# the jobs run as users run them: spark-submit subprocesses (minutes; CI runs it after make test)
test-integration: setup
	$(PY) -m pytest -m integration

demo: setup
	$(PY) jobs/demo.py --root $(ROOT)

clean:
	rm -rf demo-root spark-warehouse .pytest_cache

profile: setup
	$(PY) jobs/profile_round.py
