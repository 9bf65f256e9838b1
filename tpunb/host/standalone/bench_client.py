"""A streaming benchmark client for OpenAI-compatible servers, as ``vllm bench serve`` measures them.

One asyncio loop on raw streams (HTTP/1.1 keep-alive, chunked or not): per chunk it only stamps the
time and keeps the bytes; parsing waits until the request has ended, so at 256 concurrent streams
the loop stays free to read the next chunk when it arrives. It runs in the kernel (through a
forward) and, for ``--on-host``, on a host by itself (``control``: one request on stdin, one reply
on stdout, like the service control), so it is one file of the standard library.

Per request it keeps the time of every chunk that carries text; the summary follows vllm: TTFT is
the first such chunk, ITL the gaps between the next ones, TPOT (latency - TTFT) / (tokens - 1), and
tokens come from the server's usage chunk when it sends one, else one per chunk.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import sys
import threading
import time
import urllib.parse

#: the longest error body or header block read from a failing server
MAX_HEAD = 65536
#: percentiles saved, as vllm's --metric-percentiles default
PERCENTILES = (99,)
#: the figures summarised, with vllm's names
METRICS = ("ttft", "tpot", "itl", "e2el")


class Failure(Exception):
    """A request that failed, with its kind (refused, HTTP 503, timeout, malformed, disconnected)."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind


def endpoint(base_url: str, chat: bool) -> tuple[str, int, str]:
    """(host, port, path) of the completions endpoint under ``base_url`` (with or without /v1)."""
    parts = urllib.parse.urlsplit(base_url)
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return parts.hostname or "127.0.0.1", parts.port or 80, path + ("/chat/completions" if chat else "/completions")


def request_body(config: dict, prompt: str) -> bytes:
    body = {"model": config["model"], "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": config["output_len"], "temperature": 0.0}
    if config.get("ignore_eos", True):  # vllm's own parameters: the output is as long as asked
        body.update(ignore_eos=True, min_tokens=config["output_len"])
    if config.get("chat"):
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return json.dumps(body).encode()


class Connections:
    """Idle keep-alive connections to one server, reused by the next request."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port, self.idle = host, port, []

    async def take(self):
        if self.idle:
            return self.idle.pop()
        try:
            return await asyncio.open_connection(self.host, self.port, limit=MAX_HEAD)
        except ConnectionRefusedError as exc:
            raise Failure("refused", f"connection refused by {self.host}:{self.port}") from exc
        except OSError as exc:
            raise Failure("unreachable", f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from exc

    def give_back(self, conn) -> None:
        self.idle.append(conn)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


async def _head(reader) -> tuple[int, dict, str]:
    try:
        status = await reader.readline()
        if not status:
            raise Failure("disconnected", "the server closed the connection before answering")
        fields = status.split(None, 2)
        if len(fields) < 2 or not fields[0].startswith(b"HTTP/") or not fields[1].isdigit():
            raise Failure("malformed", f"not an HTTP status line: {status[:60]!r}")
        headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise Failure("disconnected", "the server closed the connection in the headers")
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
    except (ValueError, asyncio.LimitOverrunError) as exc:
        raise Failure("malformed", f"an HTTP head line too long: {exc}") from exc
    return int(fields[1]), headers, (fields[2].decode("latin-1").strip() if len(fields) > 2 else "")


async def _body(reader, headers: dict, pieces: list | None) -> bytes:
    """The whole body; with ``pieces``, each piece also as (time it arrived, bytes)."""
    got = []

    def keep(data: bytes) -> None:
        if pieces is not None:
            pieces.append((time.perf_counter(), data))
        got.append(data)

    try:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                line = await reader.readline()
                if not line:
                    raise Failure("disconnected", "the stream ended without its last chunk")
                try:
                    size = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise Failure("malformed", f"a bad chunk size line: {line[:40]!r}") from None
                if size == 0:
                    await reader.readline()
                    return b"".join(got)
                keep((await reader.readexactly(size + 2))[:-2])
        elif "content-length" in headers:
            length = int(headers["content-length"])
            while length > 0:
                data = await reader.read(min(length, 1 << 20))
                if not data:
                    raise Failure("disconnected", "the stream ended before its Content-Length")
                length -= len(data)
                keep(data)
        else:
            while data := await reader.read(1 << 20):
                keep(data)
    except asyncio.IncompleteReadError as exc:
        raise Failure("disconnected", "the stream ended inside a chunk") from exc
    except (ConnectionResetError, BrokenPipeError) as exc:
        raise Failure("disconnected", f"the connection was reset: {exc}") from exc
    return b"".join(got)


def read_events(pieces: list, chat: bool) -> tuple[list[float], dict | None, str, bool]:
    """(time of each chunk that carries text, the usage dict or None, the text, whether [DONE] came)."""
    times, usage, text, done, buffer = [], None, [], False, b""
    for stamp, data in pieces:
        buffer += data
        *events, buffer = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    continue
                try:
                    message = json.loads(payload)
                except ValueError:
                    raise Failure("malformed", f"an event that is not JSON: {payload[:60]!r}") from None
                if not isinstance(message, dict):
                    raise Failure("malformed", f"an event that is not a JSON object: {payload[:60]!r}")
                if message.get("error"):
                    raise Failure("stream error", str(message["error"])[:200])
                choices = message.get("choices") or []
                if choices:
                    first = choices[0] if isinstance(choices[0], dict) else {}
                    piece = (first.get("delta") or {}).get("content") if chat else first.get("text")
                    if piece:
                        times.append(stamp)
                        text.append(piece)
                if isinstance(message.get("usage"), dict):
                    usage = message["usage"]
    return times, usage, "".join(text), done


async def one_request(conns: Connections, path: str, body: bytes, chat: bool) -> dict:
    """Send one streaming request; its record: start, token times, end, usage (or a Failure)."""
    start = time.perf_counter()
    reader, writer = await conns.take()
    head = (f"POST {path} HTTP/1.1\r\nHost: {conns.host}:{conns.port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    reuse = False
    try:
        try:
            writer.write(head + body)
            status, headers, reason = await _head(reader)
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise Failure("disconnected", f"the connection was reset: {exc}") from exc
        pieces: list = []
        if status != 200:
            text = (await _body(reader, headers, None))[:300].decode(errors="replace")
            raise Failure(f"HTTP {status}", f"HTTP {status} {reason}: {' '.join(text.split())[:200]}")
        await _body(reader, headers, pieces)
        end = time.perf_counter()
        times, usage, text, done = read_events(pieces, chat)
        if not done and not times:
            raise Failure("malformed", "the stream ended with no text and no [DONE]")
        reuse = headers.get("connection", "").lower() != "close" and (
            "content-length" in headers or "chunked" in headers.get("transfer-encoding", "").lower())
        return {"ok": True, "start": start, "end": end, "times": times, "usage": usage, "chars": len(text)}
    finally:
        if reuse:
            conns.give_back((reader, writer))
        else:
            writer.close()


async def _guarded(conns, path, body, chat, timeout: float, index: int) -> dict:
    start = time.perf_counter()
    try:
        record = await asyncio.wait_for(one_request(conns, path, body, chat), timeout)
    except Failure as exc:
        record = {"ok": False, "kind": exc.kind, "error": str(exc), "start": start}
    except asyncio.TimeoutError:
        record = {"ok": False, "kind": "timeout", "error": f"no complete answer within {timeout:g} s", "start": start}
    except OSError as exc:
        record = {"ok": False, "kind": "disconnected", "error": f"{type(exc).__name__}: {exc}", "start": start}
    record["index"] = index
    return record


async def run_level(config: dict, concurrency: int, prompts: list[str]) -> dict:
    """``config["requests"]`` requests, at most ``concurrency`` at once, Poisson arrivals at
    ``request_rate`` per second (or all at once); stops at the run's deadline."""
    host, port, path = endpoint(config["base_url"], config.get("chat", False))
    conns = Connections(host, port)
    gate = asyncio.Semaphore(concurrency)
    rng = random.Random(config.get("seed", 0))
    rate = config.get("request_rate")
    timeout = float(config.get("timeout", 300.0))
    bodies = [request_body(config, prompts[i % len(prompts)]) for i in range(config["requests"])]

    async def limited(i: int) -> dict:
        async with gate:
            return await _guarded(conns, path, bodies[i], config.get("chat", False), timeout, i)

    started = time.perf_counter()
    tasks = []
    try:
        for i in range(len(bodies)):
            tasks.append(asyncio.ensure_future(limited(i)))
            if rate and i + 1 < len(bodies):
                await asyncio.sleep(rng.expovariate(rate))  # Poisson arrivals: the gaps are exponential
        records = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        conns.close()
    return {"concurrency": concurrency, "request_rate": rate, "duration": time.perf_counter() - started,
            "records": list(records)}


def percentile(values: list[float], q: float) -> float:
    """numpy's default (linear) percentile, as vllm reports them."""
    ordered = sorted(values)
    where = (len(ordered) - 1) * q / 100
    low, high = math.floor(where), math.ceil(where)
    return ordered[low] + (ordered[high] - ordered[low]) * (where - low)


def summarize(level: dict, input_lens: list[int]) -> dict:
    """vllm ``bench serve``'s figures for one level, under its key names (ms for latencies)."""
    records = level["records"]
    done = [r for r in records if r["ok"]]
    ttfts, tpots, itls, e2els, outs, ins = [], [], [], [], [], []
    for r in done:
        usage = r.get("usage") or {}
        out = int(usage.get("completion_tokens") or len(r["times"]))
        latency = r["end"] - r["start"]
        ttft = r["times"][0] - r["start"] if r["times"] else latency
        ttfts.append(ttft)
        e2els.append(latency)
        itls.extend(b - a for a, b in zip(r["times"], r["times"][1:]))
        if out > 1:
            tpots.append((latency - ttft) / (out - 1))
        outs.append(out)
        ins.append(int(usage.get("prompt_tokens") or input_lens[r["index"] % len(input_lens)]))
    duration = max(level["duration"], 1e-9)
    result = {"concurrency": level["concurrency"], "max_concurrency": level["concurrency"],
              "request_rate": level["request_rate"] or "inf", "duration": duration, "completed": len(done),
              "failed": len(records) - len(done), "total_input_tokens": sum(ins), "total_output_tokens": sum(outs),
              "request_throughput": len(done) / duration, "output_throughput": sum(outs) / duration,
              "total_token_throughput": (sum(ins) + sum(outs)) / duration}
    for name, values in zip(METRICS, (ttfts, tpots, itls, e2els)):
        ms = [v * 1000 for v in values]
        result[f"mean_{name}_ms"] = statistics.fmean(ms) if ms else 0.0
        result[f"median_{name}_ms"] = statistics.median(ms) if ms else 0.0
        result[f"std_{name}_ms"] = statistics.pstdev(ms) if ms else 0.0
        for q in PERCENTILES:
            result[f"p{q}_{name}_ms"] = percentile(ms, q) if ms else 0.0
    failures: dict[str, int] = {}
    for r in records:
        if not r["ok"]:
            failures[r["kind"]] = failures.get(r["kind"], 0) + 1
    result["failures"] = failures
    result["errors"] = [r.get("error", "") for r in records]
    result.update(input_lens=ins, output_lens=outs, ttfts=ttfts, itls=itls)
    return result


async def run_all(config: dict) -> list[dict]:
    levels = []
    prompts = config["prompts"]
    for concurrency in config["concurrency"]:
        levels.append(await run_level(config, concurrency, prompts))
    return levels


def run(config: dict, stop: threading.Event | None = None) -> list[dict]:
    """Every level of ``config`` in turn, on a new event loop on this thread; the raw levels (each
    with its records). ``config["deadline"]`` seconds bound the whole run; setting ``stop`` (from
    another thread) ends it at once, as Ctrl-C does."""
    async def main():
        task = asyncio.ensure_future(run_all(config))
        waiter = asyncio.ensure_future(asyncio.to_thread(stop.wait)) if stop else None
        done, _ = await asyncio.wait([t for t in (task, waiter) if t], timeout=config.get("deadline"),
                                     return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()
            if waiter:
                stop.set()
            raise Failure("interrupted" if waiter in done else "deadline",
                          "stopped" if waiter in done else f"the run took longer than {config['deadline']:g} s")
        if waiter:
            stop.set()
        return task.result()

    return asyncio.run(main())


def control(request: dict) -> None:
    """On a host: run the benchmark of ``request`` and write the raw levels back (a frame on stdout)."""
    try:
        reply = {"levels": run(request)}
    except Failure as exc:
        reply = {"error": str(exc), "kind": exc.kind}
    except Exception as exc:  # noqa: BLE001 - every failure goes back to the kernel as one line
        reply = {"error": f"{type(exc).__name__}: {exc}"}
    body = json.dumps(reply).encode()
    sys.stdout.buffer.write(b"%012d" % len(body) + body)
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.stdin.read()))))
