"""A reference model of the replicated log: Kafka's replication rules in plain Python, stepped in
rounds, sharing no code with `pipeline/` (as the checker shares none). The lockstep soak
(lockstep.py) drives it beside a real cluster with the same events and compares every partition's
leader, ISR, HW and LEO (and every follower's HW and every produce request's status) after every
round. Where the two differ, one of them has a rule wrong.

What it models, from Kafka's source (the file each rule comes from is named where it is used):

- brokers: a stop is a crash (no heartbeat, no fetch, no answer); the controller fences a stopped
  broker `broker.session.timeout.ms` after its last heartbeat, and a restarted one registers again
  (its old session ends, then it is unfenced), with leader elections after each change
  (KRaft's ReplicationControlManager and PartitionChangeBuilder: the first live ISR member in
  replica order; the last ISR member is never removed; unclean election only where the topic
  allows it);
- a new leader: its epoch starts at its LEO, it starts from the partition's HW, and it resets its
  followers' fetch state (Replica.resetReplicaState); requests waiting for acks=all fail with
  NOT_LEADER_OR_FOLLOWER (DelayedProduce);
- produce: the leader's checks (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS), offsets from the
  leader's LEO in request order, acks 0 and 1 answered at the append, acks=all once the HW passed
  the request's last offset, or NOT_ENOUGH_REPLICAS_AFTER_APPEND once the ISR is under min ISR;
- fetch: every live follower with a running fetcher fetches at its LEO each round, after
  truncating its log to what it shares with its leader when the leader's epoch is new to it
  (KIP-101/KIP-279: the result is the longest common prefix of the two logs by offset and
  epoch); the leader updates the follower's fetch state (Replica.updateFetchState), expands the
  ISR at the fetch (Partition.maybeExpandIsr, KAFKA-7128), moves the HW
  (Partition.maybeIncrementLeaderHW, frozen under min ISR as Kafka >= 3.7 does), and answers with
  every record from the fetch offset (the model takes the fetch limits as never binding: the
  lockstep soak runs with Kafka's default replica.fetch.max.bytes and records of a few bytes);
- the follow-up: a fetcher whose response from a leader carried records fetches from that leader
  again at once, for all its partitions of that leader (its next iteration), which proves its new
  LEO (DESIGN.md: a produce with acks=all commits in one round);
- ISR shrink after the round's fetches (Partition.maybeShrinkIsr with Replica.isCaughtUp,
  replica.lag.time.max.ms), then the HW again.

Not modelled: fetch sessions (KIP-227), fetch byte limits, quotas and throttles, log start offsets
(delete_records, retention), reassignments, idempotent producers, compaction. The lockstep soak
draws only the events the model covers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NO_LEADER = -1
ACKS_ALL = -1
RUNNING, STOPPED, FENCED, STARTING = "running", "stopped", "fenced", "starting"
ACKED, PENDING, ERROR = "acked", "pending", "error"


@dataclass
class Replica:
    """A replica's log (leader epoch and value of each offset from 0) and what its leader knows of
    it as a follower: the LEO of its last fetch (`fetch_offset`) and Replica.scala's fetch state."""

    log: list = field(default_factory=list)
    hw: int = 0
    validated_epoch: int = 0  # the leader epoch its log was last checked against
    fetch_offset: int = 0
    last_fetch_time_ms: int = 0
    last_fetch_leader_leo: int = 0
    last_caught_up_time_ms: int = 0

    @property
    def leo(self) -> int:
        return len(self.log)

    def is_caught_up(self, leader_leo: int, now_ms: int, lag_ms: int) -> bool:
        """Replica.isCaughtUp."""
        return self.fetch_offset == leader_leo or now_ms - self.last_caught_up_time_ms <= lag_ms

    def update_fetch_state(self, fetch_offset: int, leader_leo: int, now_ms: int) -> None:
        """Replica.updateFetchState."""
        if fetch_offset >= leader_leo:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_leo:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        self.fetch_offset = fetch_offset
        self.last_fetch_leader_leo = leader_leo
        self.last_fetch_time_ms = now_ms


@dataclass
class Partition:
    replicas: list
    min_isr: int
    unclean: bool
    lag_ms: int
    leader: int = NO_LEADER
    leader_epoch: int = 0
    epoch_start: int = 0
    isr: list = field(default_factory=list)
    hw: int = 0
    logs: dict = field(default_factory=dict)  # broker -> Replica

    def leader_replica(self) -> Replica:
        return self.logs[self.leader]


@dataclass
class Request:
    topic: str
    acks: int
    records: list  # [(partition, value)]
    # per partition: status, error code, base offset, last offset
    results: dict = field(default_factory=dict)


class Model:
    def __init__(self, brokers: int = 3, config: dict | None = None) -> None:
        config = config or {}
        self.min_isr = config.get("min.insync.replicas", 1)
        self.lag_ms = config.get("replica.lag.time.max.ms", 30_000)
        self.session_timeout_ms = config.get("broker.session.timeout.ms", 9_000)
        self.brokers = {b: RUNNING for b in range(brokers)}
        self.heartbeat = {b: 0 for b in range(brokers)}
        self.paused: set[int] = set()
        self.partitions: dict[tuple[str, int], Partition] = {}
        self.requests: dict[str, Request] = {}
        self.inbox: list[str] = []  # requests not yet taken by a round
        self.last_round_ms: int | None = None

    # -- admin and faults ------------------------------------------------------------------------
    def create_partition(self, topic: str, partition: int, replicas: list, now_ms: int, unclean: bool = False) -> None:
        """A new partition on `replicas` (the cluster's assignment, which is not a replication rule),
        the first replica leading, every replica in the ISR; its leader starts as a new leader does
        (Replica.resetReplicaState): every follower caught up and last fetched now."""
        self.partitions[(topic, partition)] = Partition(
            replicas=list(replicas), min_isr=self.min_isr, unclean=unclean, lag_ms=self.lag_ms, leader=replicas[0],
            isr=list(replicas), logs={b: Replica(last_fetch_time_ms=now_ms, last_caught_up_time_ms=now_ms)
                                      for b in replicas})

    def produce(self, request_id: str, topic: str, records: list, acks: int) -> None:
        self.requests[request_id] = Request(topic, acks, list(records))
        self.inbox.append(request_id)

    def pause(self, broker: int) -> None:
        self.paused.add(broker)

    def resume(self, broker: int) -> None:
        self.paused.discard(broker)

    def stop(self, broker: int, now_ms: int) -> None:
        """A crash. A running broker's last heartbeat was the last round's (or now, before any);
        one still starting keeps its registration's."""
        if self.brokers[broker] == RUNNING:
            self.heartbeat[broker] = self.last_round_ms if self.last_round_ms is not None else now_ms
        self.brokers[broker] = STOPPED

    def start(self, broker: int, now_ms: int) -> None:
        self.brokers[broker] = STARTING
        self.heartbeat[broker] = now_ms

    # -- the round -------------------------------------------------------------------------------
    def round(self, now_ms: int) -> None:
        changed = self._controller(now_ms)
        down = {b for b, s in self.brokers.items() if s in (STOPPED, FENCED)}
        fetching = {b for b in self.brokers if b not in down and b not in self.paused}
        new = self._append(down)
        for key in changed:
            self._fail_waiting(key, new)
        follow_ups = set()
        for p in self.partitions.values():
            follow_ups |= self._fetch(p, fetching, down, now_ms)
        for p in self.partitions.values():
            self._follow_up(p, follow_ups, down, now_ms)
            self._shrink(p, down, now_ms)
        self._acks()
        for b, s in self.brokers.items():
            if s == STARTING:
                self.brokers[b] = RUNNING
        self.last_round_ms = now_ms

    def _controller(self, now_ms: int) -> set:
        """Fences the stopped brokers whose session expired and unfences the restarted ones, with an
        election after each step (handleBrokerFenced, then handleBrokerUnfenced). Returns the
        partitions whose leader changed in either election."""
        expired = [b for b, s in self.brokers.items()
                   if s == STOPPED and self.heartbeat[b] + self.session_timeout_ms < now_ms]
        starting = [b for b, s in self.brokers.items() if s == STARTING]
        if not expired and not starting:
            return set()
        for b in expired:
            self.brokers[b] = FENCED
        fenced = {b for b, s in self.brokers.items() if s == FENCED}
        before = {key: (p.leader, p.leader_epoch) for key, p in self.partitions.items()}
        changed = self._elect({b for b in self.brokers if b not in fenced and b not in starting})
        changed |= self._elect({b for b in self.brokers if b not in fenced})
        for key, p in self.partitions.items():
            old_leader, old_epoch = before[key]
            if p.leader == NO_LEADER or p.leader_epoch == old_epoch:
                continue
            leader = p.leader_replica()
            p.epoch_start = leader.leo  # a new epoch starts at its leader's LEO
            leader.validated_epoch = p.leader_epoch
            if p.leader != old_leader:
                self._new_leader(p, now_ms)
        return changed

    def _elect(self, live: set) -> set:
        """One election over every partition with the `live` brokers. Returns the partitions whose
        leader changed."""
        changed = set()
        for key, p in self.partitions.items():
            kept = [b for b in p.isr if b in live]
            isr = kept or list(p.isr)  # the last ISR member stays
            if p.leader != NO_LEADER and p.leader in isr and p.leader in live:
                leader = p.leader
            else:
                clean = [b for b in p.replicas if b in isr and b in live]
                alive = [b for b in p.replicas if b in live]
                if clean:
                    leader = clean[0]
                elif p.unclean and alive:
                    leader, isr = alive[0], [alive[0]]
                else:
                    leader = NO_LEADER
            if leader != p.leader:
                p.leader_epoch += 1
                changed.add(key)
            p.leader, p.isr = leader, isr
        return changed

    def _new_leader(self, p: Partition, now_ms: int) -> None:
        """A broker taking over leadership: its HW is the partition's (no more than its LEO), and it
        resets its followers' fetch state (Replica.resetReplicaState): ISR members caught up now,
        the others never; what it knows of their LEO is at most the HW."""
        leader = p.leader_replica()
        p.hw = min(p.hw, leader.leo)
        leader.hw = p.hw
        for b, r in p.logs.items():
            if b == p.leader:
                continue
            since = now_ms if b in p.isr else 0
            r.last_caught_up_time_ms = r.last_fetch_time_ms = since
            r.last_fetch_leader_leo = leader.leo
            r.fetch_offset = min(r.fetch_offset, p.hw)

    def _append(self, down: set) -> list:
        """The new requests in order: refused whole, or appended to the leader at its LEO with its
        epoch (Partition.appendRecordsToLeader). Returns their ids."""
        new, self.inbox = self.inbox, []
        for rid in new:
            req = self.requests[rid]
            by_partition: dict[int, list] = {}
            for partition, value in req.records:
                by_partition.setdefault(partition, []).append(value)
            for partition, values in by_partition.items():
                p = self.partitions.get((req.topic, partition))
                if p is None:
                    req.results[partition] = (ERROR, "UNKNOWN_TOPIC_OR_PARTITION", None, None)
                elif p.leader == NO_LEADER or p.leader in down:
                    req.results[partition] = (ERROR, "NOT_LEADER_OR_FOLLOWER", None, None)
                elif req.acks == ACKS_ALL and len(p.isr) < p.min_isr:
                    req.results[partition] = (ERROR, "NOT_ENOUGH_REPLICAS", None, None)
                else:
                    log = p.leader_replica().log
                    base = len(log)
                    log.extend((p.leader_epoch, v) for v in values)
                    req.results[partition] = (PENDING, None, base, len(log) - 1)
        return new

    def _fail_waiting(self, key: tuple, new: list) -> None:
        """DelayedProduce on a leader change: acks=all requests still waiting fail."""
        topic, partition = key
        for rid, req in self.requests.items():
            result = req.results.get(partition)
            if req.topic == topic and rid not in new and result and result[0] == PENDING and req.acks == ACKS_ALL:
                req.results[partition] = (ERROR, "NOT_LEADER_OR_FOLLOWER", result[2], result[3])

    def _serving(self, p: Partition, down: set) -> bool:
        return p.leader != NO_LEADER and p.leader not in down

    def _high_watermark(self, p: Partition, down: set, now_ms: int) -> None:
        """Partition.maybeIncrementLeaderHW: the smallest LEO of the leader, the ISR and the
        caught-up replicas that may join it; never back, and frozen while the ISR is smaller than
        min(min.insync.replicas, replicas)."""
        leader = p.leader_replica()
        if len(p.isr) < min(p.min_isr, len(p.replicas)):
            return
        candidates = [leader.leo]
        for b, r in p.logs.items():
            if b == p.leader:
                continue
            if b in p.isr or (b not in down and r.is_caught_up(leader.leo, now_ms, p.lag_ms)):
                candidates.append(r.fetch_offset)
        p.hw = max(p.hw, min(candidates))
        leader.hw = p.hw

    def _fetch_at(self, p: Partition, b: int, down: set, now_ms: int) -> None:
        """One fetch by follower `b` at its LEO: its fetch state, then the ISR expansion the leader
        makes at it (Partition.maybeExpandIsr: the fetch offset reached the HW and the start of the
        leader's epoch), then the HW."""
        r, leader = p.logs[b], p.leader_replica()
        r.update_fetch_state(r.leo, leader.leo, now_ms)
        if b not in p.isr and r.fetch_offset >= p.hw and r.fetch_offset >= p.epoch_start:
            p.isr = [x for x in p.replicas if x in p.isr or x == b]

    def _fetch(self, p: Partition, fetching: set, down: set, now_ms: int) -> set:
        """Every follower's fetch of the round, then their responses. Returns the (follower, leader)
        fetchers that received records."""
        if not self._serving(p, down):
            return set()
        leader = p.leader_replica()
        followers = [b for b in p.replicas if b != p.leader and b in fetching]
        for b in followers:
            r = p.logs[b]
            if r.validated_epoch != p.leader_epoch:  # KIP-101/KIP-279: truncate to what it shares
                common = 0
                while common < min(r.leo, leader.leo) and r.log[common][0] == leader.log[common][0]:
                    common += 1
                del r.log[common:]
                r.hw = min(r.hw, r.leo)
                r.validated_epoch = p.leader_epoch
        for b in followers:
            self._fetch_at(p, b, down, now_ms)
        self._high_watermark(p, down, now_ms)
        got = set()
        for b in followers:
            r = p.logs[b]
            if r.leo < leader.leo:
                r.log.extend(leader.log[r.leo:])
                got.add((b, p.leader))
            r.hw = min(p.hw, r.leo)
        return got

    def _follow_up(self, p: Partition, follow_ups: set, down: set, now_ms: int) -> None:
        if not self._serving(p, down):
            return
        followers = [b for b in p.replicas if (b, p.leader) in follow_ups]
        for b in followers:
            self._fetch_at(p, b, down, now_ms)
        self._high_watermark(p, down, now_ms)
        for b in followers:
            p.logs[b].hw = min(p.hw, p.logs[b].leo)

    def _shrink(self, p: Partition, down: set, now_ms: int) -> None:
        """Partition.maybeShrinkIsr on the state after the round's fetches, then the HW."""
        if not self._serving(p, down):
            return
        leader = p.leader_replica()
        out = [b for b in p.isr if b != p.leader and not p.logs[b].is_caught_up(leader.leo, now_ms, p.lag_ms)]
        if out:
            p.isr = [b for b in p.isr if b not in out]
        self._high_watermark(p, down, now_ms)

    def _acks(self) -> None:
        for req in self.requests.values():
            for partition, (status, code, base, last) in list(req.results.items()):
                if status != PENDING:
                    continue
                p = self.partitions[(req.topic, partition)]
                if req.acks != ACKS_ALL:
                    req.results[partition] = (ACKED, None, base, last)
                elif len(p.isr) < p.min_isr:
                    req.results[partition] = (ERROR, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", base, last)
                elif p.hw > last:
                    req.results[partition] = (ACKED, None, base, last)

    # -- what the lockstep compares --------------------------------------------------------------
    def view(self) -> dict:
        """Per partition: leader, ISR (sorted), the leader's HW (None when offline) and each
        replica's LEO and HW; per (request, partition): status and error code."""
        partitions = {}
        for key, p in self.partitions.items():
            partitions[key] = {
                "leader": p.leader, "isr": sorted(p.isr),
                "hw": p.hw if p.leader != NO_LEADER else None,
                "leo": {b: r.leo for b, r in p.logs.items()},
                "replica_hw": {b: r.hw for b, r in p.logs.items()},
            }
        results = {(rid, req.topic, partition): (status, code)
                   for rid, req in self.requests.items() for partition, (status, code, _, _) in req.results.items()}
        return {"partitions": partitions, "results": results}
