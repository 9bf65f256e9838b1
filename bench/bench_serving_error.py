"""%tpu_bench's error against a server whose delays are known, at concurrency 1, 16 and 64.

Run: python bench/bench_serving_error.py [--levels 1,16,64] [--rounds 4] [--input-len 1024] [--tokens 32]

The toy server (tpunb/host/standalone/toy_llm.py) runs as a process of its own with vLLM's block
prefix cache: the first token comes 20 ms + 0.3 ms per prompt token the cache does not hold after
the request, the next every 10 ms; it logs the ``time.perf_counter()`` at which it wrote each chunk
(one clock for every process of a Linux machine). ``tpunb.bench_serving`` runs the sweep as
``%tpu_bench`` does (distinct prompts of --input-len tokens made through the server's /tokenize and
/detokenize, ``rounds * C`` requests at concurrency C) and each level is read two ways:

- against what the server was told: median TTFT minus 20 + 0.3 * input-len ms (the uncached
  prefill: a cached prompt would read 20 ms), median TPOT minus 10 ms;
- per request, against the server's log: the client's first-token time minus the server's
  first-token send time, and its TPOT minus the server's ((last - first send) / (tokens - 1)).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tpunb  # noqa: E402
from bench.bench_serving_client import start_toy  # noqa: E402
from tpunb.host.standalone import bench_client  # noqa: E402
from tpunb.bench.bench_summary import percentile  # noqa: E402

BASE_S, PER_TOKEN_MS, ITL_S = 0.02, 0.3, 0.01


def start_server(log: Path) -> tuple[subprocess.Popen, int]:
    return start_toy(["--ttft", str(BASE_S), "--itl", str(ITL_S), "--prefix-cache", "--prefill-ms-per-token",
                      str(PER_TOKEN_MS)], log)


def sent_times(log: Path) -> dict[str, list[float]]:
    """Each request's token send times, from the server's log."""
    found: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event["kind"] == "token":
            found.setdefault(event["request"], []).append(event["t"])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,16,64")
    parser.add_argument("--rounds", type=int, default=4, help="requests per level = rounds x concurrency")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    levels = [int(c) for c in args.levels.split(",")]
    expected_ttft = (BASE_S + PER_TOKEN_MS / 1000 * args.input_len) * 1000
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}, "
          f"Python {sys.version.split()[0]}; TTFT known {expected_ttft:.1f} ms (cached: {BASE_S * 1000:.0f} ms), "
          f"TPOT known {ITL_S * 1000:.0f} ms")
    print("| concurrency | requests | median TTFT ms (error) | median TPOT ms (error) | "
          "TTFT error vs the server's log median / p99 / max ms | TPOT error vs the log median / p99 ms |")
    print("|---|---|---|---|---|---|")
    raw: list = []
    measured = bench_client.run

    def keep(config, stop=None):  # the raw records too: their ids name the server's log lines
        raw.append(measured(config, stop))
        return raw[-1]

    bench_client.run = keep
    for concurrency in levels:
        log = Path(tempfile.mkdtemp()) / "sent.jsonl"
        server, port = start_server(log)
        try:
            result = tpunb.bench_serving(f"127.0.0.1:{port}", requests=args.rounds * concurrency, concurrency=concurrency,
                                         input_len=args.input_len, output_len=args.tokens, timeout=120)
        finally:
            server.terminate()
            server.wait()
        level, records = result.levels[0], raw[-1][0]["records"]
        sent = sent_times(log)
        ttft_errors, tpot_errors = [], []
        for r in records:
            if r["ok"] and r["id"] in sent:
                truth = sent[r["id"]]
                ttft_errors.append((r["times"][0] - truth[0]) * 1000)
                mine = (r["times"][-1] - r["times"][0]) / (len(r["times"]) - 1)
                theirs = (truth[-1] - truth[0]) / (len(truth) - 1)
                tpot_errors.append((mine - theirs) * 1000)
        ttft, tpot = level["median_ttft_ms"], level["median_tpot_ms"]
        print(f"| {concurrency} | {level['completed']} | {ttft:.1f} ({ttft - expected_ttft:+.1f}, "
              f"{(ttft - expected_ttft) / expected_ttft:+.1%}) | {tpot:.2f} ({tpot - ITL_S * 1000:+.2f}) | "
              f"{statistics.median(ttft_errors):.2f} / {percentile(ttft_errors, 99):.2f} / {max(ttft_errors):.2f} | "
              f"{statistics.median(tpot_errors):.3f} / {percentile(tpot_errors, 99):.3f} |")


if __name__ == "__main__":
    main()
