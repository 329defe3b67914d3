"""One round's rules over a bucket (pipeline/control/fetch_round.py) without Spark: Arrow tables in
and out, as the control job's tasks see them. Scenarios with exact numbers: an offline partition,
the response limit across a request's partitions with rotation, the follow-up carrying the rest."""

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline.control.fetch_round import RoundContext, fetch_round, fetch_round_and_sessions
from pipeline.control.state import PARTITION_STATE_SCHEMA, REQUEST_SUMMARY_SCHEMA

STATE = to_arrow_schema(PARTITION_STATE_SCHEMA)
REQUESTS = to_arrow_schema(REQUEST_SUMMARY_SCHEMA)


def partition(p, leader=0, isr=(0, 1, 2), leo=10, last_data_round=(0, 0, 0), caught_up_ms=0, session=(0, 0, 0),
              sent_hw=None):
    """A partition of replicas [0, 1, 2] at LEO `leo` (every replica), HW `leo`; `session`: each
    replica's session in its leader's cache (0: none), `sent_hw` the HW last sent in it."""
    cached = [s != 0 for s in session]
    return dict(topic="t", partition=p, bucket=0, leader=leader, leader_epoch=1, leader_epoch_start_offset=0,
                partition_epoch=1, replicas=[0, 1, 2], isr=list(isr), adding_replicas=[], high_watermark=leo, min_isr=1,
                lag_time_max_ms=1000, log_start_offset=[0] * 3, log_end_offset=[leo] * 3,
                replica_high_watermark=[leo] * 3, fetch_offset=[leo] * 3, last_fetch_time_ms=[caught_up_ms] * 3,
                last_fetch_leader_leo=[leo] * 3, last_caught_up_time_ms=[caught_up_ms] * 3,
                last_data_round=list(last_data_round), session_id=list(session),
                session_max_bytes=[1_048_576 if c else 0 for c in cached],
                session_high_watermark=[(leo if sent_hw is None else sent_hw) if c else -1 for c in cached],
                session_leader_log_start_offset=[0 if c else -1 for c in cached], validated_leader_epoch=[1] * 3)


def request(request_id, p, count, size, acks=1, order=1, batch=0):
    return dict(request_id=request_id, topic="t", partition=p, bucket=0, append_order=order, batch=batch,
                record_count=count,
                bytes=count * size, acks=acks, record_error=None, is_pending=False, base_offset=None,
                last_offset=None, is_duplicate=False, duplicate_of=None)


def run(partitions, requests, now=100, **limits):
    out = fetch_round(pa.Table.from_pylist(partitions, schema=STATE), pa.Table.from_pylist(requests, schema=REQUESTS),
                      RoundContext(round_id=3, now_ms=now, fetching_brokers=(0, 1, 2), **limits))
    return {(r["topic"], r["partition"]): r for r in out.to_pylist()}


def test_an_offline_partition_refuses_produce_and_keeps_its_hw_and_isr():
    # no leader (-1): nobody fetches, nobody shrinks the ISR, the HW stays
    out = run([partition(0, leader=-1, isr=(1,), caught_up_ms=0)], [request("r", 0, 2, 50)], now=99_999)[("t", 0)]
    assert (out["isr"], out["high_watermark"], out["log_end_offset"]) == ([1], 10, [10, 10, 10])
    assert [(r["status"], r["error_code"]) for r in out["results"]] == [("error", "NOT_LEADER_OR_FOLLOWER")]


def test_a_leader_that_is_down_and_not_yet_fenced_refuses_produce_and_moves_nothing():
    # broker 0 stopped, its session not over: still the leader in the metadata, but it answers no
    # request and no fetch until the controller fences it (then its partitions elect)
    out = run([partition(0, leader=0)], [request("r", 0, 2, 50)], ineligible_brokers=(0,))[("t", 0)]
    assert [(r["status"], r["error_code"]) for r in out["results"]] == [("error", "NOT_LEADER_OR_FOLLOWER")]
    assert (out["high_watermark"], out["log_end_offset"], out["records_appended"]) == (10, [10, 10, 10], 0)


def test_delete_records_moves_a_serving_leaders_log_start_and_not_a_down_ones():
    # delete_records before offset 5 (HW 10): a serving leader moves its log start and its
    # followers take it from the response; a leader that is down (its log directory may be gone)
    # moves none, and no broker's log has a prefix to delete
    state = pa.Table.from_pylist([partition(0)], schema=STATE).append_column(
        "requested_log_start_offset", pa.array([5], pa.int64()))
    requests = pa.Table.from_pylist([], schema=REQUESTS)
    for down, expected, brokers in (((), [5, 5, 5], {0, 1, 2}), ((0,), [0, 0, 0], set())):
        out, figures = fetch_round_and_sessions(state, requests, RoundContext(
            round_id=3, now_ms=100, fetching_brokers=(0, 1, 2), ineligible_brokers=down))
        assert out.to_pylist()[0]["log_start_offset"] == expected, down
        assert set(figures.log_start_brokers) == brokers, down


def test_a_throttled_fetcher_takes_one_fetch_a_round_within_its_own_limit_and_the_hw_waits_for_it():
    # three 100-byte batches; follower 2's fetcher is throttled to 50 bytes a partition: its fetch
    # takes the first batch whole (KIP-74: a partition's first batch over the limit), its follow-up
    # proves its LEO and carries nothing more; follower 1 takes all three
    out = run([partition(0)], [request(r, 0, 1, 100, order=i) for i, r in enumerate("abc")],
              fetcher_max_bytes=((2, 50),))[("t", 0)]
    assert (out["log_end_offset"], out["high_watermark"], out["isr"]) == ([13, 13, 11], 11, [0, 1, 2])


def test_the_response_limit_moves_partitions_that_returned_data_to_the_back_and_the_follow_up_takes_the_rest():
    # three partitions led by 0, one batch of 300 bytes each; a response holds 500 bytes. Partition 2
    # returned data in round 2, the others never, so it is at the back: the first response takes
    # 0's batch (300), and 1's does not fit the 200 left, nor 2's. The follow-up response (0, which
    # just returned data, now at the back) takes 1's, and 2's does not fit after it.
    parts = [partition(0), partition(1), partition(2, last_data_round=(0, 2, 2))]
    out = run(parts, [request("a", 0, 3, 100), request("b", 1, 3, 100), request("c", 2, 3, 100)],
              response_max_bytes=500)
    assert [out[("t", p)]["log_end_offset"] for p in range(3)] == [[13, 13, 13], [13, 13, 13], [13, 10, 10]]
    # the HW moved over what the first response proved: partition 0 (the follow-up's fetch offset 13)
    # and partition 1 (taken by the follow-up, proved at the next fetch): HW 13 and 10
    assert [out[("t", p)]["high_watermark"] for p in range(3)] == [13, 10, 10]
    assert [out[("t", p)]["records_replicated"] for p in range(3)] == [6, 6, 0]
    assert [out[("t", p)]["is_settled"] for p in range(3)] == [True, False, False]


def test_requests_to_one_partition_take_offsets_in_append_order():
    out = run([partition(0)], [request("late", 0, 2, 10, order=5), request("early", 0, 3, 10, order=4)])[("t", 0)]
    assert [(r["request_id"], r["base_offset"], r["last_offset"]) for r in out["results"]] == \
        [("early", 10, 12), ("late", 13, 14)]
    assert out["high_watermark"] == 15 and out["is_settled"]


def test_a_requests_batches_take_consecutive_offsets_and_answer_as_one_result():
    # request "a" has two batches in partition 0 (its records 0-1023 and 1024-...), "b" one between
    # them in append order; a response limit of one batch a fetch: the follow-up takes the second
    batches = [request("a", 0, 4, 100, acks=-1, batch=1), request("a", 0, 3, 100, acks=-1, batch=0),
               request("b", 0, 2, 100, order=2)]
    out = run([partition(0)], batches, partition_max_bytes=350)[("t", 0)]
    assert [(r["request_id"], r["base_offset"], r["last_offset"], r["record_count"], r["status"])
            for r in out["results"]] == [("a", 10, 16, 7, "pending"), ("b", 17, 18, 2, "acked")]
    # first response: a's first batch (300 bytes), the follow-up's: its second (400, over the limit
    # but a response's first batch); the HW moved over what the follow-up's fetch offset proved
    assert (out["log_end_offset"], out["high_watermark"]) == ([19, 17, 17], 13)


def test_a_refused_batch_refuses_its_whole_request_in_that_partition():
    batches = [dict(request("a", 0, 3, 100, batch=0), record_error="INVALID_RECORD"), request("a", 0, 2, 100, batch=1),
               request("b", 0, 1, 100, order=2)]
    out = run([partition(0)], batches)[("t", 0)]
    assert [(r["request_id"], r["base_offset"], r["status"], r["error_code"]) for r in out["results"]] == \
        [("a", None, "error", "INVALID_RECORD"), ("b", 10, "acked", None)]
    assert out["log_end_offset"] == [11, 11, 11]


def test_a_restarted_process_resets_its_followers_fetch_state_before_judging_the_isr():
    # follower 2, in the ISR, fetched last at t=0 when the leader's LEO was 6 and is at 6 of 10: at
    # t=50,000 (lag 1000) it is out of sync, unless the leaders restarted with this process
    # (Replica.resetReplicaState: an ISR member caught up at now); a paused fetcher gets no reset
    behind = dict(partition(0), log_end_offset=[10, 10, 6], fetch_offset=[10, 10, 6], last_fetch_leader_leo=[10, 10, 6])
    state = pa.Table.from_pylist([behind], schema=STATE)
    requests = pa.Table.from_pylist([], schema=REQUESTS)

    def isr(fetching=(0, 1, 2), **ctx):
        out = fetch_round(state, requests, RoundContext(round_id=3, now_ms=50_000, fetching_brokers=fetching, **ctx))
        return out.to_pylist()[0]["isr"]

    assert isr() == [0, 1]
    assert isr(restarted=True) == [0, 1, 2]
    assert isr(fetching=(0, 1), restarted=True, paused_brokers=(2,)) == [0, 1]


def test_a_paused_follower_was_caught_up_at_its_brokers_last_fetch_of_an_unchanged_partition():
    # broker 2 last fetched at t=1000 before its fetcher paused; its partition, at the leader's LEO
    # 10, was unchanged since its state was written at t=500 (rounds in between had nothing to do).
    # At t=2000 (lag 1000) it is still caught up (as of t=1000), at t=2001 it is out
    idle = partition(0, caught_up_ms=500)
    state = pa.Table.from_pylist([idle], schema=STATE)
    requests = pa.Table.from_pylist([request("r", 0, 1, 50)], schema=REQUESTS)

    def isr(now, last_fetches=((2, 1000),)):
        ctx = RoundContext(round_id=3, now_ms=now, fetching_brokers=(0, 1), paused_brokers=(2,),
                           broker_last_fetch_ms=last_fetches)
        return fetch_round(state, requests, ctx).to_pylist()[0]["isr"]

    assert isr(2000) == [0, 1, 2]
    assert isr(2001) == [0, 1]
    assert isr(2000, last_fetches=()) == [0, 1]  # with no fetch known since t=500


def sessions_of(out, name="session_id"):
    return {p: out[("t", p)][name] for p in sorted(q for _, q in out)}


def test_an_incremental_fetch_carries_only_what_changed_and_its_follow_up_the_moved_offsets_and_hw():
    # leader 0; followers 1 and 2 fetch in sessions 11 and 22. Partition 0 is idle; partition 1
    # takes a record; partition 2 is not yet in session 22 (added by this request)
    parts = [partition(0, session=(0, 11, 22)), partition(1, session=(0, 11, 22)), partition(2, session=(0, 11, 0))]
    contexts = ((1, 0, "incremental", 11), (2, 0, "incremental", 22))
    state = pa.Table.from_pylist(parts, schema=STATE)
    ctx = RoundContext(round_id=3, now_ms=100, fetching_brokers=(0, 1, 2), fetch_contexts=contexts)
    table, figures = fetch_round_and_sessions(state, pa.Table.from_pylist([request("r", 1, 1, 50)], schema=REQUESTS), ctx)
    out = {(r["topic"], r["partition"]): r for r in table.to_pylist()}
    # first fetch: requests carry partition 2 to session 22 (added); responses partition 1 to both
    # (records) and 2 to broker 2 (new to the session: no HW sent yet). Follow-up of both fetchers
    # (they took records): requests carry partition 1 (its fetch offset moved), responses partition
    # 1 (its HW moved from 10 to 11); partitions 0 and 2 are in neither
    assert {p: (out[("t", p)]["fetch_request_partitions"], out[("t", p)]["fetch_response_partitions"])
            for p in range(3)} == {0: (0, 0), 1: (2, 4), 2: (1, 1)}
    assert (figures.followed_up, figures.added) == (frozenset({11, 22}), {22: 1})
    assert sessions_of(out) == {0: [0, 11, 22], 1: [0, 11, 22], 2: [0, 11, 22]}
    # the HW each session last sent; the followers' own HW follows what their responses carried
    assert sessions_of(out, "session_high_watermark") == {0: [-1, 10, 10], 1: [-1, 11, 11], 2: [-1, 10, 10]}
    assert [out[("t", 1)][k] for k in ("high_watermark", "log_end_offset", "replica_high_watermark")] == \
        [11, [11, 11, 11], [11, 11, 11]]
    # only the rows whose cache entry or state moved must be written
    assert [out[("t", p)]["is_changed"] for p in range(3)] == [False, True, True]


def test_a_fetch_answered_with_a_session_error_carries_nothing():
    # broker 2's request is refused (FETCH_SESSION_ID_NOT_FOUND): it takes nothing and the leader
    # learns nothing from it, so the HW waits for it (in the ISR, caught up within the lag)
    ctx = RoundContext(round_id=3, now_ms=100, fetching_brokers=(0, 1, 2),
                       fetch_contexts=((1, 0, "incremental", 11), (2, 0, "error", 22)))
    state = pa.Table.from_pylist([partition(0, session=(0, 11, 22))], schema=STATE)
    out = fetch_round(state, pa.Table.from_pylist([request("r", 0, 1, 50, acks=-1)], schema=REQUESTS), ctx).to_pylist()[0]
    assert (out["log_end_offset"], out["high_watermark"], out["isr"]) == ([11, 11, 10], 10, [0, 1, 2])
    assert [r["status"] for r in out["results"]] == ["pending"]
    # broker 1: its response carries the record, its follow-up's request the moved offset, and its
    # response nothing (the HW did not move)
    assert (out["session_id"], out["fetch_request_partitions"], out["fetch_response_partitions"]) == ([0, 11, 22], 1, 1)


def test_a_full_fetch_without_room_in_the_cache_leaves_the_session_and_a_new_one_caches_everything():
    ctx = RoundContext(round_id=3, now_ms=100, fetching_brokers=(0, 1, 2),
                       fetch_contexts=((1, 0, "full", 0), (2, 0, "full", 33)))
    state = pa.Table.from_pylist([partition(0, session=(0, 11, 22), sent_hw=7)], schema=STATE)
    out = fetch_round(state, pa.Table.from_pylist([], schema=REQUESTS), ctx).to_pylist()[0]
    assert (out["session_id"], out["session_high_watermark"], out["session_max_bytes"]) == \
        ([0, 0, 33], [-1, -1, 10], [0, 0, 1_048_576])
    assert (out["fetch_request_partitions"], out["fetch_response_partitions"], out["is_changed"]) == (2, 2, True)


def test_retried_batches_are_answered_with_the_offsets_they_repeat_and_not_appended():
    # "a" appends 2 records at the LEO 10; "a-again" repeats it in the same round (acks=all: the
    # round's HW passes it); "old" repeats a batch appended before at 3-4
    again = dict(request("a-again", 0, 2, 50, acks=-1, order=2), is_duplicate=True, duplicate_of="a")
    old = dict(request("old", 0, 2, 50, order=3), is_duplicate=True, base_offset=3, last_offset=4)
    out = run([partition(0)], [request("a", 0, 2, 50), again, old])[("t", 0)]
    assert (out["records_appended"], out["log_end_offset"], out["high_watermark"]) == (2, [12, 12, 12], 12)
    assert {r["request_id"]: (r["base_offset"], r["last_offset"], r["record_count"], r["status"])
            for r in out["results"]} == {"a": (10, 11, 2, "acked"), "a-again": (10, 11, 2, "acked"),
                                         "old": (3, 4, 2, "acked")}
    # a retry the leader refuses (no leader) has no offsets
    refused = run([partition(0, leader=-1)], [old])[("t", 0)]["results"]
    assert [(r["base_offset"], r["error_code"]) for r in refused] == [(None, "NOT_LEADER_OR_FOLLOWER")]


def test_a_follower_reading_a_compacted_log_ends_after_its_last_record_and_takes_the_hw_up_to_its_leo():
    # leader 0 at LEO 7 with offsets 2, 3 and 5 compacted away: follower 1, at 2, reads records 4
    # and 6 (what the round read of the leader's log before the job: each record's size and
    # offset + 1), so its LEO is 7, not 2 + 2; follower 2 is at the leader's LEO; the HW was 2
    row = partition(0, leo=7)
    row.update(log_end_offset=[7, 2, 7], fetch_offset=[7, 2, 7], replica_high_watermark=[2, 2, 2], high_watermark=2,
               read_bytes=[[], [30, 30], []], read_ends=[[], [5, 7], []])
    schema = STATE.append(pa.field("read_bytes", pa.list_(pa.list_(pa.int64())))) \
        .append(pa.field("read_ends", pa.list_(pa.list_(pa.int64()))))
    out = fetch_round(pa.Table.from_pylist([row], schema=schema), pa.Table.from_pylist([], schema=REQUESTS),
                      RoundContext(round_id=3, now_ms=100, fetching_brokers=(0, 1, 2))).to_pylist()[0]
    assert (out["log_end_offset"], out["records_replicated"], out["high_watermark"]) == ([7, 7, 7], 2, 7)
    # a follower's HW: the leader's in its last response, no higher than its own LEO; follower 1's
    # follow-up brings the 7, follower 2 (no records, no follow-up) learns it at its next fetch
    assert out["replica_high_watermark"] == [7, 7, 2]
