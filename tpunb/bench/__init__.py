"""``%tpu_bench``: benchmark an OpenAI-compatible server as ``vllm bench serve`` does.

TARGET is a service of the current slice (reached on the lowest host that runs it, or ``host``,
at the port it recorded), ``host:port`` or a base URL. For a service the client
(``tpunb/host/standalone/bench_client.py``) runs on the service's host by itself, as published
figures are taken; with ``on_host=False`` (and for any other target) it runs in the kernel, through
a forward this call opens and closes, and the round trip it measured to the server, which is in
every TTFT then, is shown beside the figures.

Each level gets prompts of its own (``tpunb/bench/prompts.py``, drawn from ``seed + level``), and
the server's prefix cache is reset before each level where the server exposes
``POST /reset_prefix_cache`` (vLLM does only with ``VLLM_SERVER_DEV_MODE=1``, which tpunb never
turns on: it mounts unauthenticated control routes).
"""
from __future__ import annotations

import dataclasses
import http.client
import json
import math
import os
import re
import statistics
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable

from tpunb import report
from tpunb.engine import programs
from tpunb.transport.bundle import HOST
from tpunb.transport.fanout import fan_out
from tpunb.errors import CellInterrupted, ServiceError, TransportError, UsageError
from tpunb.host.standalone import bench_client
from tpunb.services import control
from tpunb.forwards import port_forward as forwards
from tpunb.bench import prompts, tokenizer as tokenizers
from tpunb.bench.bench_result import BenchResult
from tpunb.bench.bench_summary import parse_goodput, summarize
from tpunb.services.serving import NAME

HOST_PORT = re.compile(r"\[?([A-Za-z0-9.:-]+?)\]?:(\d{1,5})")
#: round trips timed for the figure shown beside the results (their median)
ROUND_TRIPS = 5
#: seconds the requests around the run (models, round trips) wait for an answer
ASIDE_TIMEOUT = 10.0
TARGETS = "a service name of the current slice, HOST:PORT or a base URL (http://127.0.0.1:8000/v1)"
#: --output-len when neither it nor a dataset says (vllm's random dataset default)
OUTPUT_LEN = 128


@dataclasses.dataclass
class Target:
    """Where the client goes: ``url`` from the kernel; for a service, its ``host`` and ``port``."""

    label: str
    url: str
    host: int | None = None
    port: int | None = None
    transport: object = None
    close: Callable[[], None] = lambda: None


def bench_serving(target: str, model: str | None = None, requests: int = 100,
                  concurrency: int | str | list | None = None, request_rate: float | None = None,
                  input_len: int = 128, output_len: int | None = None, tokenizer: str | None = None,
                  chat: bool = False, save: str | Path | None = None, on_host: bool | None = None,
                  host: int | str | None = None, timeout: float = 300.0, ignore_eos: bool = True,
                  slice_name: str | None = None, seed: int = 0, prefix_len: int = 0, num_warmups: int = 0,
                  burstiness: float = 1.0, goodput: str | list | None = None, temperature: float | None = None,
                  dataset: str | None = None, current: Callable[[str | None], Any] | None = None) -> BenchResult:
    """Stream ``requests`` completions per level (``concurrency`` "1,16,64" is a sweep; with
    ``request_rate`` and no ``concurrency``, one level without a cap) from ``target``, and measure
    TTFT, TPOT, ITL and end-to-end latency as vllm does; ``save`` writes vllm's files. Each request
    ends within ``timeout`` seconds; Ctrl-C stops the run. ``OPENAI_API_KEY``, when set, is sent as
    the bearer token (as vllm's client does), never shown. ``current`` finds the slice a service
    TARGET runs on (``tpunb.current``, which ``tpunb.bench_serving`` passes)."""
    levels = concurrency_levels(concurrency if concurrency is not None else (None if request_rate else 1))
    _check(requests=requests, input_len=input_len, **({"output_len": output_len} if output_len is not None else {}))
    _check_from_zero(prefix_len=prefix_len, num_warmups=num_warmups, seed=seed)
    if request_rate is not None and not (isinstance(request_rate, (int, float)) and request_rate > 0):
        raise UsageError(f"--request-rate is requests per second > 0, not {request_rate!r}")
    if not (isinstance(burstiness, (int, float)) and burstiness > 0):
        raise UsageError(f"--burstiness is a number > 0 (1: Poisson arrivals), not {burstiness!r}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise UsageError(f"--timeout is seconds > 0, not {timeout!r}")
    try:
        limits = parse_goodput(goodput)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if save:
        BenchResult.check_place(save, sweep=len(levels) > 1)
    pairs = prompts.read_sharegpt(dataset) if dataset else None
    key = os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    where = resolve(target, host, on_host, slice_name, current)
    on_host = where.host is not None if on_host is None else on_host
    try:
        model = model or served_model(where.url, headers)
        tok = tokenizers.local(tokenizer) if tokenizer else tokenizers.server(where.url, model, headers)
        plans = []
        for k, cap in enumerate(levels):
            warm, measured = prompts.level_requests(tok, requests, num_warmups, input_len,
                                                    output_len if output_len is not None or pairs else OUTPUT_LEN,
                                                    prefix_len, seed + k, pairs)
            plans.append((cap, warm, measured, seed + k))
        rtt = None if on_host else round_trip_ms(where.url, headers)
        config = {"base_url": where.url, "model": model, "chat": chat, "request_rate": request_rate,
                  "burstiness": burstiness, "timeout": timeout, "ignore_eos": ignore_eos, "temperature": temperature,
                  "headers": headers,
                  "levels": [{"concurrency": cap, "requests": [r.wire() for r in measured],
                              "warmups": [r.wire() for r in warm], "reset": True, "seed": level_seed}
                             for cap, warm, measured, level_seed in plans],
                  "deadline": sum(timeout * math.ceil((requests + num_warmups) / (cap or requests)) + (
                      4 * requests / request_rate if request_rate else 0) for cap in levels) + 30}
        if on_host:
            raw = _run_on_host(where, {**config, "base_url": f"http://127.0.0.1:{where.port}/"})
        else:
            raw = _run_here(config)
        counter = _output_counter(tok, raw)
        summaries = [{**summarize(r, [q.input_len for q in plan[2]], counter, limits), "seed": plan[3]}
                     for r, plan in zip(raw, plans)]
    finally:
        where.close()
    _say_prefix_cache(summaries)
    result = BenchResult(target=where.label, model=model, levels=summaries, rtt_ms=rtt, on_host=on_host,
                         url=where.url, chat=chat, tokenizer=tokenizer, requests=requests, burstiness=burstiness,
                         seed=seed)
    if save:
        result.save(save)
    return result


def _output_counter(tok: tokenizers.Tokenizer | None, raw: list[dict]) -> Callable[[str], int] | None:
    """Output tokens of requests without a usage chunk: their text counted by the tokenizer (the
    server's /tokenize counted at once, here), as vllm counts them; None when there is none."""
    if tok is None:
        return None
    texts = {r["text"] for level in raw for r in level["records"] if r["ok"] and not r.get("usage") and r["text"]}
    if not texts:
        return tok.count
    counted = fan_out(sorted(texts), tok.count, workers=prompts.PARALLEL, name="tpunb-bench-count").by_key()
    return lambda text: counted[text] if text in counted else tok.count(text)


def _say_prefix_cache(summaries: list[dict]) -> None:
    """One line: whether the server's prefix cache was reset before each level (prompts differ
    in every level either way)."""
    said = {s["prefix_cache"] for s in summaries}
    if said == {"reset"}:
        report.info("[tpunb] the server's prefix cache was reset before each level (POST /reset_prefix_cache "
                    "answered 200); every prompt is distinct")
    else:
        report.info("[tpunb] every prompt is distinct, in every level; the server does not expose "
                    "POST /reset_prefix_cache (vLLM: only with VLLM_SERVER_DEV_MODE=1), so its prefix cache was "
                    "not reset")


def concurrency_levels(value) -> list[int | None]:
    """``4``, ``"1,16,64"`` or ``[1, 16]`` as a list of levels >= 1; None: one level without a cap."""
    if value is None:
        return [None]
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    try:
        levels = [int(str(v).strip()) for v in items]
    except ValueError:
        levels = []
    if not levels or any(v < 1 for v in levels):
        raise UsageError(f"--concurrency is C or C1,C2,... with each C >= 1 (e.g. 1,16,64), not {value!r}")
    return levels


def _check(**numbers: int) -> None:
    for name, value in numbers.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"--{name.replace('_', '-')} is a whole number >= 1, not {value!r}")


def _check_from_zero(**numbers: int) -> None:
    for name, value in numbers.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise UsageError(f"--{name.replace('_', '-')} is a whole number >= 0, not {value!r}")


# -- the target -------------------------------------------------------------------------------------
def resolve(target: str, host, on_host: bool | None, slice_name: str | None,
            current: Callable[[str | None], Any] | None = None) -> Target:
    """The Target of ``target``; a service gets a forward (closed by ``Target.close``)."""
    text = str(target or "").strip()
    if re.match(r"https?://", text):
        parts = urllib.parse.urlsplit(text)
        if not parts.hostname:
            raise UsageError(f"{text!r} is not a URL with a host; TARGET is {TARGETS}")
        where = Target(text, text)
    elif (host_port := HOST_PORT.fullmatch(text)) and int(host_port.group(2)) < 65536:
        where = Target(text, f"http://{text}/")
    elif NAME.fullmatch(text):
        return _service(text, host, slice_name, current)
    else:
        raise UsageError(f"TARGET {text!r} is not {TARGETS}")
    if on_host or host is not None:
        raise UsageError(f"--on-host and --host pick the host of a service: give the service's name as TARGET, "
                         f"not {text!r}")
    return where


def _service(name: str, host, slice_name: str | None, current: Callable[[str | None], Any] | None) -> Target:
    if current is None:
        raise UsageError(f"TARGET {name!r} names a service, and services run on a slice: call tpunb.bench_serving "
                         f"(it finds the slice), or give a URL or HOST:PORT")
    sl = current(slice_name)
    listed = sl.services()
    states = [s for s in listed if s.name == name]
    if not states:
        known = sorted({s.name for s in listed})
        raise UsageError(f"no service named {name!r} on {sl.name!r} ("
                         f"{'its services: ' + ', '.join(known) if known else 'it has none'}); TARGET is {TARGETS}")
    if host is not None:
        chosen = sl.layout.parse(host)
        on = [s for s in states if s.host in chosen]
        if len(chosen) != 1 or not on:
            raise UsageError(f"--host {host} is not one host that runs {name!r} (it runs on host "
                             f"{sl.layout.names(sorted(s.host for s in states))})")
        states = on
    state = min([s for s in states if s.state == "running"] or states, key=lambda s: s.host)
    if state.port is None:
        raise UsageError(f"service {name!r} has no port: start it with %tpu_serve {name} --port P (or --wait-port P, "
                         f"--wait-http PORT/PATH), or give TARGET as HOST:PORT")
    transport = sl.serving.transports[state.host]
    made = forwards.forward(sl.serving.transports, state.host, state.port, None)
    label = f"{name} (host {sl.layout.name(state.host)}, port {state.port})"
    if isinstance(made, str):  # a host on this machine: its own port, nothing to carry
        return Target(label, made, state.host, state.port, transport)
    return Target(label, made.url, state.host, state.port, transport, made.close)


def served_model(url: str, headers: dict | None = None) -> str:
    """The first model the server lists (GET /v1/models), or a one-line error asking for --model."""
    try:
        status, body = _get(url, "/v1/models", headers or {})
        if status != 200:
            raise ValueError(f"HTTP {status}")
        return str(json.loads(body)["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError, TypeError, http.client.HTTPException) as exc:
        raise UsageError(f"give --model M: {url} did not list its models ({exc})") from None


def round_trip_ms(url: str, headers: dict | None = None) -> float | None:
    """The median time of a small request on an open connection (GET /v1/models), in ms: what
    the path to the server adds to each figure. None when it does not answer."""
    conn = _connection(url)
    try:
        _ask(conn, url, "/v1/models", headers or {})  # opens the connection (and a forward's channel)
        times = []
        for _ in range(ROUND_TRIPS):
            started = time.perf_counter()
            _ask(conn, url, "/v1/models", headers or {})
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _connection(url: str) -> http.client.HTTPConnection:
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return kind(parts.hostname, parts.port, timeout=ASIDE_TIMEOUT)


def _ask(conn: http.client.HTTPConnection, url: str, path: str, headers: dict) -> tuple[int, bytes]:
    root = urllib.parse.urlsplit(url).path.rstrip("/").removesuffix("/v1")
    conn.request("GET", root + path, headers=headers)
    reply = conn.getresponse()
    return reply.status, reply.read()


def _get(url: str, path: str, headers: dict) -> tuple[int, bytes]:
    conn = _connection(url)
    try:
        return _ask(conn, url, path, headers)
    finally:
        conn.close()


# -- running ----------------------------------------------------------------------------------------
def _run_here(config: dict) -> list[dict]:
    """The client on a thread of its own (the kernel's own event loop is busy); Ctrl-C stops it."""
    stop = threading.Event()
    outcome: dict = {}

    def work():
        try:
            outcome["levels"] = bench_client.run(config, stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    runner = threading.Thread(target=work, daemon=True, name="tpunb-bench")
    runner.start()
    try:
        while runner.is_alive():
            runner.join(0.2)
    except KeyboardInterrupt:
        stop.set()
        runner.join(30)
        raise CellInterrupted("interrupted: the benchmark stopped (no figures)") from None
    error = outcome.get("error")
    if isinstance(error, bench_client.Failure):
        raise ServiceError(f"the benchmark stopped: {error}") from None
    if error is not None:
        raise error
    return outcome["levels"]


def _run_on_host(where: Target, config: dict) -> list[dict]:
    """The client as a process of its own on the service's host; its raw levels come back. The
    service control's bootstrap runs it: it execs any standalone program sent as source and calls
    its ``control(request)``, which answers with one frame."""
    transport = where.transport
    try:
        reply = programs.ask(control.program(transport, config, (HOST / "standalone" / "bench_client.py").read_text(),
                                             "the benchmark client"))
    except KeyboardInterrupt:
        raise CellInterrupted("interrupted: the benchmark stopped on the host (no figures)") from None
    except TransportError as exc:
        raise ServiceError(f"the benchmark client could not run on host {where.host}: {exc}") from None
    if "error" in reply:
        raise ServiceError(f"the benchmark on host {where.host} stopped: {reply['error']}")
    return reply["levels"]
