"""The soak's faults beneath the API (soak.py's other events call the API): a running broker's
storage location deleted or made read-only, a stopped broker's log directory lost, a round killed
after a random one of its commits, and the replication job under spark-submit killed by SIGKILL
mid-round while two `replog produce` processes write the inbox. A mixin of Soak: it uses its
cluster, clock, random generator, expectations and notes."""

from __future__ import annotations

import os
import shutil
import time

from pyspark.sql import functions as F

from pipeline import Cluster
from tests.fs_faults import read_only
from tests.soak import job as job_process
from tests.soak.checker import Violation

ACKS = {0: 0, 1: 1, "all": -1}  # the soak's acks as a produce request carries them
# the wait for a spark-submit job's first round: while the job's log grows (a JVM start and a first
# round that halts a broker take minutes on a loaded machine), up to FIRST_ROUND_S; a log that
# stands still for JOB_IDLE_S is a job that has stopped working
FIRST_ROUND_S, JOB_IDLE_S = 1800, 300


class Crash(Exception):
    """Stands for the process dying right after a commit of a round."""


class StorageAndProcessFaults:
    """draw_* and do_* of the faults (see the module's docstring)."""

    def _location_back(self, broker: int) -> None:
        """A location that refused writes can be written again (a deleted one is made anew, empty,
        by start_broker)."""
        if broker in self.unwritable:
            read_only(self.cluster.storage.broker_root(broker), False)
            self.unwritable.discard(broker)

    def draw_fail_location(self) -> dict | None:
        if self.stopped or self.failing:
            return None
        return {"broker": self.rng.randrange(3), "how": self.rng.choice(["delete", "unwritable"])}

    def do_fail_location(self, broker: int, how: str) -> None:
        """A running broker's whole storage location fails: deleted (a lost disk or bucket) or
        read-only. A round halts the broker when it meets the failure (the next round, when deleted;
        its next write to that log, when read-only), the controller fences it and moves its
        leaderships; start (or heal) brings the location back (a deleted one empty) and restarts it."""
        if self.stopped or self.failing:  # one broker down at a time
            return self._skip(f"broker {broker}'s location fails ({how})")
        where = self.cluster.storage.broker_root(broker)
        if how == "delete":
            shutil.rmtree(where)
        else:
            read_only(where, True)
            self.unwritable.add(broker)
        self.failing[broker] = how
        self._note(f"broker {broker}'s location {where} fails ({how})")

    def draw_lose_disk(self) -> dict | None:
        candidates = sorted(self.stopped - self.lost - self.unwritable)
        return {"broker": candidates[0]} if candidates else None

    def do_lose_disk(self, broker: int) -> None:
        if broker not in self.stopped or broker in self.lost or broker in self.unwritable:
            return self._skip(f"broker {broker} loses its log directory")
        shutil.rmtree(self.cluster.storage.log_path(broker), ignore_errors=True)
        self.lost.add(broker)
        self._note(f"broker {broker} loses its log directory")

    def draw_crash_round(self) -> dict:
        return {"after_commit": self.rng.randint(1, 6)}

    def do_crash_round(self, after_commit: int) -> None:
        done = []

        def hook(path, step):
            done.append(step)
            if len(done) == after_commit:
                raise Crash(f"after commit {after_commit} ({step} of {path})")

        self.cluster.storage.after_commit = hook
        self.clock.advance(500)
        try:
            report = self.cluster.run_round()
            self.rounds += 1
            self._note(f"round {report.round_id} (a crash after commit {after_commit} was armed; the round made "
                       f"{len(done)})")
            # a round that completed is checked like any other: the checks that compare with the last
            # round (an election against the ISR before it, the HW) must see every round's outcome
            self._halted_by_failure()
            self.after_round(report, self.checker.check())
        except Crash as crash:
            self._note(f"round killed {crash}")
        finally:
            self.cluster.storage.after_commit = None
        self._note("round (recovers and replays)")
        self._round()

    def draw_kill_job(self) -> dict:
        def producer() -> dict:
            topic = self.rng.choice(sorted(self.topics))
            return {"topic": topic, "partition": self.rng.randrange(self.topics[topic]),
                    "acks": self.rng.choice([0, 1, "all"]), "values": self._values()}
        return {"after_rounds": self.rng.randint(1, 3), "producers": [producer(), producer()]}

    def do_kill_job(self, after_rounds: int, producers: list) -> None:
        """The replication job under spark-submit takes over the rounds (its lease fences this
        process's cluster object, as a restarted job fences a dead one); two `replog produce`
        processes write the inbox during its rounds; once both requests are in the inbox and the job
        has run `after_rounds` rounds, SIGKILL while a round is committing (the round that appends
        them, as a rule; if none is caught within 300 s, between rounds); a job that runs no round
        at all (FIRST_ROUND_S, JOB_IDLE_S) is a violation. This process then opens the cluster
        anew, as a restarted job would, and its round undoes and replays the killed one. The job's
        rounds run on the wall clock (a jump forward from the soak's clock, as a long wait); the
        soak's clock then moves to the job's last round."""
        producers = [p for p in producers if p["partition"] < self.topics.get(p["topic"], 0)]
        start, began = job_process.rounds_done(self.root), time.monotonic()
        job = job_process.Job(self.root, log=os.path.join(os.path.dirname(self.root), f"job-{len(self.events)}.log"))
        killed = None
        try:
            try:
                if not job_process.wait_until(lambda: job_process.rounds_done(self.root) > start, FIRST_ROUND_S, job,
                                              "its first round", idle=JOB_IDLE_S):
                    raise Violation("job", f"the replication job ran no round in {time.monotonic() - began:.0f} s "
                                           f"(the soak waits while its log grows, at most {FIRST_ROUND_S} s):\n{job.tail()}")
                inbox = os.path.join(self.root, "cluster", "inbox")
                landed = job_process.table_version(inbox) + len(producers)
                running = [job_process.start_producer(self.root, p["topic"], p["partition"], p["acks"], p["values"])
                           for p in producers]

                def appending() -> int | None:
                    """A round in flight once both processes' requests are in the inbox (the round
                    that appends them writes the logs; a round with nothing to do writes none)."""
                    job_process.check_producers(running)
                    if job_process.table_version(inbox) < landed:
                        return None
                    r = job_process.round_in_flight(self.root, list(self.checker.log_paths().values()))
                    return r if r is not None and r > start + after_rounds else None

                killed = job_process.wait_until(appending, 300, job, f"round {start + after_rounds}")
            except RuntimeError as e:  # the job exited by itself, or a producer failed
                raise Violation("job", str(e)) from None
        finally:
            job.kill()
        try:
            for p, process in zip(producers, running):
                rid = job_process.request_id(process, timeout=300)
                self.expected.requests[rid] = (p["topic"], ACKS[p["acks"]], [(p["partition"], v) for v in p["values"]])
                self._note(f"replog produce {p['topic']}-{p['partition']} acks={p['acks']} {p['values']} "
                           f"-> {rid[:8]} (a process of its own, during the job's rounds)")
        except RuntimeError as e:  # a producer failed
            raise Violation("job", str(e)) from None
        done = job_process.rounds_done(self.root)
        self._note(f"replication job ran rounds {start + 1}..{done}, SIGKILL "
                   + (f"while round {killed} committed" if killed else "between rounds")
                   + f" ({time.monotonic() - began:.0f} s)")
        self.cluster = Cluster.open(self.spark, self.root, clock=self.clock)
        last_ms = self.cluster.rounds().agg(F.max("now_ms")).first()[0]
        if last_ms > self.clock.now_ms():
            self.clock.advance(last_ms - self.clock.now_ms())
        self.last_round_ms = max(self.last_round_ms or 0, last_ms)
        self._note("round (a new process: recovers and replays)")
        self._round()
        if self.last_round_ms > self.clock.now_ms():  # the replayed round ran at the killed round's time
            self.clock.advance(self.last_round_ms - self.clock.now_ms())
