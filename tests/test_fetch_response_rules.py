"""What a fetch response carries (pipeline/control/fetch_response.py and replication_quota.py), with
the numbers of the round before v2's record-level tests: a record is a batch of one here. No Spark."""

import random

import numpy as np

from pipeline.control.fetch_response import batches_taken
from pipeline.control.replication_quota import UNLIMITED, within_replication_quotas
from pipeline.control.replication import RECORD_OVERHEAD_BYTES

A = np.array
SIZE = RECORD_OVERHEAD_BYTES + 10  # a record of a 10-byte value


def fetches_of(counts):
    """batch_fetch for fetches of `counts` records each (in request order)."""
    return np.repeat(np.arange(len(counts)), counts)


def test_the_response_limit_serves_partitions_in_fetch_order_and_cuts_the_one_that_does_not_fit():
    # one request of four partitions, in its order: p0 (3 records from 0), p2 (2 from offset 1),
    # then p3 and p1 (returned data in earlier rounds: the back); 5 records fit the response
    counts = [3, 2, 3, 3]
    taken = batches_taken(A([0] * 4), A([10 * SIZE] * 4), fetches_of(counts), A([SIZE] * sum(counts)), 5 * SIZE)
    assert taken.tolist() == [True] * 5 + [False] * 6


def test_the_first_record_of_a_response_goes_even_over_both_limits():
    # follower 1: limits of 1 byte, p0 and p1 two records each: p0's first record only
    taken = batches_taken(A([0, 0]), A([1, 1]), fetches_of([2, 2]), A([SIZE] * 4), 1)
    assert taken.tolist() == [True, False, False, False]
    # follower 2: p0's last record fills its response, p1 waits
    taken = batches_taken(A([0, 0]), A([10 * SIZE] * 2), fetches_of([1, 2]), A([SIZE] * 3), SIZE + 1)
    assert taken.tolist() == [True, False, False]


def quotas(counts, leader, broker, throttled, budget):
    unit_fetch = fetches_of(counts)
    taken = np.ones(len(unit_fetch), dtype=bool)
    allowed = within_replication_quotas(taken, unit_fetch, A([SIZE] * len(unit_fetch)), A(leader), A(broker),
                                        (A(throttled[0]), A(throttled[1])), (A(budget[0]), A(budget[1])))
    return [int(allowed[unit_fetch == f].sum()) for f in range(len(counts))]


def test_throttled_partitions_share_their_brokers_budgets_and_in_sync_ones_are_never_held_back():
    # leader 0, four records a partition; follower 1 fetches p0 (in sync, not throttled) and p1
    # (throttled on both sides), follower 2 p2 (leader-throttled) and p3 (follower-throttled);
    # leader 0's budget 3 records, follower 1's 5, follower 2's 2
    taken = quotas([4, 4, 4, 4], leader=[0] * 4, broker=[1, 1, 2, 2],
                   throttled=([False, True, True, False], [False, True, False, True]),
                   budget=([3 * SIZE] * 4, [5 * SIZE, 5 * SIZE, 2 * SIZE, 2 * SIZE]))
    # p0 all 4; p1 3 of leader 0's budget; p2: those 3 are spent; p3: 2 of follower 2's
    assert taken == [4, 3, 0, 2]


def test_a_throttled_record_larger_than_the_budget_waits():
    assert quotas([1], leader=[0], broker=[1], throttled=([False], [True]), budget=([UNLIMITED], [SIZE - 1])) == [0]


def _read_plainly(fetches, records):
    """Kafka's readFromLocalLog read plainly, request by request: partitions in the request's
    order, each from its fetch offset while its records stay within min(partition max bytes, the
    bytes the response has left); until a partition has returned data, its first record goes in
    any case (KIP-74); the bytes read come off what the response has left."""
    sent = set()
    requests = {}
    for f in fetches:
        requests.setdefault(f[0], []).append(f)
    for follower, request in requests.items():
        left, min_one = request[0][5], True
        for _, partition, offset, p_max, _, _ in sorted(request, key=lambda f: (f[4], f[1])):
            log = sorted((o, size) for p, o, size in records if p == partition and o >= offset)
            read = 0
            for o, size in log:
                if read + size > min(p_max, left):
                    break
                read += size
                sent.add((follower, partition, o))
            if read == 0 and log and min_one:
                read = log[0][1]
                sent.add((follower, partition, log[0][0]))
            min_one = min_one and read == 0
            left = max(0, left - read)
    return sent


def _taken(fetches, records):
    """batches_taken over the same fetches and records, each request's partitions in its order."""
    taken = set()
    for follower in sorted({f[0] for f in fetches}):
        request = sorted((f for f in fetches if f[0] == follower), key=lambda f: (f[4], f[1]))
        units = [(f, o, size) for f, (_, partition, offset, _, _, _) in enumerate(request)
                 for p, o, size in sorted(records, key=lambda r: r[1]) if p == partition and o >= offset]
        if not units:
            continue
        fetch = A([u[0] for u in units])
        out = batches_taken(A([0] * len(request)), A([f[3] for f in request]), fetch, A([u[2] for u in units]),
                            request[0][5])
        taken |= {(follower, request[u[0]][1], u[1]) for u, t in zip(units, out) if t}
    return taken


def test_a_response_cut_from_long_logs_with_gaps_and_large_records_matches_the_rule_read_plainly():
    """On logs of many records, compacted gaps (fetch offsets in them too), partitions of records
    larger than the limits, and limits that cut mid-partition and mid-request."""
    rng = random.Random(227)
    cases = []
    for _ in range(20):
        records = []
        for partition in range(10):
            size = rng.choice((5, 20, 400, None))  # None: sizes vary
            offset = 0
            for _ in range(rng.randrange(0, 60)):
                offset += rng.choice((1, 1, 1, 3)) if partition % 3 == 1 else 1  # compacted: gaps
                records.append((partition, offset, RECORD_OVERHEAD_BYTES + (size or rng.randrange(1, 30))))
        response_max = {follower: rng.choice((SIZE * 8, SIZE * 40, 3000)) for follower in (1, 2)}
        # (follower, partition, fetch offset, partition max bytes, its place in the request, response max)
        fetches = [(follower, partition, rng.randrange(0, 8), rng.choice((SIZE * 3, SIZE * 12, 1000)),
                    rng.randrange(0, 3), response_max[follower]) for follower in (1, 2) for partition in range(10)]
        cases.append((records, fetches))
    # the first partition's records are all over partition_max_bytes: the first still goes
    cases.append(([(0, o, RECORD_OVERHEAD_BYTES + 400) for o in range(5)], [(1, 0, 0, SIZE * 3, 0, 5000)]))
    # a fetch offset in a gap (5-9), the records after it without gaps: all that fit go
    cases.append(([(0, o, SIZE) for o in (*range(5), *range(10, 60))], [(1, 0, 6, SIZE * 45, 0, 5000)]))
    for n, (records, fetches) in enumerate(cases):
        assert _taken(fetches, records) == _read_plainly(fetches, records), f"case {n}"
