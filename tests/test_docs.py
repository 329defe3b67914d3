"""The docs a user reads: the generated tables up to date, the README short, and no commit ids or
links to files the repository does not hold. No Spark."""

import os
import re

from jobs.doc_tables import config_table, storage_tables, updated

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "CHANGELOG.md", *(os.path.join("docs", n) for n in sorted(os.listdir(os.path.join(ROOT, "docs")))
                                      if n.endswith(".md"))]


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def test_the_generated_tables_match_the_code():
    stale = [os.path.relpath(path, ROOT) for path, (now, want) in updated().items() if now != want]
    assert stale == [], "run: python jobs/doc_tables.py"
    from pipeline.config import CLUSTER_KEYS
    from pipeline.storage.layout import CLUSTER_TABLES
    assert config_table().count("\n| `") == len(CLUSTER_KEYS)
    assert storage_tables().count("\n| `") == len(CLUSTER_TABLES) + 1  # and the broker's log


def test_the_readme_is_a_short_guide():
    readme = read("README.md")
    assert len(readme.splitlines()) <= 420
    for section in ("## Set-up", "## Quick start", "## The API", "## The command line", "## SQL views",
                    "## The replication job", "## Scheduling with Airflow", "## Running on a cluster",
                    "## Configuration", "## Limitations", "## Benchmarks"):
        assert section in readme, section


def test_no_commit_ids_and_no_links_outside_the_repository():
    for name in DOCS:
        text = read(name)
        ids = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", w) and re.search(r"\d", w)]
        assert ids == [], f"{name}: {ids}"
        assert "not in the repo" not in text and "../shared" not in text, name
        here = os.path.dirname(os.path.join(ROOT, name))
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert os.path.exists(os.path.join(here, target)), f"{name} links to {target}, which is not here"


def test_the_notebook_is_committed_with_its_outputs():
    import json
    notebook = json.loads(read(os.path.join("notebooks", "walkthrough.ipynb")))
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert all(c.get("execution_count") for c in code), "run: make notebook"
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the plots render on a code host
    plot = next("".join(c["source"]) for c in code if "HW (leader)" in "".join(c["source"]))
    assert "and h[7])" in plot  # the series is the leader's HW (is_leader), not any in-sync replica's
