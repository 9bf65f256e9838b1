"""Tables from the hosts' trace summaries (``tpunb.host.profiler.summarize``): every event, the
ops and jitted functions by total time per host, step times and the straggler."""
from __future__ import annotations

import re
import statistics
from typing import Any

KINDS = ("jit", "op")  # what top() ranks by default: jitted functions and XLA ops
_JITTED = re.compile(r"^PjitFunction\((.*)\)$")


def origin_ns(summaries: dict[int, dict]) -> int:
    """The common time zero: the earliest recording start of all hosts."""
    starts = [s["origin_ns"] for s in summaries.values() if s.get("origin_ns")]
    return min(starts) if starts else 0


def events_frame(summaries: dict[int, dict]):
    """One row per event kept in the summaries: host, name, kind, start_us (from the common zero), dur_us, thread, device."""
    import numpy as np
    import pandas as pd

    zero = origin_ns(summaries)
    frames = []
    for host, summary in sorted(summaries.items()):
        rows = summary["events"]
        if not rows:
            continue
        names, kinds = summary["names"], summary["kinds"]
        threads, devices = summary["threads"], summary["devices"]
        frame = pd.DataFrame(rows, columns=["name_i", "thread_i", "device_i", "start_ns", "dur_ns"])
        codes = frame["name_i"].to_numpy()
        frames.append(pd.DataFrame({
            "host": host,
            "name": np.asarray(names, dtype=object)[codes],
            "kind": np.asarray(kinds, dtype=object)[codes],
            "start_us": (frame["start_ns"] - zero) / 1000.0,
            "dur_us": frame["dur_ns"] / 1000.0,
            "thread": np.asarray(threads, dtype=object)[frame["thread_i"].to_numpy()],
            "device": np.asarray(devices, dtype=object)[frame["device_i"].to_numpy()],
        }))
    if not frames:
        return pd.DataFrame(columns=["host", "name", "kind", "start_us", "dur_us", "thread", "device"])
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["host", "start_us"], kind="stable").reset_index(drop=True)


def top(summaries: dict[int, dict], n: int = 10, kinds: tuple[str, ...] | None = KINDS):
    """The ``n`` names with the most time on their slowest host (all events, not only those kept):
    a column of milliseconds per host, calls, and the slowest host."""
    import pandas as pd

    per_name: dict[str, dict[str, Any]] = {}
    hosts = sorted(summaries)
    for host in hosts:
        summary = summaries[host]
        kind_of = dict(zip(summary["names"], summary["kinds"]))
        for name, (count, total_ns) in summary["totals"].items():
            kind = kind_of.get(name, "other")
            if (kinds and kind not in kinds) or total_ns <= 0:
                continue
            row = per_name.setdefault(name, {"kind": kind, "calls": 0})
            row[f"host {host} ms"] = total_ns / 1e6
            row["calls"] = max(row["calls"], count)
    columns = ["kind", "calls"] + [f"host {h} ms" for h in hosts]
    table = pd.DataFrame.from_dict(per_name, orient="index", columns=columns)
    if table.empty:
        return table.assign(slowest_host=pd.Series(dtype="Int64"))
    times = table[[f"host {h} ms" for h in hosts]].fillna(0.0)
    table[[f"host {h} ms" for h in hosts]] = times
    table["slowest_host"] = [hosts[i] for i in times.to_numpy().argmax(axis=1)]
    table["max ms"] = times.max(axis=1)
    table = table.sort_values("max ms", ascending=False).drop(columns="max ms").head(n)
    table.index.name = "name"
    return table


def step_function(summaries: dict[int, dict]) -> str | None:
    """The jitted function that looks like the training step: called on every host at least twice,
    a name with 'step' first, then the most calls, then the most time."""
    counts: dict[str, list] = {}
    for summary in summaries.values():
        for name, (count, total_ns) in summary["totals"].items():
            match = _JITTED.match(name)
            if match:
                entry = counts.setdefault(name, [])
                entry.append((count, total_ns))
    candidates = [(name, v) for name, v in counts.items()
                  if len(v) == len(summaries) and min(c for c, _ in v) >= 2]
    if not candidates:
        return None
    candidates.sort(key=lambda item: ("step" in item[0].lower(), min(c for c, _ in item[1]),
                                      sum(t for _, t in item[1])), reverse=True)
    return candidates[0][0]


def steps(summaries: dict[int, dict]):
    """Step times (ms) per host, one row per step, of ``step_function``; ``attrs`` names the
    function and the straggler (the host with the slowest median step). None when steps cannot
    be told apart."""
    import pandas as pd

    function = step_function(summaries)
    if function is None:
        return None
    columns = {}
    for host, summary in sorted(summaries.items()):
        try:
            index = summary["names"].index(function)
        except ValueError:
            continue
        durations = sorted((e[3], e[4]) for e in summary["events"] if e[0] == index)
        # nested calls of the same function (a step calling itself) are one step: keep outermost
        outer, end = [], -1
        for start, duration in durations:
            if start >= end:
                outer.append(duration / 1e6)
                end = start + duration
        columns[host] = pd.Series(outer, dtype="float64")
    table = pd.DataFrame(columns)
    table.index.name = "step"
    table.columns.name = "host"
    medians = {h: statistics.median(col.dropna()) for h, col in table.items() if col.notna().any()}
    if medians:
        slowest = max(medians, key=medians.get)
        others = [m for h, m in medians.items() if h != slowest]
        table.attrs["straggler"] = slowest
        table.attrs["median_ms"] = medians
        table.attrs["slower_by"] = (medians[slowest] / statistics.median(others) - 1) if others and statistics.median(others) > 0 else 0.0
    table.attrs["function"] = _JITTED.match(function).group(1)
    return table


_COLLECTIVE = re.compile(r"^(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start|-done)?(\.\d+)?$")


def straggler(summaries: dict[int, dict]) -> tuple[int | None, str]:
    """The host the others wait for, and why (one line).

    Hosts of one program meet at every collective, so the host with the least time inside
    collectives (all-reduce, all-gather, ...) is the one the others wait for. Without collectives
    on two or more hosts, the host with the slowest median step (``steps``) is named instead.
    """
    waits = {}
    for host, summary in summaries.items():
        kind_of = dict(zip(summary["names"], summary["kinds"]))
        total = sum(ns for name, (_, ns) in summary["totals"].items()
                    if kind_of.get(name) == "op" and _COLLECTIVE.match(name))
        if total > 0:
            waits[host] = total / 1e6
    if len(waits) >= 2 and len(waits) == len(summaries):
        host = min(waits, key=waits.get)
        listed = ", ".join(f"host {h} {w:.1f} ms" for h, w in sorted(waits.items()))
        return host, (f"host {host} spends the least time inside collectives ({listed}, summed over each "
                      "host's devices): the other hosts wait for it")
    table = steps(summaries)
    if table is None or len(table.attrs.get("median_ms", {})) < 2:
        return None, ""
    host, medians = table.attrs["straggler"], table.attrs["median_ms"]
    others = ", ".join(f"host {h} {m:.2f} ms" for h, m in sorted(medians.items()) if h != host)
    return host, (f"host {host} has the slowest median {table.attrs['function']} step, {medians[host]:.2f} ms "
                  f"({table.attrs['slower_by']:+.0%} vs {others})")
