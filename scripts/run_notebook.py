"""`make notebook`: executes notebooks/walkthrough.ipynb top to bottom in a fresh kernel, on a
fresh root under the checkout (notebook-root), and saves it with its outputs, so the committed
notebook shows its tables and plots on a code host."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "walkthrough.ipynb"


def main() -> int:
    root = REPO / "notebook-root"
    for path in [root, *(root.parent / f"{root.name}-disk{b}" for b in range(3))]:
        shutil.rmtree(path, ignore_errors=True)
    os.environ.update({"REPLOG_NOTEBOOK_ROOT": str(root), "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable})
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if o.output_type == "error"]
    if errors:
        print(f"run_notebook: {errors[0].ename}: {errors[0].evalue}", file=sys.stderr)
        return 1
    nbformat.write(notebook, NOTEBOOK)
    print(f"wrote {NOTEBOOK.relative_to(REPO)} with its outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
