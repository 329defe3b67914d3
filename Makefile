PY := .venv/bin/python
ROOT ?= demo-root

.PHONY: setup test demo clean profile

setup:
	@bash scripts/setup.sh

test: setup
	$(PY) -m pytest

demo: setup
	$(PY) jobs/demo.py --root $(ROOT)

clean:
	rm -rf demo-root spark-warehouse .pytest_cache

profile: setup
	$(PY) jobs/profile_round.py
