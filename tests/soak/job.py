"""The soak's `kill_job` event, in processes of its own: the replication job under spark-submit
(jobs/replicate.py, as users start it) runs rounds on the soak's root while two `replog produce`
processes write the inbox, and is then killed with SIGKILL (JVM and Python at once), while one of
its rounds is committing when the soak catches one.

Progress is read from the tables' Delta logs (the newest commit's userMetadata), with no Spark job
and no code of `pipeline/`: a round has committed when the rounds table's newest commit names it,
and a round is in flight while a broker's log has a commit of a newer round.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ROUND_TAG = "replog-round="


def job_env() -> dict:
    """This process's environment without what ties pyspark to its own JVM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_GATEWAY", "SPARK_"))}
    return {**env, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO),
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"}


def newest_round(table_dir: str) -> int:
    """The round named by a Delta table's newest commit that names one (0: none does; commits of
    maintenance and recovery name none)."""
    log = Path(table_dir) / "_delta_log"
    commits = sorted(log.glob("*.json")) if log.exists() else []
    for path in reversed(commits):
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:  # removed by Delta's log cleanup meanwhile
            continue
        for line in lines:
            if line.startswith('{"commitInfo"'):
                meta = json.loads(line)["commitInfo"].get("userMetadata") or ""
                if meta.startswith(ROUND_TAG):
                    return int(meta[len(ROUND_TAG):].split(";", 1)[0])
                break
    return 0


def table_version(table_dir: str) -> int:
    """A Delta table's newest version, from its log's file names (-1: no commit yet)."""
    log = Path(table_dir) / "_delta_log"
    return max((int(p.stem) for p in log.glob("*.json") if p.stem.isdigit()), default=-1) if log.exists() else -1


def rounds_done(root: str) -> int:
    return newest_round(os.path.join(root, "cluster", "rounds"))


def round_in_flight(root: str, logs: list[str]) -> int | None:
    """A round whose commits have reached a broker's log (`logs`: their paths) while the rounds
    table has not."""
    done = rounds_done(root)
    for log in logs:
        r = newest_round(log)
        if r > done:
            return r
    return None


class Job:
    """jobs/replicate.py under spark-submit, a round every `interval_ms`, logging to `log`."""

    def __init__(self, root: str, log: str, interval_ms: int = 500):
        self.root, self.log = root, log
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [str(BIN / "spark-submit"), "--master", "local[2]", "--properties-file", "conf/spark-defaults.conf",
                 str(REPO / "jobs" / "replicate.py"), "--root", root, "--trigger-interval", f"{interval_ms}ms"],
                stdout=out, stderr=subprocess.STDOUT, env=job_env(), cwd=REPO, start_new_session=True)

    def tail(self, chars: int = 3000) -> str:
        return Path(self.log).read_text(errors="replace")[-chars:]

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL to the job's whole process group: the spark-submit JVM and its Python driver."""
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)


def start_producer(root: str, topic: str, partition: int, acks, values: list[str]) -> subprocess.Popen:
    """`replog produce` of `values` as lines, to one partition, in a process of its own."""
    process = subprocess.Popen([str(BIN / "replog"), "produce", "--root", root, "--topic", topic,
                                "--partition", str(partition), "--acks", str(acks), "--client-id", "soak-cli"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=job_env(), cwd=REPO)
    process.stdin.write("".join(f"{v}\n" for v in values))
    process.stdin.close()
    return process


def check_producers(processes: list[subprocess.Popen]) -> None:
    """Raises RuntimeError for a `replog produce` process that exited with an error."""
    for process in processes:
        if process.poll() not in (None, 0):
            raise RuntimeError(f"replog produce failed ({process.returncode}): "
                               f"{(process.stdout.read() + process.stderr.read())[-2000:]}")


def request_id(process: subprocess.Popen, timeout: float) -> str:
    """The request id `replog produce` printed ("... request <id>.")."""
    process.wait(timeout=timeout)
    out, err = process.stdout.read(), process.stderr.read()
    if process.returncode != 0 or " request " not in out:
        raise RuntimeError(f"replog produce failed ({process.returncode}): {(out + err)[-2000:]}")
    return out.rsplit(" request ", 1)[1].strip().rstrip(".")


def wait_until(condition, timeout: float, job: Job, what: str, idle: float | None = None):
    """Polls `condition` every 10 ms until it returns a truthy value (returned); None after
    `timeout` s or, with `idle`, once the job's log has not grown for `idle` s (a job that has
    stopped working, told apart from one slowed by a loaded machine). The job must stay alive."""
    now = time.monotonic()
    deadline, size, grew = now + timeout, -1, now
    while True:
        value = condition()
        if value:
            return value
        if not job.alive():
            raise RuntimeError(f"the replication job exited ({job.process.returncode}) before {what}:\n{job.tail()}")
        now = time.monotonic()
        if idle is not None:
            current = os.path.getsize(job.log)
            if current != size:
                size, grew = current, now
            if now - grew > idle:
                return None
        if now > deadline:
            return None
        time.sleep(0.01)
