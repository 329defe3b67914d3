"""The soak's checker: reads a cluster's Delta tables straight from their paths and checks the
guarantees of a replicated log. It shares no code with `pipeline/` on purpose: what it knows is the
table layout (<root>/cluster/<table>, each broker's log under the location the brokers table names)
and the column names, so a bug in
the pipeline's own reading code cannot hide a bug in what the pipeline wrote.

Checked after every round (Violation names the check and the evidence):

- acked: every acks=all request acknowledged on a clean topic (unclean leader election off) has
  each of its records on the partition's leader at the offset acknowledged (unless delete_records
  or retention removed it: below the leader's log start offset);
- duplicates: no replica holds an offset twice, and no produced value appears twice in a replica;
- diverged: two replicas of a clean topic hold the same records below min(their HWs);
- hw_back: a clean topic's HW (the leader's) never moves back;
- gap: every replica holds every offset from its log start offset to its LEO, nothing above;
- isr: a partition's leader is in its ISR;
- unclean: no leader is elected from outside the ISR on a clean topic (the ISR before the election's
  round: for rounds another process ran between two checks, read from the partitions table's
  history);
- read: a read_committed reader was never served an offset at or above the HW (`check_read`).

`check_settled` at the end: every produce request with acks 1 or all ended acked or failed.
"""

from __future__ import annotations

import copy
import json
import os
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field


class Violation(AssertionError):
    def __init__(self, check: str, detail: str):
        super().__init__(f"[{check}] {detail}")
        self.check = check


@dataclass
class Expected:
    """What the soak's driver sent: per request, its acks and its records' (partition, value) in
    order; the topics whose unclean leader election is on."""

    requests: dict = field(default_factory=dict)  # request_id -> (topic, acks, [(partition, value)])
    unclean_topics: set = field(default_factory=set)


class Checker:
    reads_at_once = 8  # the snapshot's reads in flight at once (1: one after another; jobs/profile_soak.py)

    def __init__(self, spark, root: str, expected: Expected):
        self.spark, self.root, self.expected = spark, root, expected
        self.last_hw: dict[tuple[str, int], int] = {}
        self.last_isr: dict[tuple[str, int], list[int]] = {}
        self.checked_elections = 0
        self.checked_round: int | None = None  # the newest round at the last check
        self._last: tuple | None = None  # (the tables' commit keys before the last snapshot's reads, that snapshot)

    # -- reading (by path) -----------------------------------------------------------------
    def _table(self, name: str):
        return self.spark.read.format("delta").load(os.path.join(self.root, "cluster", name))

    def _brokers(self) -> list:
        return self._table("brokers").select("broker", "path", "state").collect()

    def not_running(self, brokers: list | None = None) -> set[int]:
        """The brokers that are stopped, fenced or starting (a null state is a running broker's, from
        before states)."""
        return {r["broker"] for r in brokers or self._brokers() if r["state"] not in (None, "running")}

    def log_paths(self, brokers: list | None = None) -> dict[int, str]:
        """Each broker's log: `log` under its location, which the brokers table's `path` names (a
        path relative to the root: the default location, <root>/brokers/<id>)."""
        return {r["broker"]: os.path.join(self.root, r["path"], "log")  # (an absolute path stays as it is)
                for r in brokers or self._brokers()}

    def _log_rows(self, path: str) -> list:
        if not os.path.exists(os.path.join(path, "_delta_log")):
            return []  # a lost disk: the broker is down and holds nothing
        return self.spark.read.format("delta").load(path).select(
            "topic", "partition", "offset", "leader_epoch", "value").collect()

    def _newest(self, table: str, keys: tuple[str, ...], columns: tuple[str, ...]) -> dict:
        """An appended-to table's current rows by key: each key's row with the largest round_id."""
        rows = {}
        for r in self._table(table).select(*keys, *columns, "round_id").collect():
            key = tuple(r[k] for k in keys)
            if key not in rows or rows[key]["round_id"] < r["round_id"]:
                rows[key] = r.asDict()
        return rows

    @staticmethod
    def _commit_files(log: str) -> list[str]:
        """The names of a Delta log's commit files (`<version>.json`), oldest first."""
        return sorted(n for n in os.listdir(log) if n.endswith(".json") and n[:-5].isdigit())

    @classmethod
    def _commit_key(cls, path: str) -> tuple | None:
        """The table's newest commit file as the file system has it (version, inode, change time):
        another commit, or the table deleted and made again, changes it. None: no table there."""
        log = os.path.join(path, "_delta_log")
        try:
            newest = max(cls._commit_files(log), default=None)
            info = os.stat(os.path.join(log, newest)) if newest else None
        except FileNotFoundError:
            return None
        return newest and (newest, info.st_ino, info.st_ctime_ns, info.st_mtime_ns)

    def _log_keys(self, paths: dict[int, str]) -> tuple:
        return tuple(sorted((broker, path, self._commit_key(path)) for broker, path in paths.items()))

    def _table_keys(self) -> tuple:
        """The commit keys of the cluster tables a snapshot reads, but the rounds table (an idle
        round appends its row there and nothing else)."""
        return tuple(self._commit_key(os.path.join(self.root, "cluster", t))
                     for t in ("partitions", "replica_state", "results", "elections", "brokers"))

    def snapshot(self, fresh: bool = False) -> dict:
        """Every table the checks read. They are read again only when one has a commit since the
        last snapshot's reads began (or `fresh`): their commit keys come from the file system, and
        an idle round or a read commits to none of them, so the same reads would return the same
        rows. The newest round then stays the last snapshot's, which `check` takes for the last
        one it saw: an election after it is checked against the partitions table's history
        (isr_before_round), as for rounds another process ran.
        The reads are independent, so they run at once from threads (Spark runs their jobs side by
        side): each is mostly the driver's latency, and one after another they take about twice as
        long (jobs/profile_soak.py)."""
        if self._last is not None and not fresh:
            keys, snap = self._last
            if (self._table_keys(), self._log_keys(snap["paths"])) == keys:
                return copy.deepcopy(snap)
        tables = self._table_keys()  # (before the reads: a commit during them makes the next snapshot read)
        snap, logs = self._read_snapshot()
        self._last = ((tables, logs), copy.deepcopy(snap))
        return snap

    def _read_snapshot(self) -> tuple[dict, tuple]:
        """The snapshot, read, and its logs' commit keys from before their reads."""
        with ThreadPoolExecutor(max_workers=self.reads_at_once) as pool:
            partitions = pool.submit(lambda: {(r["topic"], r["partition"]): r.asDict()
                                              for r in self._table("partitions").collect()})
            state = pool.submit(self._newest, "replica_state", ("topic", "partition", "broker"),
                                ("log_start_offset", "log_end_offset", "high_watermark"))
            results = pool.submit(self._newest, "results", ("request_id", "topic", "partition"),
                                  ("base_offset", "status", "error_code"))
            elections = pool.submit(lambda: sorted((r.asDict() for r in self._table("elections").collect()),
                                                   key=lambda e: (e["round_id"], e["topic"], e["partition"])))
            newest = pool.submit(lambda: self._table("rounds").selectExpr("max(round_id)").first()[0])
            brokers = self._brokers()  # (read once: the logs' locations and the brokers' states)
            paths = self.log_paths(brokers)
            log_keys = self._log_keys(paths)
            rows = {broker: pool.submit(self._log_rows, path) for broker, path in paths.items()}
        present = {b for b, path in paths.items() if os.path.exists(os.path.join(path, "_delta_log"))}
        logs = defaultdict(list)  # (topic, partition, broker) -> [(offset, epoch, value)]
        for broker in sorted(rows):
            for r in rows[broker].result():
                value = bytes(r["value"]).decode() if r["value"] is not None else None
                logs[(r["topic"], r["partition"], broker)].append((r["offset"], r["leader_epoch"], value))
        for held in logs.values():
            held.sort()
        return {"partitions": partitions.result(), "state": state.result(), "logs": logs, "results": results.result(),
                "elections": elections.result(), "present": present, "round": newest.result(),
                "not_running": self.not_running(brokers), "paths": paths}, log_keys

    def isr_before_round(self, round_id: int) -> dict[tuple[str, int], list[int]]:
        """Every partition's ISR as it stood before round `round_id` wrote anything: the partitions
        table at the version before its first commit tagged with that round or a later one (Delta
        time travel). For rounds the checker did not see, as another process's (the job's)."""
        log = os.path.join(self.root, "cluster", "partitions", "_delta_log")
        before = None
        for name in self._commit_files(log):
            with open(os.path.join(log, name)) as f:
                info = next((json.loads(line)["commitInfo"] for line in f if line.startswith('{"commitInfo"')), {})
            meta = info.get("userMetadata") or ""
            if meta.startswith("replog-round=") and int(meta.split("=", 1)[1].split(";", 1)[0]) >= round_id:
                break
            before = int(name[:-5])
        table = self.spark.read.format("delta").option("versionAsOf", before).load(os.path.dirname(log))
        return {(r["topic"], r["partition"]): list(r["isr"]) for r in table.select("topic", "partition", "isr").collect()}

    # -- the checks --------------------------------------------------------------------------
    def check(self, snap: dict | None = None) -> dict:
        snap = snap or self.snapshot()
        parts, state, logs = snap["partitions"], snap["state"], snap["logs"]
        clean = lambda topic: topic not in self.expected.unclean_topics  # noqa: E731

        for (topic, partition), p in parts.items():
            if p["leader"] >= 0 and p["leader"] not in p["isr"]:
                raise Violation("isr", f"{topic}-{partition}: leader {p['leader']} not in ISR {p['isr']}")

        # A broker that does not run is not held to its replica rows: a replica moved off it, or
        # back onto it, while it was down keeps its old records until the broker starts and deletes
        # them (Kafka's stray replicas, deleted as a broker starts), and nothing writes its log
        # meanwhile. It is held to them again from the round that brings it back.
        reconciled = lambda key: key in state and key[2] not in snap.get("not_running", ())  # noqa: E731
        for key, rows in logs.items():
            offsets = [o for o, _, _ in rows]
            if reconciled(key) and any(o >= state[key]["log_end_offset"] for o in offsets):
                raise Violation("gap", f"{key}: holds offsets at or above its LEO {state[key]['log_end_offset']}")
            if len(offsets) != len(set(offsets)):
                dup = sorted(o for o in set(offsets) if offsets.count(o) > 1)
                raise Violation("duplicates", f"{key}: offsets held twice: {dup[:10]}")
            values = [v for _, _, v in rows if v is not None]
            if len(values) != len(set(values)):
                raise Violation("duplicates", f"{key}: a value appears twice")
        for key, s in state.items():
            if key[2] not in snap["present"] or not reconciled(key):
                continue
            held = [o for o, _, _ in logs.get(key, []) if o >= s["log_start_offset"]]
            expected = list(range(s["log_start_offset"], s["log_end_offset"]))
            if held != expected:
                raise Violation("gap", f"{key}: holds {held[:20]}... where [{s['log_start_offset']}, "
                                       f"{s['log_end_offset']}) is expected")

        by_partition = defaultdict(list)
        for (topic, partition, broker), s in state.items():
            if broker in snap["present"]:
                by_partition[(topic, partition)].append((broker, s))
        for (topic, partition), replicas in by_partition.items():
            p = parts.get((topic, partition))
            if p is None or not clean(topic):
                continue
            if p["leader"] >= 0:
                hw = state[(topic, partition, p["leader"])]["high_watermark"]
                before = self.last_hw.get((topic, partition))
                if before is not None and hw < before:
                    raise Violation("hw_back", f"{topic}-{partition}: HW {before} -> {hw}")
                self.last_hw[(topic, partition)] = hw
            for i, (a, sa) in enumerate(replicas):
                for b, sb in replicas[i + 1:]:
                    lo = max(sa["log_start_offset"], sb["log_start_offset"])
                    hi = min(sa["high_watermark"], sb["high_watermark"])
                    ra = [r for r in logs.get((topic, partition, a), []) if lo <= r[0] < hi]
                    rb = [r for r in logs.get((topic, partition, b), []) if lo <= r[0] < hi]
                    if ra != rb:
                        raise Violation("diverged", f"{topic}-{partition}: brokers {a} and {b} differ in [{lo}, {hi})")

        unseen = {}  # round -> the ISRs before it, for rounds after the one checked last and before this one
        for e in snap["elections"][self.checked_elections:]:
            if clean(e["topic"]):
                if e["election"] == "unclean":
                    raise Violation("unclean", f"unclean election on clean topic: {e}")
                isr_before = self.last_isr.get((e["topic"], e["partition"]))
                if self.checked_round is not None and e["round_id"] > self.checked_round + 1:
                    if e["round_id"] not in unseen:
                        unseen[e["round_id"]] = self.isr_before_round(e["round_id"])
                    isr_before = unseen[e["round_id"]].get((e["topic"], e["partition"]))
                if e["leader"] >= 0 and isr_before is not None and e["leader"] not in isr_before:
                    raise Violation("unclean", f"{e['topic']}-{e['partition']}: leader {e['leader']} elected from "
                                               f"outside the ISR {isr_before}: {e}")
        self.checked_elections = len(snap["elections"])
        self.last_isr = {k: list(p["isr"]) for k, p in parts.items()}
        self.checked_round = snap["round"]

        for request_id, (topic, acks, records) in self.expected.requests.items():
            if acks != -1 or not clean(topic):
                continue
            by_p = defaultdict(list)
            for partition, value in records:
                by_p[partition].append(value)
            for partition, values in by_p.items():
                result = snap["results"].get((request_id, topic, partition))
                if result is None or result["status"] != "acked":
                    continue
                p = parts[(topic, partition)]
                if p["leader"] < 0 or p["leader"] not in snap["present"]:
                    continue  # offline, or a stopped leader whose disk is gone: its successor is checked
                leader = {o: v for o, _, v in logs.get((topic, partition, p["leader"]), [])}
                lso = state[(topic, partition, p["leader"])]["log_start_offset"]
                for i, value in enumerate(values):
                    offset = result["base_offset"] + i
                    if offset >= lso and leader.get(offset) != value:
                        raise Violation("acked", f"request {request_id} acked {value!r} at {topic}-{partition} "
                                                 f"offset {offset}; the leader {p['leader']} holds "
                                                 f"{leader.get(offset)!r} there")
        return snap

    def check_read(self, topic: str, served: list[tuple[int, int]], snap: dict) -> None:
        """`served`: (partition, offset) a read_committed reader got; none may be at or above the
        leader's HW."""
        for partition, offset in served:
            p = snap["partitions"][(topic, partition)]
            hw = snap["state"][(topic, partition, p["leader"])]["high_watermark"] if p["leader"] >= 0 else 0
            if offset >= hw:
                raise Violation("read", f"{topic}-{partition}: read_committed served offset {offset}, HW {hw}")

    def check_settled(self, snap: dict) -> None:
        for request_id, (topic, acks, records) in self.expected.requests.items():
            if acks == 0:
                continue
            for partition in {p for p, _ in records}:
                result = snap["results"].get((request_id, topic, partition))
                status = result["status"] if result else None
                if status not in ("acked", "error"):
                    raise Violation("settled", f"request {request_id} ({topic}-{partition}, acks {acks}) ended "
                                               f"{status!r} after the cluster healed")
