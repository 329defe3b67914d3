"""The fault-injection soak: a seeded generator interleaves traffic and faults on a real cluster
(3 brokers, Delta tables on disk) and the independent checker (checker.py) checks the tables after
every round; at the end the cluster heals and every produce request must have settled.

Events: produce with acks 0, 1 or all; idempotent batches and their retries; rounds; clock jumps
(past replica.lag.time.max.ms and broker.session.timeout.ms); pause, resume and throttle of a
broker's fetcher; a broker crash and restart; the loss of a stopped broker's log directory; a round
killed after a random one of its commits and run again (recovery); preferred leader elections;
delete_records; topic creation; reassignments (KIP-455) of a partition to 2 or 3 of the brokers;
a producer_byte_rate on the client id every produce carries, set, changed or removed (requests wait
for it in the inbox; healing removes it). Topic "unclean" allows unclean leader election (the
checker does not hold it to the guarantees that election gives up).

    python -m tests.soak.run --seed 7 --events 300        (make soak SEED=7 EVENTS=300)

A violation raises with the seed and the event history up to it. The cluster's own randomness
(fetch session ids) is not seeded, so a seed replays the same events, not always the same ids.
"""

from __future__ import annotations

import random
import shutil

from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock
from pipeline.errors import ReplogError
from tests.soak.checker import Checker, Expected, Violation

START_MS = 1_700_000_000_000
ACKS = {0: 0, 1: 1, "all": -1}


class Crash(Exception):
    """Stands for the process dying right after a commit of a round."""


# event -> weight
WEIGHTS = {
    "produce": 6, "idempotent": 3, "round": 8, "wait": 2, "pause": 1, "resume": 2, "throttle": 1,
    "unthrottle": 1, "stop": 1, "start": 2, "lose_disk": 1, "crash_round": 2, "preferred": 1,
    "delete_records": 1, "create_topic": 1, "read": 2, "reassign": 1, "quota": 1,
}
CLIENT_ID = "soak"


class Soak:
    def __init__(self, spark, root: str, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = ManualClock(start_ms=START_MS)
        self.cluster = Cluster.create(spark, root, brokers=3, clock=self.clock,
                                      config={"min.insync.replicas": 2, "replica.fetch.max.bytes": 4096})
        self.cluster.create_topic("clean", partitions=3, replication_factor=3)
        self.cluster.create_topic("unclean", partitions=2, replication_factor=3,
                                  config={"unclean.leader.election.enable": True})
        self.topics = {"clean": 3, "unclean": 2}
        self.expected = Expected(unclean_topics={"unclean"})
        self.checker = Checker(spark, root, self.expected)
        self.history: list[str] = []
        self.values = 0
        self.stopped: set[int] = set()
        self.lost: set[int] = set()
        self.paused: set[int] = set()
        self.throttled: set[int] = set()
        self.producers: dict[int, dict] = {}  # partition of "clean" -> producer id, next sequence, last batch
        self.rounds = 0
        self.quota_rate: int | None = None  # the client's producer_byte_rate

    # -- helpers -----------------------------------------------------------------------------
    def _value(self) -> str:
        self.values += 1
        return f"s{self.seed}-{self.values}"

    def _note(self, text: str) -> None:
        self.history.append(f"{len(self.history)}: {text}")

    def _round(self, ms: int = 500) -> None:
        self.clock.advance(ms)
        report = self.cluster.run_round()
        self.rounds += 1
        self._note(f"  round {report.round_id} at +{self.clock.now_ms() - START_MS} ms: appended "
                   f"{report.records_appended}, acked {report.requests_acked}, failed {report.requests_failed}, "
                   f"isr -{report.isr_shrinks}/+{report.isr_expands}, offline {report.offline_partitions}")
        self.checker.check()

    def _status(self, request_id: str) -> set:
        return {r["status"] for r in self.cluster.produce_results()
                .filter(F.col("request_id") == request_id).select("status").collect()}

    # -- events ------------------------------------------------------------------------------
    def produce(self) -> None:
        topic = self.rng.choice(sorted(self.topics))
        acks = self.rng.choice([0, 1, "all"])
        records = [{"value": self._value(), "partition": self.rng.randrange(self.topics[topic])}
                   for _ in range(self.rng.randint(1, 4))]
        rid = self.cluster.produce(topic, records, acks=acks, client_id=CLIENT_ID)
        self.expected.requests[rid] = (topic, ACKS[acks], [(r["partition"], r["value"]) for r in records])
        self._note(f"produce {topic} acks={acks} {[(r['partition'], r['value']) for r in records]} -> {rid[:8]}")

    def idempotent(self) -> None:
        partition = self.rng.randrange(self.topics["clean"])
        p = self.producers.setdefault(partition, {"id": 1000 + partition, "seq": 0, "last": None})
        last = p["last"]
        status = self._status(last[0]) if last else {"acked"}
        if last and (status - {"acked", "error"} or self.rng.random() < 0.25) and "error" not in status:
            values, base, kind = last[1], last[2], "retry"  # pending (or again once acked): the same batch
        else:
            base = last[2] if last and "error" in status else p["seq"]  # a failed batch's sequence is free
            values, kind = [self._value() for _ in range(self.rng.randint(1, 3))], "batch"
        records = [{"value": v, "partition": partition, "producer_id": p["id"], "producer_epoch": 0,
                    "sequence": base + i} for i, v in enumerate(values)]
        rid = self.cluster.produce("clean", records, acks="all", client_id=CLIENT_ID)
        self.expected.requests[rid] = ("clean", -1, [(partition, v) for v in values])
        p["seq"] = max(p["seq"], base + len(values))
        p["last"] = (rid, values, base)
        self._note(f"idempotent {kind} clean-{partition} pid={p['id']} seq={base}.. {values} -> {rid[:8]}")

    def round(self) -> None:
        self._note("round")
        self._round()

    def wait(self) -> None:
        ms = self.rng.choice([3_000, 10_000, 35_000])
        self._note(f"wait {ms} ms")
        self._round(ms)

    def pause(self) -> None:
        b = self.rng.choice([b for b in range(3) if b not in self.paused] or [None])
        if b is not None:
            self.cluster.pause_fetcher(b)
            self.paused.add(b)
            self._note(f"pause fetcher {b}")

    def resume(self) -> None:
        if self.paused:
            b = self.rng.choice(sorted(self.paused))
            self.cluster.resume_fetcher(b)
            self.paused.discard(b)
            self._note(f"resume fetcher {b}")

    def throttle(self) -> None:
        b = self.rng.randrange(3)
        limit = self.rng.choice([60, 200, 1000])
        self.cluster.throttle_fetcher(b, max_bytes_per_round=limit)
        self.throttled.add(b)
        self._note(f"throttle fetcher {b} to {limit} bytes per round")

    def unthrottle(self) -> None:
        if self.throttled:
            b = self.rng.choice(sorted(self.throttled))
            self.cluster.throttle_fetcher(b, max_bytes_per_round=None)
            self.throttled.discard(b)
            self._note(f"unthrottle fetcher {b}")

    def stop(self) -> None:
        if not self.stopped:  # one broker down at a time: min ISR 2 of RF 3 stays reachable
            b = self.rng.randrange(3)
            self.cluster.stop_broker(b)
            self.stopped.add(b)
            self._note(f"stop broker {b}")

    def start(self) -> None:
        if self.stopped:
            b = self.stopped.pop()
            self.cluster.start_broker(b)
            self.lost.discard(b)
            self._note(f"start broker {b}")

    def lose_disk(self) -> None:
        for b in sorted(self.stopped - self.lost):
            shutil.rmtree(self.cluster.storage.log_path(b), ignore_errors=True)
            self.lost.add(b)
            self._note(f"broker {b} loses its log directory")
            return

    def crash_round(self) -> None:
        k = self.rng.randint(1, 6)
        done = []

        def hook(path, step):
            done.append(step)
            if len(done) == k:
                raise Crash(f"after commit {k} ({step} of {path})")

        self.cluster.storage.after_commit = hook
        self.clock.advance(500)
        try:
            self.cluster.run_round()
            self._note(f"round (a crash after commit {k} was armed; the round made {len(done)})")
        except Crash as crash:
            self._note(f"round killed {crash}")
        finally:
            self.cluster.storage.after_commit = None
        self._note("round (recovers and replays)")
        self._round()

    def preferred(self) -> None:
        self.cluster.elect_preferred_leaders()
        self._note("preferred leader election")

    def reassign(self) -> None:
        topic = self.rng.choice(sorted(self.topics))
        partition = self.rng.randrange(self.topics[topic])
        target = self.rng.sample(range(3), self.rng.randint(2, 3))
        self.cluster.reassign_partitions({(topic, partition): target})
        self._note(f"reassign {topic}-{partition} to {target}")

    def quota(self) -> None:
        rate = self.rng.choice([None, 100, 400, 2000])
        if rate is not None:
            self.cluster.alter_client_quotas({"client-id": CLIENT_ID}, {"producer_byte_rate": rate})
        elif self.quota_rate is not None:
            self.cluster.alter_client_quotas({"client-id": CLIENT_ID}, delete=["producer_byte_rate"])
        self.quota_rate = rate
        self._note(f"producer_byte_rate of client {CLIENT_ID}: {rate}")

    def delete_records(self) -> None:
        topic = self.rng.choice(sorted(self.topics))
        partition = self.rng.randrange(self.topics[topic])
        try:
            start = self.cluster.delete_records(topic, partition, -1)
            self._note(f"delete_records {topic}-{partition} before the HW -> log start {start}")
        except ReplogError as e:
            self._note(f"delete_records {topic}-{partition} refused: {e.code}")

    def create_topic(self) -> None:
        if len(self.topics) < 4:
            name = f"t{len(self.topics)}"
            partitions, rf = self.rng.randint(1, 2), self.rng.randint(2, 3)
            self.cluster.create_topic(name, partitions=partitions, replication_factor=rf)
            self.topics[name] = partitions
            self._note(f"create topic {name} ({partitions} partitions, RF {rf})")

    def read(self) -> None:
        topic = self.rng.choice(sorted(self.topics))
        try:
            served = [(r["partition"], r["offset"]) for r in self.cluster.read(topic).select("partition", "offset").collect()]
        except ReplogError as e:
            self._note(f"read {topic} refused: {e.code}")
            return
        self.checker.check_read(topic, served, self.checker.snapshot())
        self._note(f"read {topic}: {len(served)} records")

    # -- the run -----------------------------------------------------------------------------
    def heal(self, max_rounds: int = 40) -> None:
        """Every fault undone, then rounds until every request has settled."""
        for b in sorted(self.paused):
            self.cluster.resume_fetcher(b)
        for b in sorted(self.throttled):
            self.cluster.throttle_fetcher(b, max_bytes_per_round=None)
        for b in sorted(self.stopped):
            self.cluster.start_broker(b)
        if self.quota_rate is not None:
            self.cluster.alter_client_quotas({"client-id": CLIENT_ID}, delete=["producer_byte_rate"])
        self.paused, self.throttled, self.stopped, self.lost, self.quota_rate = set(), set(), set(), set(), None
        self._note("heal: fetchers resumed and unthrottled, brokers started, the client quota removed")
        for _ in range(max_rounds):
            self._round()
            report = self.cluster._last_report
            if report.pending_requests == 0 and report.active_partitions == 0 and not report.throttled_requests:
                break
        self.checker.check_settled(self.checker.snapshot())

    def run(self, events: int) -> "Soak":
        names, weights = zip(*WEIGHTS.items())
        try:
            for _ in range(events):
                getattr(self, self.rng.choices(names, weights)[0])()
            self.heal()
        except Violation as v:
            raise Violation(v.check, f"seed {self.seed}: {v}\nhistory:\n" + "\n".join(self.history)) from None
        return self
