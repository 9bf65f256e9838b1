"""A streaming benchmark client for OpenAI-compatible servers, as ``vllm bench serve`` measures them.

One asyncio loop over HTTP/1.1 keep-alive connections (chunked, Content-Length or closed at the
end): each read is kept as bytes with its time, the kernel's receive time where Linux gives it
(SO_TIMESTAMPNS), else when the loop's wait returned; the events are parsed once the level has
ended, so at 256 concurrent streams the loop's work per chunk is an append and no stream waits
behind another's JSON. It runs in the kernel (through a
forward) and, for ``--on-host``, on a host by itself (``control``: one request on stdin, one reply
on stdout, like the service control), so it is one file of the standard library.

Per request it keeps the time of every chunk that carries a token, as ``vllm bench serve`` (v0.34.0,
``vllm/benchmarks/lib/endpoint_request_func.py``) counts them: a completion chunk with ``choices``; a
chat chunk whose delta has content, reasoning (``reasoning``, ``reasoning_content``) or a tool call,
or an empty content without the opening ``role``. It also keeps when the first answer (content)
came, and the text. Each level runs as vllm's: prompts arrive on a schedule (``request_rate``,
gamma gaps of shape ``burstiness`` scaled to end at N/rate) and wait for a place when the level has
a concurrency cap (the wait is their queue time); its warm-ups run first, after
``POST /reset_prefix_cache`` when the level asks for it. The kernel makes the figures
(``tpunb/bench/bench_summary.py``).
"""
from __future__ import annotations

import asyncio
import bisect
import gc
import http.client
import json
import math
import platform
import random
import selectors
import socket
import struct
import sys
import threading
import time
import urllib.parse

#: the longest error body or header block read from a failing server
MAX_HEAD = 65536
#: what a chat delta carries when it streams a token (vllm's ``_choice_has_streamed_output``)
TOKEN_FIELDS = ("content", "reasoning", "reasoning_content", "tool_calls", "function_call")
#: seconds the reset of the server's prefix cache may take
RESET_TIMEOUT = 30.0
#: Linux's SO_TIMESTAMPNS (= SCM_TIMESTAMPNS; the socket module does not name it), the same number on
#: the architectures below; elsewhere reads are stamped when the loop wakes
SO_TIMESTAMPNS = 35
KERNEL_STAMPS = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64", "arm64")


class Failure(Exception):
    """A request that failed, with its kind (refused, HTTP 503, timeout, malformed, disconnected)."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind


def endpoint(base_url: str, chat: bool) -> tuple[str, int, str, bool]:
    """(host, port, path, TLS) of the completions endpoint under ``base_url`` (with or without /v1)."""
    parts = urllib.parse.urlsplit(base_url)
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    tls = parts.scheme == "https"
    return (parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80),
            path + ("/chat/completions" if chat else "/completions"), tls)


def request_body(config: dict, request: dict) -> bytes:
    """A streaming request for ``request`` ({"prompt", "output_len"}), as vllm's client sends it."""
    body = {"model": config["model"], "stream": True, "stream_options": {"include_usage": True}}
    out = int(request["output_len"])
    if config.get("chat"):
        body.update(messages=[{"role": "user", "content": request["prompt"]}], max_completion_tokens=out)
    else:
        body.update(prompt=request["prompt"], max_tokens=out)
    if config.get("temperature") is not None:
        body["temperature"] = config["temperature"]
    if config.get("ignore_eos", True):  # vllm's own parameters: the output is as long as asked
        body.update(ignore_eos=True, min_tokens=out)
    return json.dumps(body).encode()


class StampingSelector(selectors.DefaultSelector):
    """The event loop's selector, noting when each wait returned: the time every socket ready in
    that wake-up was seen, however long the loop then takes to reach it."""

    woke = 0.0

    def select(self, timeout=None):
        ready = super().select(timeout)
        self.woke = time.perf_counter()
        return ready


class Stream(asyncio.Protocol):
    """One keep-alive connection; for each request it keeps the raw response and the time each
    piece arrived, and finds where the response ends (Content-Length, chunked, or the close),
    looking only at chunk headers: the events are parsed once the response is whole."""

    def __init__(self, clock: StampingSelector) -> None:
        self.clock, self.transport, self.closed, self.done = clock, None, False, None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def begin(self, request: bytes) -> asyncio.Future:
        self.raw, self.arrivals, self.head_end, self.status = bytearray(), [], -1, 0
        self.headers, self.reason, self.next_chunk, self.body_end = {}, "", 0, -1
        self.done = asyncio.get_running_loop().create_future()
        self.send(request)
        return self.done

    def send(self, data: bytes) -> None:
        self.transport.write(data)

    def close(self) -> None:
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.feed(data, self.clock.woke)

    def feed(self, data: bytes, stamp: float) -> None:
        """``data`` arrived at ``stamp`` (perf_counter's clock)."""
        self.raw += data
        self.arrivals.append((stamp, len(self.raw)))
        if self.done is None or self.done.done():
            return
        try:
            if self.head_end < 0 and not self._read_head():
                return
            if self._complete():
                self.done.set_result(True)
        except Failure as exc:
            self.done.set_exception(exc)

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            if self.head_end >= 0 and self.framing == "close":
                self.body_end = len(self.raw)
                self.done.set_result(True)
            else:
                self.done.set_exception(Failure("disconnected", "the server closed the connection mid-answer"))

    def _read_head(self) -> bool:
        end = self.raw.find(b"\r\n\r\n")
        if end < 0:
            if len(self.raw) > MAX_HEAD:
                raise Failure("malformed", "an HTTP head longer than 64 KB")
            return False
        lines = bytes(self.raw[:end]).decode("latin-1").split("\r\n")
        fields = lines[0].split(None, 2)
        if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
            raise Failure("malformed", f"not an HTTP status line: {lines[0][:60]!r}")
        self.status, self.reason = int(fields[1]), fields[2] if len(fields) > 2 else ""
        for line in lines[1:]:
            key, _, value = line.partition(":")
            self.headers[key.strip().lower()] = value.strip()
        self.head_end = self.next_chunk = end + 4
        self.framing = ("chunked" if "chunked" in self.headers.get("transfer-encoding", "").lower() else
                        "length" if "content-length" in self.headers else "close")
        return True

    def _complete(self) -> bool:
        if self.framing == "length":
            self.body_end = self.head_end + int(self.headers["content-length"])
            return len(self.raw) >= self.body_end
        if self.framing == "close":
            return False
        while True:  # hop from chunk header to chunk header
            line_end = self.raw.find(b"\r\n", self.next_chunk)
            if line_end < 0:
                return False
            try:
                size = int(bytes(self.raw[self.next_chunk:line_end]).split(b";")[0], 16)
            except ValueError:
                raise Failure("malformed", f"a bad chunk size line: {bytes(self.raw[self.next_chunk:line_end])[:40]!r}")
            if size == 0:
                self.body_end = line_end + 4
                return len(self.raw) >= self.body_end
            following = line_end + 2 + size + 2
            if following > len(self.raw):
                return False
            self.next_chunk = following

    def capture(self) -> tuple:
        """What ``body_pieces`` needs, kept apart from the connection (which the next request reuses)."""
        return bytes(self.raw), self.arrivals, self.head_end, self.framing == "chunked"

    def body(self) -> bytes:
        return b"".join(piece for _, piece in body_pieces(*self.capture()))


def body_pieces(raw: bytes, arrivals: list, head_end: int, chunked: bool) -> list[tuple[float, bytes]]:
    """The body as (when it had fully arrived, bytes), a piece per chunk (or per read)."""
    spans, at = [], head_end
    if not chunked:
        spans = [(max(at, start), end) for (_, start), (_, end) in zip([(0, at)] + arrivals, arrivals) if end > at]
    else:
        while True:
            line_end = raw.find(b"\r\n", at)
            size = int(raw[at:line_end].split(b";")[0], 16)
            if size == 0:
                break
            spans.append((line_end + 2, line_end + 2 + size))
            at = line_end + 2 + size + 2
    ends = [end for _, end in arrivals]
    return [(arrivals[bisect.bisect_left(ends, stop)][0], raw[begin:stop]) for begin, stop in spans]


class KernelStamped(Stream):
    """A plain TCP connection on Linux read with ``recvmsg``, each read carrying the kernel's own
    receive time (SO_TIMESTAMPNS): when the bytes reached this machine, however busy the client
    (or its CPU) was then. Same parsing as ``Stream``; the loop's wake-up time where a read has none."""

    def __init__(self, clock: StampingSelector, sock) -> None:
        super().__init__(clock)
        self.sock, self.loop = sock, asyncio.get_running_loop()
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.offset = time.time() - time.perf_counter()  # the kernel stamps on the wall clock
        self.loop.add_reader(sock.fileno(), self._readable)

    def send(self, data: bytes) -> None:
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):  # a full socket buffer (a long prompt): the rest as the socket drains
            self.loop.create_task(self.loop.sock_sendall(self.sock, data[sent:]))

    def close(self) -> None:
        if not self.closed:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.closed = True

    def _readable(self) -> None:
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(1 << 18, 64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, ancillary = b"", []
            if not data:
                self.close()
                self.connection_lost(None)
                return
            stamp = self.clock.woke
            for level, kind, value in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(value) >= 16:
                    seconds, nanoseconds = struct.unpack("qq", value[:16])
                    stamp = seconds + nanoseconds * 1e-9 - self.offset
            self.feed(data, stamp)


class Connections:
    """Idle keep-alive connections to one server, reused by the next request."""

    def __init__(self, host: str, port: int, clock: StampingSelector, tls: bool = False) -> None:
        self.host, self.port, self.clock, self.tls, self.idle = host, port, clock, tls, []

    async def take(self) -> Stream:
        while self.idle:
            stream = self.idle.pop()
            if not stream.closed:
                return stream
        try:
            if KERNEL_STAMPS and not self.tls:
                sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
                try:
                    sock.setblocking(False)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    await asyncio.get_running_loop().sock_connect(sock, (self.host, self.port))
                except BaseException:
                    sock.close()
                    raise
                return KernelStamped(self.clock, sock)
            _, stream = await asyncio.get_running_loop().create_connection(
                lambda: Stream(self.clock), self.host, self.port, ssl=True if self.tls else None)
            return stream
        except ConnectionRefusedError as exc:
            raise Failure("refused", f"connection refused by {self.host}:{self.port}") from exc
        except OSError as exc:
            raise Failure("unreachable", f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from exc

    def give_back(self, stream: Stream) -> None:
        self.idle.append(stream)

    def close(self) -> None:
        for stream in self.idle:
            stream.close()
        self.idle.clear()


def read_events(pieces: list, chat: bool) -> dict:
    """The stream's events: ``times`` of the chunks that carry a token, ``answer`` (when the first
    content came), ``usage`` (or None), ``text`` (content and reasoning), ``done`` ([DONE] came),
    ``id``."""
    times, usage, text, done, buffer, rid, answer = [], None, [], False, b"", None, None
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
                rid = rid or message.get("id")
                if message.get("error"):
                    raise Failure("stream error", str(message["error"])[:200])
                choices = message.get("choices") or []
                first = choices[0] if choices and isinstance(choices[0], dict) else {}
                if chat:
                    delta = first.get("delta") if isinstance(first.get("delta"), dict) else {}
                    if any(delta.get(field) for field in TOKEN_FIELDS) or (
                            delta.get("content") == "" and "role" not in delta):
                        times.append(stamp)
                        for field in ("reasoning", "reasoning_content", "content"):
                            if isinstance(delta.get(field), str):
                                text.append(delta[field])
                        if delta.get("content") and answer is None:
                            answer = stamp
                elif choices:  # a completion chunk is a token, its text empty or not (a special token)
                    times.append(stamp)
                    if isinstance(first.get("text"), str):
                        text.append(first["text"])
                        if first["text"] and answer is None:
                            answer = stamp
                if isinstance(message.get("usage"), dict):
                    usage = message["usage"]
    return {"times": times, "answer": answer, "usage": usage, "text": "".join(text), "done": done, "id": rid}


async def one_request(conns: Connections, path: str, body: bytes, chat: bool, extra: str = "") -> dict:
    """Send one streaming request (``extra``: more header lines); its record: start, token times,
    end, usage (or a Failure)."""
    start = time.perf_counter()
    stream = await conns.take()
    head = (f"POST {path} HTTP/1.1\r\nHost: {conns.host}:{conns.port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\n{extra}Content-Length: {len(body)}\r\n\r\n").encode()
    reuse = False
    try:
        await stream.begin(head + body)
        if stream.status != 200:
            text = stream.body()[:300].decode(errors="replace")
            raise Failure(f"HTTP {stream.status}", f"HTTP {stream.status} {stream.reason}: {' '.join(text.split())[:200]}")
        reuse = stream.framing != "close" and stream.headers.get("connection", "").lower() != "close" and \
            len(stream.raw) == stream.body_end
        return {"ok": True, "start": start, "end": stream.arrivals[-1][0], "capture": stream.capture()}
    finally:
        if reuse:
            conns.give_back(stream)
        else:
            stream.close()


async def _guarded(conns, path, body, chat, extra: str, timeout: float, index: int) -> dict:
    """One request with its deadline: a timer that cancels this task (``wait_for`` would add a
    task per request, work the loop does while other streams wait)."""
    start = time.perf_counter()
    expired: list[bool] = []
    task = asyncio.current_task()
    timer = asyncio.get_running_loop().call_later(timeout, lambda: (expired.append(True), task.cancel()))
    try:
        record = await one_request(conns, path, body, chat, extra)
    except Failure as exc:
        record = {"ok": False, "kind": exc.kind, "error": str(exc), "start": start}
    except asyncio.CancelledError:
        if not expired:
            raise  # the run was stopped
        record = {"ok": False, "kind": "timeout", "error": f"no complete answer within {timeout:g} s", "start": start}
    except OSError as exc:
        record = {"ok": False, "kind": "disconnected", "error": f"{type(exc).__name__}: {exc}", "start": start}
    finally:
        timer.cancel()
    record["index"] = index
    return record


def read_record(record: dict, chat: bool) -> dict:
    """A streamed record's events, read once the level has ended (parsing JSON while streams run
    would delay the next chunk's time): token times, usage, id; or the failure they show."""
    if not record["ok"]:
        return record
    pieces = body_pieces(*record.pop("capture"))
    try:
        events = read_events(pieces, chat)
        if not events["times"]:
            raise Failure("malformed", "the stream carried no token" + ("" if events["done"] else " and no [DONE]"))
    except Failure as exc:
        return {**{k: record[k] for k in ("start", "index", "arrival")}, "ok": False, "kind": exc.kind,
                "error": str(exc)}
    del events["done"]
    return {**record, **events}


def arrivals(count: int, rate: float | None, burstiness: float, seed: int) -> list[float]:
    """When each request arrives, in seconds from the level's start, as vllm's ``get_request``:
    gaps drawn from a gamma distribution (shape ``burstiness``: 1 is Poisson) at ``rate``, then
    scaled so the last arrives at ``count / rate``; all at 0 without a rate."""
    if not rate:
        return [0.0] * count
    rng = random.Random(seed)
    if math.isinf(burstiness):
        gaps = [1.0 / rate] * count
    else:
        gaps = [rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in range(count)]
    times, total = [], 0.0
    for gap in gaps:
        total += gap
        times.append(total)
    scale = count / rate / total if total else 1.0
    return [t * scale for t in times]


def reset_prefix_cache(base_url: str, headers: dict) -> str:
    """``POST /reset_prefix_cache`` at the server's root: "reset" when it answers 200 (vLLM answers
    so without saying what it did), else why not (vLLM has the route only in its dev mode)."""
    parts = urllib.parse.urlsplit(base_url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, parts.port, timeout=RESET_TIMEOUT)
    try:
        conn.request("POST", parts.path.rstrip("/").removesuffix("/v1") + "/reset_prefix_cache", b"",
                     {"Content-Length": "0", **headers})
        reply = conn.getresponse()
        reply.read()
        return "reset" if reply.status == 200 else f"HTTP {reply.status}"
    except (OSError, http.client.HTTPException) as exc:
        return f"no answer ({type(exc).__name__})"
    finally:
        conn.close()


async def run_level(config: dict, level: dict, clock: StampingSelector) -> dict:
    """One level: the prefix cache reset if asked, its warm-ups, then its requests on their
    schedule, at most ``level["concurrency"]`` at once (None: no cap); stops at the run's deadline."""
    chat = config.get("chat", False)
    host, port, path, tls = endpoint(config["base_url"], chat)
    conns = Connections(host, port, clock, tls)
    cap = level.get("concurrency")
    gate = asyncio.Semaphore(cap) if cap else None
    timeout = float(config.get("timeout", 300.0))
    headers = config.get("headers", {})
    extra = "".join(f"{key}: {value}\r\n" for key, value in headers.items())
    reset = await asyncio.to_thread(reset_prefix_cache, config["base_url"], headers) if level.get("reset") else None

    async def limited(body: bytes, index: int, arrival: float) -> dict:
        if gate is None:
            record = await _guarded(conns, path, body, chat, extra, timeout, index)
        else:
            async with gate:
                record = await _guarded(conns, path, body, chat, extra, timeout, index)
        record["arrival"] = arrival
        return record

    warmups = [request_body(config, r) for r in level.get("warmups", [])]
    bodies = [request_body(config, r) for r in level["requests"]]
    schedule = arrivals(len(bodies), config.get("request_rate"), float(config.get("burstiness", 1.0)),
                        int(level.get("seed", 0)))
    tasks = []
    collecting = gc.isenabled()
    gc.disable()  # a collection while streams run would delay the chunks behind it
    try:
        if warmups:
            tasks = [asyncio.ensure_future(limited(b, -1, time.perf_counter())) for b in warmups]
            await asyncio.gather(*tasks)
            tasks = []
        started = time.perf_counter()
        for i, body in enumerate(bodies):
            wait = started + schedule[i] - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.ensure_future(limited(body, i, time.perf_counter())))
        records = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        conns.close()
        if collecting:
            gc.enable()
    duration = time.perf_counter() - started
    return {"concurrency": cap, "request_rate": config.get("request_rate"), "duration": duration, "reset": reset,
            "warmups": len(warmups), "records": [read_record(r, chat) for r in records]}


async def run_all(config: dict, clock: StampingSelector) -> list[dict]:
    return [await run_level(config, level, clock) for level in config["levels"]]


def run(config: dict, stop: threading.Event | None = None) -> list[dict]:
    """Every level of ``config`` in turn, on a new event loop on this thread; the raw levels (each
    with its records). ``config["deadline"]`` seconds bound the whole run; setting ``stop`` (from
    another thread) ends it at once, as Ctrl-C does."""
    clock = StampingSelector()

    async def main():
        task = asyncio.ensure_future(run_all(config, clock))
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

    loop = asyncio.SelectorEventLoop(clock)
    try:
        return loop.run_until_complete(main())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


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
