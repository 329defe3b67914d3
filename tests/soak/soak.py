"""The fault-injection soak: a seeded generator interleaves traffic and faults on a real cluster
(3 brokers, Delta tables on disk) and the independent checker (checker.py) checks the tables after
every round; at the end the cluster heals and every produce request must have settled.

Events: produce with acks 0, 1 or all; idempotent batches and their retries; rounds; clock jumps
(past replica.lag.time.max.ms and broker.session.timeout.ms) and steps back (a round runs no
earlier than the one before it); pause, resume and throttle of a
broker's fetcher; a broker crash and restart; the loss of a stopped broker's log directory; a running
broker's whole storage location deleted or made read-only (each broker has a location of its own,
outside the root; a round halts the broker, as Kafka halts a broker whose log dir failed); a round
killed after a random one of its commits and run again (recovery); preferred leader elections;
delete_records; topic creation; reassignments (KIP-455) of a partition to 2 or 3 of the brokers;
a producer_byte_rate on the client id every produce carries, set, changed or removed (requests wait
for it in the inbox; healing removes it). Topic "unclean" allows unclean leader election (the
checker does not hold it to the guarantees that election gives up).

    python -m tests.soak.run --seed 7 --events 300        (make soak SEED=7 EVENTS=300)

Every event is recorded with its parameters ([name, params], `Soak.events`), so a history, or any
subset of it, replays on a fresh cluster (`Soak.replay`). A violation raises with the seed, the
event history up to it and the recorded events; run.py then minimizes them (shrink.py). The
cluster's own randomness (fetch session ids) is not seeded, so a seed replays the same events, not
always the same ids.
"""

from __future__ import annotations

import random
import re
import time

from pyspark.sql import functions as F

from pipeline import Cluster, ManualClock
from pipeline.errors import ReplogError
from tests.soak.checker import Checker, Expected, Violation
from tests.soak.faults import ACKS, StorageAndProcessFaults

START_MS = 1_700_000_000_000


# event -> weight
WEIGHTS = {
    "produce": 6, "idempotent": 3, "round": 8, "wait": 2, "pause": 1, "resume": 2, "throttle": 1,
    "unthrottle": 1, "stop": 1, "start": 2, "lose_disk": 1, "crash_round": 2, "preferred": 1,
    "delete_records": 1, "create_topic": 1, "read": 2, "reassign": 1, "quota": 1, "clock_back": 1,
    "kill_job": 0.2,  # about 150 s each (three JVMs start): once in 200 events
    "fail_location": 1,
}
CLIENT_ID = "soak"


def crashed(error: Exception) -> Violation:
    """An exception where the soak expects none (a round that failed, a refusal the driver does
    not expect) as a Violation named after its class: the run then prints the history, records the
    seed, saves and minimizes the events (for the same exception class) as for a broken guarantee."""
    lines = [line.strip(": ") for line in str(error).splitlines() if line.strip(": ")] or [repr(error)]
    java = [line for line in lines if re.match(r"[\w.$]+(Exception|Error)\b", line)]  # (Py4J: the Java one)
    return Violation(f"exception {type(error).__name__}", (java or lines)[0][:500])


class Soak(StorageAndProcessFaults):
    weights = WEIGHTS  # the events drawn, with their weights
    config = {"min.insync.replicas": 2, "replica.fetch.max.bytes": 4096}

    def __init__(self, spark, root: str, seed: int):
        self.seed = seed
        self.spark, self.root = spark, root
        self.rng = random.Random(seed)
        self.clock = ManualClock(start_ms=START_MS)
        # each broker on a location of its own, outside the root (Kafka's log.dirs): a failure domain
        self.cluster = Cluster.create(spark, root, brokers=3, clock=self.clock, config=dict(self.config),
                                      broker_dirs={b: f"{root}-disks/{b}" for b in range(3)})
        self.cluster.create_topic("clean", partitions=3, replication_factor=3)
        self.cluster.create_topic("unclean", partitions=2, replication_factor=3,
                                  config={"unclean.leader.election.enable": True})
        self.topics = {"clean": 3, "unclean": 2}
        self.expected = Expected(unclean_topics={"unclean"})
        self.checker = Checker(spark, root, self.expected)
        self.history: list[str] = []
        self.events: list[list] = []  # [name, params] of every event applied, to replay
        self.values = 0
        self.stopped: set[int] = set()
        self.lost: set[int] = set()
        self.failing: dict[int, str] = {}  # broker -> how its location failed ("delete" | "unwritable"), until halted
        self.unwritable: set[int] = set()  # brokers whose location refuses writes (until started or healed)
        self.paused: set[int] = set()
        self.throttled: set[int] = set()
        self.producers: dict[int, dict] = {}  # partition of "clean" -> producer id, epoch, next sequence, last batch
        self.rounds = 0
        self.quota_rate: int | None = None  # the client's producer_byte_rate
        self.last_round_ms: int | None = None

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
        if self.last_round_ms is not None and report.now_ms < self.last_round_ms:
            raise Violation("clock", f"round {report.round_id} ran at {report.now_ms}, before the round before it "
                                     f"({self.last_round_ms})")
        self.last_round_ms = report.now_ms
        self._note(f"  round {report.round_id} at +{report.now_ms - START_MS} ms: appended "
                   f"{report.records_appended}, acked {report.requests_acked}, failed {report.requests_failed}, "
                   f"isr -{report.isr_shrinks}/+{report.isr_expands}, offline {report.offline_partitions}")
        self._halted_by_failure()
        self.after_round(report, self.checker.check())

    def _halted_by_failure(self) -> None:
        """The brokers whose failed location a round has met are stopped now (halted)."""
        if not self.failing:
            return
        states = {r["broker"]: r["state"] for r in self.cluster.core.metadata.broker_rows()}
        for broker, how in sorted(self.failing.items()):
            if states[broker] in ("stopped", "fenced"):
                del self.failing[broker]
                self.stopped.add(broker)
                if how == "delete":
                    self.lost.add(broker)
                self._note(f"  broker {broker} halted: its location failed ({how})")

    def after_round(self, report, snap: dict) -> None:
        """Called after every round that completed, with the checker's snapshot of the tables."""

    def _skip(self, what: str) -> None:
        self._note(f"skipped (does not apply now): {what}")

    def _status(self, request_id: str) -> set:
        return {r["status"] for r in self.cluster.produce_results()
                .filter(F.col("request_id") == request_id).select("status").collect()}

    # -- events: draw_<name>() picks an event's parameters from the seeded RNG and the soak's
    # state (None: nothing to do now); do_<name>(**params) applies them. A recorded event replays
    # through do_ alone, which skips it where it no longer applies (a subset of a history).
    def draw_produce(self) -> dict:
        topic = self.rng.choice(sorted(self.topics))
        acks = self.rng.choice([0, 1, "all"])
        records = [[self.rng.randrange(self.topics[topic]), self._value()] for _ in range(self.rng.randint(1, 4))]
        return {"topic": topic, "acks": acks, "records": records}

    def do_produce(self, topic: str, acks, records: list) -> None:
        if topic not in self.topics or any(p >= self.topics[topic] for p, _ in records):
            return self._skip(f"produce to {topic}")
        rid = self.cluster.produce(topic, [{"value": v, "partition": p} for p, v in records], acks=acks,
                                   client_id=CLIENT_ID)
        self.expected.requests[rid] = (topic, ACKS[acks], [(p, v) for p, v in records])
        self._note(f"produce {topic} acks={acks} {[(p, v) for p, v in records]} -> {rid[:8]}")

    def draw_idempotent(self) -> dict:
        """The next batch of the partition's idempotent producer, as Kafka's producer sends it.
        A batch without an answer yet is retried. An errored batch's sequence is not free: the
        error does not say whether the batch was appended (REQUEST_TIMED_OUT and
        NOT_ENOUGH_REPLICAS_AFTER_APPEND come after the append), and the leader answers a batch
        with the same producer epoch and sequences as a duplicate of the one it holds, whatever its
        values. So the producer retries it, or bumps its epoch and starts again at sequence 0
        (KIP-360). An acked batch is sometimes retried too (a duplicate)."""
        partition = self.rng.randrange(self.topics["clean"])
        p = self.producers.get(partition, {"seq": 0, "epoch": 0, "last": None})
        last = p["last"]
        status = self._status(last[0]) if last else {"acked"}
        if last and "error" in status and self.rng.random() < 0.5:
            return {"partition": partition, "values": self._values(), "base": 0, "kind": "batch",
                    "epoch": p["epoch"] + 1}
        if last and (status != {"acked"} or self.rng.random() < 0.25):
            return {"partition": partition, "values": last[1], "base": last[2], "kind": "retry",
                    "epoch": last[3]}  # the same batch
        return {"partition": partition, "values": self._values(), "base": p["seq"], "kind": "batch",
                "epoch": p["epoch"]}

    def _values(self) -> list[str]:
        return [self._value() for _ in range(self.rng.randint(1, 3))]

    def do_idempotent(self, partition: int, values: list, base: int, kind: str, epoch: int = 0) -> None:
        p = self.producers.setdefault(partition, {"id": 1000 + partition, "seq": 0, "epoch": 0, "last": None})
        records = [{"value": v, "partition": partition, "producer_id": p["id"], "producer_epoch": epoch,
                    "sequence": base + i} for i, v in enumerate(values)]
        rid = self.cluster.produce("clean", records, acks="all", client_id=CLIENT_ID)
        self.expected.requests[rid] = ("clean", -1, [(partition, v) for v in values])
        p["seq"] = base + len(values) if epoch > p["epoch"] else max(p["seq"], base + len(values))
        p["epoch"] = max(p["epoch"], epoch)
        p["last"] = (rid, values, base, epoch)
        self._note(f"idempotent {kind} clean-{partition} pid={p['id']} epoch={epoch} seq={base}.. {values} "
                   f"-> {rid[:8]}")

    def draw_round(self) -> dict:
        return {}

    def do_round(self) -> None:
        self._note("round")
        self._round()

    def draw_wait(self) -> dict:
        return {"ms": self.rng.choice([3_000, 10_000, 35_000])}

    def do_wait(self, ms: int) -> None:
        self._note(f"wait {ms} ms")
        self._round(ms)

    def draw_clock_back(self) -> dict:
        return {"ms": self.rng.choice([1_000, 10_000, 40_000])}

    def do_clock_back(self, ms: int) -> None:
        """The clock steps back (a wall clock corrected by NTP, a job moved to a machine whose clock
        is behind), then a round: it must run no earlier than the round before it."""
        self.clock.rewind(ms)
        self._note(f"the clock steps back {ms} ms")
        self._round(0)

    def draw_pause(self) -> dict | None:
        b = self.rng.choice([b for b in range(3) if b not in self.paused] or [None])
        return None if b is None else {"broker": b}

    def do_pause(self, broker: int) -> None:
        if broker in self.paused:
            return self._skip(f"pause fetcher {broker}")
        self.cluster.pause_fetcher(broker)
        self.paused.add(broker)
        self._note(f"pause fetcher {broker}")

    def draw_resume(self) -> dict | None:
        return {"broker": self.rng.choice(sorted(self.paused))} if self.paused else None

    def do_resume(self, broker: int) -> None:
        if broker not in self.paused:
            return self._skip(f"resume fetcher {broker}")
        self.cluster.resume_fetcher(broker)
        self.paused.discard(broker)
        self._note(f"resume fetcher {broker}")

    def draw_throttle(self) -> dict:
        return {"broker": self.rng.randrange(3), "limit": self.rng.choice([60, 200, 1000])}

    def do_throttle(self, broker: int, limit: int) -> None:
        self.cluster.throttle_fetcher(broker, max_bytes_per_round=limit)
        self.throttled.add(broker)
        self._note(f"throttle fetcher {broker} to {limit} bytes per round")

    def draw_unthrottle(self) -> dict | None:
        return {"broker": self.rng.choice(sorted(self.throttled))} if self.throttled else None

    def do_unthrottle(self, broker: int) -> None:
        if broker not in self.throttled:
            return self._skip(f"unthrottle fetcher {broker}")
        self.cluster.throttle_fetcher(broker, max_bytes_per_round=None)
        self.throttled.discard(broker)
        self._note(f"unthrottle fetcher {broker}")

    def draw_stop(self) -> dict | None:
        return None if self.stopped or self.failing else {"broker": self.rng.randrange(3)}

    def do_stop(self, broker: int) -> None:
        if self.stopped or self.failing:  # one broker down at a time: min ISR 2 of RF 3 stays reachable
            return self._skip(f"stop broker {broker} (broker {min([*self.stopped, *self.failing])} is down)")
        self.cluster.stop_broker(broker)
        self.stopped.add(broker)
        self._note(f"stop broker {broker}")

    def draw_start(self) -> dict | None:
        return {"broker": min(self.stopped)} if self.stopped else None

    def do_start(self, broker: int) -> None:
        if broker not in self.stopped:
            return self._skip(f"start broker {broker}")
        self._location_back(broker)
        try:
            self.cluster.start_broker(broker)
        except ReplogError as e:
            if e.code != "DUPLICATE_BROKER_REGISTRATION":
                raise
            # an empty log's restart waits until a round has fenced the previous incarnation
            return self._note(f"start broker {broker} refused: {e.code}")
        self.stopped.discard(broker)
        self.lost.discard(broker)
        self._note(f"start broker {broker}")


    def draw_preferred(self) -> dict:
        return {}

    def do_preferred(self) -> None:
        self.cluster.elect_preferred_leaders()
        self._note("preferred leader election")

    def draw_reassign(self) -> dict:
        topic = self.rng.choice(sorted(self.topics))
        return {"topic": topic, "partition": self.rng.randrange(self.topics[topic]),
                "target": self.rng.sample(range(3), self.rng.randint(2, 3))}

    def do_reassign(self, topic: str, partition: int, target: list) -> None:
        if partition >= self.topics.get(topic, 0):
            return self._skip(f"reassign {topic}-{partition}")
        self.cluster.reassign_partitions({(topic, partition): target})
        self._note(f"reassign {topic}-{partition} to {target}")

    def draw_quota(self) -> dict:
        return {"rate": self.rng.choice([None, 100, 400, 2000])}

    def do_quota(self, rate: int | None) -> None:
        if rate is not None:
            self.cluster.alter_client_quotas({"client-id": CLIENT_ID}, {"producer_byte_rate": rate})
        elif self.quota_rate is not None:
            self.cluster.alter_client_quotas({"client-id": CLIENT_ID}, delete=["producer_byte_rate"])
        self.quota_rate = rate
        self._note(f"producer_byte_rate of client {CLIENT_ID}: {rate}")

    def draw_delete_records(self) -> dict:
        topic = self.rng.choice(sorted(self.topics))
        return {"topic": topic, "partition": self.rng.randrange(self.topics[topic])}

    def do_delete_records(self, topic: str, partition: int) -> None:
        if partition >= self.topics.get(topic, 0):
            return self._skip(f"delete_records {topic}-{partition}")
        try:
            start = self.cluster.delete_records(topic, partition, -1)
            self._note(f"delete_records {topic}-{partition} before the HW -> log start {start}")
        except ReplogError as e:
            self._note(f"delete_records {topic}-{partition} refused: {e.code}")

    def draw_create_topic(self) -> dict | None:
        if len(self.topics) >= 4:
            return None
        return {"name": f"t{len(self.topics)}", "partitions": self.rng.randint(1, 2),
                "replication_factor": self.rng.randint(2, 3)}

    def do_create_topic(self, name: str, partitions: int, replication_factor: int) -> None:
        if name in self.topics:
            return self._skip(f"create topic {name}")
        self.cluster.create_topic(name, partitions=partitions, replication_factor=replication_factor)
        self.topics[name] = partitions
        self._note(f"create topic {name} ({partitions} partitions, RF {replication_factor})")

    def draw_read(self) -> dict:
        return {"topic": self.rng.choice(sorted(self.topics))}

    def do_read(self, topic: str) -> None:
        if topic not in self.topics:
            return self._skip(f"read {topic}")
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
        for b in sorted(self.unwritable):
            self._location_back(b)
        self._halted_by_failure()
        for b in sorted(self.stopped):
            self._start_when_fenced(b)
        self.failing = {}  # (a read-only location no write met: writable again, its broker never halted)
        if self.quota_rate is not None:
            self.cluster.alter_client_quotas({"client-id": CLIENT_ID}, delete=["producer_byte_rate"])
        self.paused, self.throttled, self.stopped, self.lost, self.quota_rate = set(), set(), set(), set(), None
        self._note("heal: fetchers resumed and unthrottled, brokers started, the client quota removed")
        for _ in range(max_rounds):
            self._round()
            report = self.cluster.core.last_report
            if report.pending_requests == 0 and report.active_partitions == 0 and not report.throttled_requests:
                break
        self.checker.check_settled(self.checker.snapshot())

    def _start_when_fenced(self, broker: int, max_rounds: int = 20) -> None:
        """Starts `broker`; a restart with an empty log refused while its previous incarnation is
        not fenced gets rounds a session timeout apart until one has fenced it (the rounds' time
        may stand still while the clock catches up after stepping back)."""
        for _ in range(max_rounds):
            try:
                return self.cluster.start_broker(broker)
            except ReplogError as e:
                if e.code != "DUPLICATE_BROKER_REGISTRATION":
                    raise
            self._note(f"heal: broker {broker}'s empty-log restart waits for its fencing")
            self._round(self.cluster.core.config["broker.session.timeout.ms"] + 1)
        raise AssertionError(f"broker {broker} was not fenced in {max_rounds} rounds")

    def step(self, name: str, params: dict | None = None) -> None:
        """One event: drawn when `params` is None, else replayed as recorded."""
        if not hasattr(self, f"do_{name}"):
            raise ValueError(f"unknown soak event {name!r} (known: {', '.join(sorted(self.weights))})")
        if params is None:
            params = getattr(self, f"draw_{name}")()
            if params is None:
                return  # nothing to do in this state: no event
        self.events.append([name, params])
        try:
            getattr(self, f"do_{name}")(**params)
        except Violation:
            raise
        except Exception as error:  # noqa: BLE001 - a failure like a broken guarantee (crashed)
            raise crashed(error) from error

    def _failed(self, v: Violation, during_heal: bool) -> Violation:
        failure = Violation(v.check, f"seed {self.seed}: {v}\nhistory:\n" + "\n".join(self.history))
        failure.events, failure.during_heal = list(self.events), during_heal
        return failure

    def run(self, events: int, deadline: float | None = None) -> "Soak":
        """`events` events drawn from the seed, then heal. `deadline` (time.monotonic()): no event
        starts after it, so a time-boxed run (CI's) checks a prefix of the seed's history, which
        `events_run` counts; the same seed with that many events replays it."""
        names, weights = zip(*self.weights.items())
        self.events_run = 0

        def drawn():
            for _ in range(events):
                if deadline is not None and time.monotonic() >= deadline:
                    return
                self.events_run += 1
                yield self.rng.choices(names, weights)[0]
        return self.replay(drawn())

    def replay(self, events, heal: bool = True) -> "Soak":
        """Events in order, each a name (drawn) or [name, params] (recorded), then heal. A
        Violation carries `events` (what ran, recorded, up to the failing one) and `during_heal`."""
        try:
            for event in events:
                self.step(*([event] if isinstance(event, str) else event))
        except Violation as v:
            raise self._failed(v, during_heal=False) from None
        if heal:
            try:
                self.heal()
            except Violation as v:
                raise self._failed(v, during_heal=True) from None
            except Exception as error:  # noqa: BLE001 - see crashed
                raise self._failed(crashed(error), during_heal=True) from error
        return self
