"""%tpu_bench's own error: how late its client sees each token, against the server's logged send times.

Run: python bench/bench_serving_client.py [--levels 1,16,256] [--tokens 32] [--ttft 0.1] [--itl 0.02] [--rounds 2]

The toy server (tpunb/host/standalone/toy_llm.py) runs as a process of its own and logs the
``time.perf_counter()`` at which it wrote each chunk (one clock for every process of a Linux
machine: CLOCK_MONOTONIC). Each client streams ``rounds * C`` requests at concurrency C and keeps,
per request, when it saw the first token and the end. The client's error per request:

- TTFT: its first-token time minus the server's first-token send time (what the client adds);
- TPOT: its TPOT ((end - first token) / (tokens - 1), as vllm) minus the server's
  ((last token sent - first token sent) / (tokens - 1)).

Clients, one after the other on a fresh server each: tpunb's (one asyncio loop, kernel receive times, parsing
after the level ends); the method of vllm's ``bench serve`` client (aiohttp, one shared session,
each read split into SSE messages and their JSON parsed as they arrive, as
``vllm/benchmarks/lib/endpoint_request_func.py`` does), when aiohttp is installed; and a plain
baseline, http.client with a thread per stream.
vllm itself is not run: its wheel is 336 MB and needs torch and a GPU/TPU build to import.
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpunb.host.standalone import bench_client, toy_llm  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, log: Path) -> tuple[subprocess.Popen, int]:
    return start_toy(["--ttft", str(args.ttft), "--itl", str(args.itl)], log)


def start_toy(flags: list[str], log: Path) -> tuple[subprocess.Popen, int]:
    """The toy server as a process of its own, logging its send times to ``log``; once it listens."""
    port = free_port()
    server = subprocess.Popen([sys.executable, toy_llm.__file__, "--port", str(port), *flags, "--log", str(log)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, port
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise SystemExit("the toy server did not start")


def body(tokens: int) -> bytes:
    return json.dumps({"model": "toy", "prompt": "hello " * 16, "max_tokens": tokens, "stream": True,
                       "stream_options": {"include_usage": True}, "ignore_eos": True}).encode()


# -- the clients: each returns [{"id", "first", "end", "tokens"}] ------------------------------------
def tpunb_client(port: int, concurrency: int, count: int, tokens: int) -> list[dict]:
    config = {"base_url": f"http://127.0.0.1:{port}/", "model": "toy", "timeout": 120,
              "levels": [{"concurrency": concurrency, "requests": [{"prompt": "hello " * 16, "output_len": tokens}] * count}]}
    records = bench_client.run(config)[0]["records"]
    return [{"id": r["id"], "first": r["times"][0], "end": r["times"][-1], "tokens": r["usage"]["completion_tokens"]}
            for r in records if r["ok"]]


def vllm_method_client(port: int, concurrency: int, count: int, tokens: int) -> list[dict]:
    """vllm's request loop (``async_request_openai_completions``): aiohttp, each read split into SSE
    messages, JSON parsed per message as it comes, a time per message that carries choices."""
    import aiohttp

    async def one(session, gate, out):
        async with gate:
            start = time.perf_counter()
            first = rid = None
            async with session.post(f"http://127.0.0.1:{port}/v1/completions", data=body(tokens),
                                    headers={"Content-Type": "application/json"}) as response:
                buffer = ""
                async for read in response.content.iter_any():
                    buffer += read.decode()
                    *messages, buffer = buffer.split("\n\n")
                    for message in messages:
                        chunk = message.strip().removeprefix("data: ")
                        if not chunk or chunk == "[DONE]":
                            continue
                        data = json.loads(chunk)
                        if data.get("choices"):
                            stamp = time.perf_counter()
                            rid = rid or data["id"]
                            if first is None:
                                first = stamp
                            last = stamp
                        elif data.get("usage"):
                            used = data["usage"]["completion_tokens"]
            out.append({"id": rid, "first": first, "end": last, "tokens": used, "start": start})

    async def main():
        out: list = []
        gate = asyncio.Semaphore(concurrency)
        connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=6 * 3600)) as s:
            await asyncio.gather(*(one(s, gate, out) for _ in range(count)))
        return out

    return asyncio.run(main())


def threads_client(port: int, concurrency: int, count: int, tokens: int) -> list[dict]:
    """A thread per stream, http.client, one JSON parse per line."""
    out, lock, left = [], threading.Lock(), [count]

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while True:
            with lock:
                if not left[0]:
                    break
                left[0] -= 1
            conn.request("POST", "/v1/completions", body(tokens), {"Content-Type": "application/json"})
            reply = conn.getresponse()
            first = rid = None
            while line := reply.readline():
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if data.get("choices"):
                    stamp = time.perf_counter()
                    rid = rid or data["id"]
                    first = first or stamp
                    last = stamp
                elif data.get("usage"):
                    used = data["usage"]["completion_tokens"]
            with lock:
                out.append({"id": rid, "first": first, "end": last, "tokens": used})
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def wait_logged(log: Path, count: int) -> None:
    """The server writes a request's log lines once it has sent its last byte: wait for them all."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if log.exists() and log.read_text().count('"kind": "done"') >= count:
            return
        time.sleep(0.05)
    raise SystemExit(f"the server logged fewer than {count} requests")


# -- measuring ---------------------------------------------------------------------------------------
def errors(seen: list[dict], log: Path) -> dict:
    sent: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event["kind"] == "token":
            sent.setdefault(event["request"], []).append(event["t"])
    ttft, tpot = [], []
    for r in seen:
        times = sent[r["id"]]
        ttft.append((r["first"] - times[0]) * 1000)
        n = r["tokens"]
        tpot.append(((r["end"] - r["first"]) - (times[-1] - times[0])) / (n - 1) * 1000)
    return {"ttft_median": statistics.median(ttft), "ttft_p99": percentile(ttft, 99), "ttft_max": max(ttft),
            "tpot_median": statistics.median(tpot), "tpot_p99": percentile(tpot, 99), "requests": len(seen)}


def percentile(values: list[float], q: float) -> float:
    return bench_client.percentile(values, q)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,16,256")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--ttft", type=float, default=0.1)
    parser.add_argument("--itl", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=2, help="requests per level = rounds x concurrency (at least 16)")
    args = parser.parse_args()
    clients = {"tpunb": tpunb_client}
    try:
        import aiohttp  # noqa: F401
        clients["vllm's method (aiohttp)"] = vllm_method_client
    except ImportError:
        print("aiohttp is not installed: the column for vllm's method is left out (pip install aiohttp)")
    clients["baseline (http.client, a thread per stream)"] = threads_client
    print(f"server: first token after {args.ttft * 1000:g} ms, then one every {args.itl * 1000:g} ms, "
          f"{args.tokens} tokens per request; {os.cpu_count()} CPUs\n")
    print("| concurrency | client | requests | TTFT error median / p99 / max (ms) | TPOT error median / p99 (ms) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for level in [int(v) for v in args.levels.split(",")]:
            count = max(16, args.rounds * level)
            for name, client in clients.items():
                log = Path(tmp) / f"{level}-{len(name)}.jsonl"
                server, port = start_server(args, log)
                try:
                    seen = client(port, level, count, args.tokens)
                    wait_logged(log, count)
                finally:
                    server.terminate()
                    server.wait()
                e = errors(seen, log)
                print(f"| {level} | {name} | {e['requests']} | {e['ttft_median']:.2f} / {e['ttft_p99']:.2f} / "
                      f"{e['ttft_max']:.2f} | {e['tpot_median']:.3f} / {e['tpot_p99']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
