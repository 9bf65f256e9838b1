"""One level's figures from its raw records, as ``vllm bench serve`` computes and saves them
(v0.34.0, commit 62d4bc3c7: ``vllm/benchmarks/serve.py`` ``calculate_metrics`` and ``benchmark``'s
result): TTFT at the first token chunk, ITL the gaps between the next ones, TPOT
(latency - TTFT) / (tokens - 1), E2EL to the last token chunk, throughputs over the level's
duration, numpy's linear percentiles and population standard deviation, goodput against
``ttft``/``tpot``/``e2el`` limits, the peak output tokens in a one-second bucket and the peak of
requests in flight; per request lists with an entry for every request, a failed one's zero or
empty. Output tokens are the server's usage chunk, else the generated text counted by ``count``
(the tokenizer, or the server's /tokenize), else the token chunks.
"""
from __future__ import annotations

import math
import statistics
from typing import Callable

#: percentiles saved, as vllm's --metric-percentiles default
PERCENTILES = (99,)
#: the figures summarised, with vllm's names (the sweep's --percentile-metrics ttft,tpot,itl,e2el)
METRICS = ("ttft", "tpot", "itl", "e2el")
#: goodput's limits, in ms, as vllm's --goodput KEY:VALUE
GOODPUT_KEYS = ("ttft", "tpot", "e2el")


def percentile(values: list[float], q: float) -> float:
    """numpy's default (linear) percentile, as vllm reports them."""
    ordered = sorted(values)
    where = (len(ordered) - 1) * q / 100
    low, high = math.floor(where), math.ceil(where)
    return ordered[low] + (ordered[high] - ordered[low]) * (where - low)


def _stats(result: dict, name: str, seconds: list[float]) -> None:
    ms = [v * 1000 for v in seconds]
    result[f"mean_{name}_ms"] = statistics.fmean(ms) if ms else 0.0
    result[f"median_{name}_ms"] = statistics.median(ms) if ms else 0.0
    result[f"std_{name}_ms"] = statistics.pstdev(ms) if ms else 0.0
    for q in PERCENTILES:
        result[f"p{q}_{name}_ms"] = percentile(ms, q) if ms else 0.0


def summarize(level: dict, input_lens: list[int], count: Callable[[str], int] | None = None,
              goodput: dict[str, float] | None = None) -> dict:
    """vllm ``bench serve``'s figures for one level, under its key names (ms for latencies);
    ``input_lens``: each request's prompt tokens as made (the usage chunk's count wins)."""
    records = sorted(level["records"], key=lambda r: r["index"])
    ttfts, tpots, all_tpots, itls, e2els, answers, queue = [], [], [], [], [], [], []
    per = {key: [] for key in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
                               "queue_times", "generated_texts", "errors")}
    done = 0
    for r in records:
        usage = r.get("usage") or {}
        prompt = int(usage.get("prompt_tokens") or input_lens[r["index"]])
        per["input_lens"].append(prompt)
        per["start_times"].append(r["start"])
        per["queue_times"].append(r["start"] - r.get("arrival", r["start"]))
        per["errors"].append(r.get("error", ""))
        if not r["ok"]:
            for key, empty in (("output_lens", 0), ("ttfts", 0.0), ("itls", []), ("latencies", 0.0),
                               ("generated_texts", "")):
                per[key].append(empty)
            continue
        done += 1
        times = r["times"]
        out = int(usage.get("completion_tokens") or (count(r["text"]) if count and r["text"] else len(times)))
        ttft, latency = times[0] - r["start"], times[-1] - r["start"]
        gaps = [b - a for a, b in zip(times, times[1:])]
        tpot = (latency - ttft) / (out - 1) if out > 1 else 0.0
        if out > 1:
            tpots.append(tpot)
        all_tpots.append(tpot)
        ttfts.append(ttft)
        e2els.append(latency)
        itls.extend(gaps)
        queue.append(per["queue_times"][-1])
        if r.get("answer") is not None:
            answers.append(r["answer"] - r["start"])
        for key, value in (("output_lens", out), ("ttfts", ttft), ("itls", gaps), ("latencies", latency),
                           ("generated_texts", r["text"])):
            per[key].append(value)
    duration = max(level["duration"], 1e-9)
    total_in = sum(p for p, r in zip(per["input_lens"], records) if r["ok"])
    total_out = sum(per["output_lens"])
    good = _good(goodput, ttfts, all_tpots, e2els) if goodput else None
    result = {"duration": duration, "completed": done, "failed": len(records) - done,
              "total_input_tokens": total_in, "total_output_tokens": total_out,
              "request_throughput": done / duration, "request_goodput": None if good is None else good / duration,
              "output_throughput": total_out / duration, "total_token_throughput": (total_in + total_out) / duration,
              **per, **_peaks(records, per), "rtfx": 0.0}
    for name, values in zip(METRICS, (ttfts, tpots, itls, e2els)):
        _stats(result, name, values)
    if level["concurrency"] is not None:  # vllm: the client's wait for a place under --max-concurrency
        _stats(result, "client_queue_time", queue)
        if level["request_rate"]:
            _stats(result, "e2el_including_client_queue", [e + q for e, q in zip(e2els, queue)])
    if answers and answers != ttfts:  # reasoning came first: the time to the first answer token too
        _stats(result, "ttfat", answers)
    failures: dict[str, int] = {}
    for r in records:
        if not r["ok"]:
            failures[r["kind"]] = failures.get(r["kind"], 0) + 1
    result.update(max_concurrency=level["concurrency"], request_rate=level["request_rate"] or "inf",
                  failures=failures, prefix_cache=level.get("reset"), warmups=level.get("warmups", 0))
    return result


def _good(limits: dict[str, float], ttfts: list[float], tpots: list[float], e2els: list[float]) -> int:
    """Requests within every limit (ms), as vllm counts goodput (TPOT 0 for a single token)."""
    columns = [(values, limits[key] / 1000) for key, values in zip(GOODPUT_KEYS, (ttfts, tpots, e2els))
               if key in limits]
    return sum(all(values[i] <= limit for values, limit in columns) for i in range(len(ttfts)))


def _peaks(records: list[dict], per: dict) -> dict:
    """vllm's max_output_tokens_per_s (token chunks in the fullest one-second bucket from the first
    start) and max_concurrent_requests (the most requests in flight at once)."""
    done = [r for r in records if r["ok"]]
    if not done:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    first = min(r["start"] for r in done)
    buckets: dict[int, int] = {}
    for r in done:
        for t in r["times"]:
            buckets[int(t - first)] = buckets.get(int(t - first), 0) + 1
    events = sorted([(r["start"], 1) for r in done] + [(r["times"][-1], -1) for r in done])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return {"max_output_tokens_per_s": float(max(buckets.values())), "max_concurrent_requests": peak}


def parse_goodput(pairs: list[str] | str | None) -> dict[str, float] | None:
    """``ttft:MS tpot:MS e2el:MS`` (vllm's --goodput) as a dict; ValueError naming what is wrong."""
    if not pairs:
        return None
    items = pairs.split() if isinstance(pairs, str) else list(pairs)
    limits = {}
    for item in items:
        key, sep, value = str(item).partition(":")
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not sep or key not in GOODPUT_KEYS or number < 0:
            raise ValueError(f"--goodput takes KEY:MS pairs with KEY one of {', '.join(GOODPUT_KEYS)} and MS >= 0 "
                             f"(e.g. ttft:500 tpot:50), not {item!r}")
        limits[key] = number
    return limits
