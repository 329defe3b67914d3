"""The lockstep soak: the soak's events on a real cluster and on the reference model (model.py) at
once, comparing them after every round: every partition's leader, ISR, HW (the leader's), every
replica's LEO and HW, and every produce request's status and error code. A difference raises a
Violation of check "model" (shrunk and replayed as any soak violation), naming the partition or
request, both sides' values and the history.

    python -m tests.soak.run --model --seed 7 --events 300        (make soak-model SEED=7)

It draws only the events the model covers (model.py says which): produce with acks 0, 1 and all,
rounds, clock jumps forward and back, a fetcher paused and resumed, a broker stopped and started, a round killed
after one of its commits and replayed, topics created, reads. It runs with Kafka's default fetch
limits (replica.fetch.max.bytes 1 MiB), which records of a few bytes never reach.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from tests.soak.checker import Violation
from tests.soak.model import Model
from tests.soak.soak import ACKS, START_MS, WEIGHTS, Soak

MODEL_EVENTS = ("produce", "round", "wait", "clock_back", "pause", "resume", "stop", "start", "crash_round",
                "create_topic", "read")


class Lockstep(Soak):
    weights = {name: WEIGHTS[name] for name in MODEL_EVENTS}
    config = {"min.insync.replicas": 2}

    def __init__(self, spark, root: str, seed: int):
        super().__init__(spark, root, seed)
        self.model = Model(brokers=3, config=self.config)
        self._add_partitions(self.checker.snapshot())
        self.compared_rounds = 0
        self.model_round = 0  # the newest round the model has stepped

    def _add_partitions(self, snap: dict) -> None:
        """The partitions the cluster holds that the model does not yet, on the same replicas (the
        assignment is the cluster's, not a replication rule)."""
        for (topic, partition), p in sorted(snap["partitions"].items()):
            if (topic, partition) not in self.model.partitions:
                self.model.create_partition(topic, partition, list(p["replicas"]), self._admin_now_ms(),
                                            unclean=topic in self.expected.unclean_topics)

    def _admin_now_ms(self) -> int:
        """The time the cluster stamps an admin change with: its clock, never before the last
        round's time (a clock that stepped back)."""
        return max(self.clock.now_ms(), self.last_round_ms or 0)

    # -- events, mirrored into the model ------------------------------------------------------
    def do_produce(self, topic: str, acks, records: list) -> None:
        known = set(self.expected.requests)
        super().do_produce(topic, acks, records)
        for rid in set(self.expected.requests) - known:
            self.model.produce(rid, topic, [(p, v) for p, v in records], ACKS[acks])

    def do_pause(self, broker: int) -> None:
        super().do_pause(broker)
        if broker in self.paused:
            self.model.pause(broker)

    def do_resume(self, broker: int) -> None:
        super().do_resume(broker)
        if broker not in self.paused:
            self.model.resume(broker)

    def do_stop(self, broker: int) -> None:
        was = set(self.stopped)
        super().do_stop(broker)
        if broker in self.stopped - was:
            self.model.stop(broker, self.clock.now_ms())

    def do_start(self, broker: int) -> None:
        was = set(self.stopped)
        super().do_start(broker)
        if broker in was - self.stopped:
            self.model.start(broker, self._admin_now_ms())

    def do_create_topic(self, name: str, partitions: int, replication_factor: int) -> None:
        super().do_create_topic(name, partitions, replication_factor)
        self._add_partitions(self.checker.snapshot())

    def heal(self, max_rounds: int = 40) -> None:
        for b in sorted(self.paused):
            self.model.resume(b)
        for b in sorted(self.stopped):
            self.model.start(b, self._admin_now_ms())
        super().heal(max_rounds)

    # -- the comparison -----------------------------------------------------------------------
    def after_round(self, report, snap: dict) -> None:
        # a round "killed" after its last commit had completed (its rounds row landed): the model
        # steps it too, at its time, before this one
        for r in (self.cluster.rounds().filter((F.col("round_id") > self.model_round)
                                               & (F.col("round_id") < report.round_id))
                  .orderBy("round_id").select("now_ms").collect() if report.round_id > self.model_round + 1 else []):
            self.model.round(r["now_ms"])
        self.model.round(report.now_ms)
        self.model_round = report.round_id
        self.compared_rounds += 1
        differences = compare(self.model.view(), snap)
        if differences:
            raise Violation("model", f"round {report.round_id} at +{report.now_ms - START_MS} ms, the "
                                     f"cluster (tables) and the model differ:\n  " + "\n  ".join(differences[:20]))


def cluster_view(snap: dict) -> dict:
    """The checker's snapshot of the tables in the model's view's shape."""
    partitions = {}
    for (topic, partition), p in snap["partitions"].items():
        replicas = {b: snap["state"].get((topic, partition, b)) for b in p["replicas"]}
        leader = replicas.get(p["leader"])
        partitions[(topic, partition)] = {
            "leader": p["leader"], "isr": sorted(p["isr"]),
            "hw": leader["high_watermark"] if leader and p["leader"] >= 0 else None,
            "leo": {b: s["log_end_offset"] if s else None for b, s in replicas.items()},
            "replica_hw": {b: s["high_watermark"] if s else None for b, s in replicas.items()},
        }
    results = {key: (r["status"], r["error_code"]) for key, r in snap["results"].items()}
    return {"partitions": partitions, "results": results}


def compare(model: dict, snap: dict) -> list[str]:
    """What differs between the model's view and the tables', one line each."""
    real = cluster_view(snap)
    out = []
    for key in sorted(set(model["partitions"]) | set(real["partitions"])):
        m, r = model["partitions"].get(key), real["partitions"].get(key)
        name = f"{key[0]}-{key[1]}"
        if m is None or r is None:
            out.append(f"{name}: only {'the cluster' if m is None else 'the model'} has it")
            continue
        for field in ("leader", "isr", "hw", "leo", "replica_hw"):
            if m[field] != r[field]:
                out.append(f"{name} {field}: cluster {r[field]}, model {m[field]}")
    for key in sorted(model["results"]):
        if real["results"].get(key) != model["results"][key]:
            out.append(f"request {key[0][:8]} {key[1]}-{key[2]}: cluster {real['results'].get(key)}, "
                       f"model {model['results'][key]}")
    return out
