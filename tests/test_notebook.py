"""notebooks/walkthrough.ipynb, executed top to bottom in its own kernel as a user would run it."""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.test_replicate_job import job_env

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration


def test_the_walkthrough_runs_without_errors(tmp_path, monkeypatch):
    notebook = nbformat.read(REPO / "notebooks" / "walkthrough.ipynb", as_version=4)
    # the kernel is a process of its own: its own Spark, this checkout importable, a fresh root
    for key, value in {**job_env(), "REPLOG_NOTEBOOK_ROOT": str(tmp_path / "cluster")}.items():
        monkeypatch.setenv(key, value)
    for key in [k for k in os.environ if k.startswith(("PYSPARK_GATEWAY", "SPARK_")) or k == "MPLBACKEND"]:
        monkeypatch.delenv(key)
    NotebookClient(notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()

    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert all(f"cluster-disk{b}" in text for b in range(3))  # each broker's location, from replog.brokers
    # broker 2 leaves the ISRs of the two partitions it follows, then rejoins both
    assert "ISR -0/+0" in text and "ISR -2/+0" in text and "ISR -0/+2" in text
    # broker 0 crashes: fenced after the session timeout, partition 0 led by broker 1 in epoch 1
    assert "partition 0: leader 0 -> 1, epoch 0 -> 1" in text and "committed records: 420" in text
    assert "NOT_LEADER_OR_FOLLOWER" in "".join(o.get("text", "") for o in outputs)
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the plots were drawn
