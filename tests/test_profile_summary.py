"""The kernel's reading of the hosts' trace summaries (tpunb.profile.summary), on summaries made
here in the shape ``tpunb.host.profiler.summarize`` sends: the step function found and timed per
host, the straggler named by collectives or by steps, the top table ordered by the slowest host.
Real traces from real multi-process JAX are test_profile.py's."""
from __future__ import annotations

from tpunb.profile import summary

STEP, MATMUL, REDUCE = "PjitFunction(train_step)", "dot.3", "all-reduce.1"
MS = 1_000_000


def host_summary(step_ms: list[float], reduce_ms: float, origin: int = 10 * MS) -> dict:
    """One host: its step calls back to back from ``origin``, one matmul, and time inside an all-reduce."""
    events, at = [], origin
    for ms in step_ms:
        events.append([0, 0, 0, at, int(ms * MS)])
        events.append([1, 0, 0, at + MS // 10, int(ms * MS) // 2])  # an op inside the step
        at += int(ms * MS)
    return {"origin_ns": origin, "names": [STEP, MATMUL, REDUCE], "kinds": ["jit", "op", "op"],
            "threads": ["main"], "devices": ["/host:CPU"], "events": events,
            "totals": {STEP: [len(step_ms), int(sum(step_ms) * MS)], MATMUL: [len(step_ms), int(sum(step_ms) * MS) // 2],
                       REDUCE: [len(step_ms), int(reduce_ms * MS)]}}


def test_steps_are_the_step_function_per_host_and_the_slowest_median_is_the_straggler():
    summaries = {0: host_summary([10, 11, 10], 0), 1: host_summary([20, 21, 19], 0)}
    table = summary.steps(summaries)
    assert table.attrs["function"] == "train_step"
    assert table[0].tolist() == [10.0, 11.0, 10.0] and table[1].tolist() == [20.0, 21.0, 19.0]
    assert table.attrs["straggler"] == 1 and round(table.attrs["slower_by"], 2) == 1.0
    host, why = summary.straggler(summaries)
    assert host == 1 and why.startswith("host 1 has the slowest median train_step step, 20.00 ms (+100% vs host 0")


def test_the_host_least_inside_collectives_is_the_one_the_others_wait_for():
    summaries = {0: host_summary([10, 10], 30), 1: host_summary([10, 10], 4), 2: host_summary([10, 10], 28)}
    host, why = summary.straggler(summaries)
    assert host == 1 and "host 1 spends the least time inside collectives" in why and "host 1 4.0 ms" in why


def test_top_ranks_by_the_slowest_hosts_time_and_a_single_call_is_no_step():
    summaries = {0: host_summary([10, 10], 2), 1: host_summary([30, 30], 1)}
    table = summary.top(summaries, n=2)
    assert table.index.tolist() == [STEP, MATMUL]  # 60 ms then 30 ms on host 1; the all-reduce is third
    assert table.loc[STEP, "slowest_host"] == 1 and table.loc[STEP, "host 0 ms"] == 20.0
    assert summary.steps({0: host_summary([10], 0), 1: host_summary([12], 0)}) is None  # once: cannot tell steps
    frame = summary.events_frame(summaries)
    assert frame["start_us"].min() == 0.0 and set(frame["host"]) == {0, 1}
