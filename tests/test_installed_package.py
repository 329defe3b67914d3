"""The package as a user installs it: `pip install` of its wheel into a fresh virtualenv, run from
a directory outside the checkout. The Delta jars go to the user's cache (fetched from Maven
Central by the first Spark session), nothing is written beside the installed source, and the
installed `replog` runs a cluster end to end, the replication job under spark-submit included."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration


def test_pip_install_outside_the_checkout_runs_the_cli_and_the_job(tmp_path):
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies (pyspark, delta-spark, ...) from this environment, not downloaded again:
    # a path in a .pth file, which does not load that directory's own .pth files (this
    # checkout's editable install), so `pipeline` comes from the wheel
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                                *map(str, wheels.glob("replog-*.whl"))], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]

    home = tmp_path / "work"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "SPARK_", "REPLOG_", "VIRTUAL_ENV")) and k != "PYTHONPATH"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "user-cache"), PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}")

    def run(*args, stdin=None):
        return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=900, env=env, cwd=home)

    where = run(str(python), "-c", "import pipeline, pipeline.jobs.replicate as job, importlib.resources as r; "
                "print(pipeline.__file__); print((r.files('pipeline') / 'conf' / 'replog.properties').is_file())")
    assert where.stdout.split() == [f"{site}/pipeline/__init__.py", "True"], where.stderr[-2000:]

    replog = str(venv / "bin" / "replog")
    assert run(replog, "--version").stdout.startswith("replog 0.1.0 (pyspark 4.2.0")
    created = run(replog, "--root", "r", "cluster", "--create", "--brokers", "3")
    assert created.returncode == 0 and created.stderr == "", created.stderr[-3000:]
    assert run(replog, "--root", "r", "topics", "--create", "--topic", "t", "--replication-factor", "3").returncode == 0
    assert run(replog, "--root", "r", "produce", "--topic", "t", "--acks", "all", stdin="a\nb\nc\n").returncode == 0
    job = run(replog, "--root", "r", "job", "--available-now", "--spark-conf", "spark.ui.enabled=false")
    assert job.returncode == 0, (job.stdout + job.stderr)[-3000:]
    counted = run(replog, "--root", "r", "sql", "SELECT count(*) AS n FROM replog.committed", "--output", "json")
    assert counted.stdout.strip() == '{"n": 3}', counted.stderr[-2000:]

    jars = sorted(p.name for p in (tmp_path / "user-cache" / "replog" / "jars").glob("*.jar"))
    assert jars == ["delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"]
    assert not Path(site, ".cache").exists() and not Path(site, "pipeline", ".cache").exists()
