"""A small OpenAI-compatible server with known delays, for benchmarks, tests and tutorials.

It streams ``max_tokens`` tokens (" t0 t1 ...") for ``POST /v1/completions`` and
``/v1/chat/completions``: the first ``--ttft`` seconds after the request arrived, the next every
``--itl`` seconds after it (on a fixed schedule, so delays do not add up), then the usage chunk
when the request asks for it (``stream_options.include_usage``) unless ``--no-usage``.

A token is a whitespace-separated word; each new word gets the next id, so ``POST /tokenize``
and ``POST /detokenize`` (vLLM's routes and fields) turn text into ids and back. Prefill can cost
time per token: ``--prefill-ms-per-token`` adds that much to the first token for each prompt token
that its block prefix cache does not hold (``--prefix-cache``: blocks of ``--block-size`` tokens
from the first, each block known by its tokens and every token before it, as vLLM's automatic
prefix caching keys them; a prompt's full blocks are cached once its first token is sent).
``--dev-mode`` exposes ``POST /reset_prefix_cache``, as vLLM does only with
``VLLM_SERVER_DEV_MODE=1``. ``--reasoning N`` streams a chat answer's first N tokens as
``delta.reasoning`` (``--reasoning-field reasoning_content``: older vLLM and SGLang), as a
reasoning parser does, and opens every chat stream with vLLM's role chunk.

It also answers ``GET /v1/models`` and ``GET /health``, logs the time it sent each chunk
(``time.perf_counter()``, one clock for every process of a machine) so a client's own error can be
measured, and it can misbehave on purpose: ``--fail STATUS`` (every ``--fail-every`` N-th request),
``--stall`` after the first token, ``--malformed`` (a chunk that is not JSON).

Run it as a program (``python3 toy_llm.py --port 8000 --ttft 0.3 --itl 0.02``, e.g. as a service)
or in a process with ``ToyLLM(...).start()``. One file of the standard library.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import threading
import time

MAX_BODY = 16 << 20


@dataclasses.dataclass
class Behaviour:
    ttft: float = 0.05
    itl: float = 0.01
    tokens: int = 16  # when a request gives no max_tokens
    usage: bool = True
    fail: int | None = None  # an HTTP status to answer with instead of streaming
    fail_every: int = 1
    stall: bool = False
    malformed: bool = False
    model: str = "toy"
    api_key: str | None = None  # then every route but /health asks for "Authorization: Bearer KEY"
    prefill_per_token: float = 0.0  # seconds added to the first token per prompt token not in the cache
    prefix_cache: bool = False
    block_size: int = 16
    dev_mode: bool = False  # POST /reset_prefix_cache answers (vLLM: VLLM_SERVER_DEV_MODE=1)
    reasoning: int = 0  # a chat answer's first N tokens go as delta.<reasoning_field>
    reasoning_field: str = "reasoning"


@dataclasses.dataclass
class Sent:
    """One logged event: request ``request`` (its id) sent chunk ``kind`` at ``t``."""

    request: str
    kind: str  # received, token, usage, done
    t: float


class ToyLLM:
    """The server; ``log`` holds what it sent (``Sent``), ``log_path`` gets them as JSON lines, and
    ``requests`` holds each completion request's body as it came."""

    def __init__(self, behaviour: Behaviour | None = None, host: str = "127.0.0.1", port: int = 0,
                 log_path: str | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.host, self.port, self.log_path = host, port, log_path
        self.log: list[Sent] = []
        self.requests: list[dict] = []
        self.count = 0
        self.vocabulary: dict[str, int] = {}
        self.words: list[str] = []
        self.cache = PrefixCache(self.behaviour.block_size)
        #: per completion request: (prompt tokens, tokens the cache held)
        self.prefills: list[tuple[int, int]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server = None
        self._ready = threading.Event()

    # -- running ------------------------------------------------------------------------------
    async def serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._connection, self.host, self.port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        async with self._server:
            try:
                await self._server.serve_forever()
            except asyncio.CancelledError:
                pass

    def start(self) -> ToyLLM:
        """Serve on a thread of this process; returns once it listens (``port`` is then set)."""
        threading.Thread(target=asyncio.run, args=(self.serve(),), daemon=True, name="toy-llm").start()
        if not self._ready.wait(30):
            raise RuntimeError("the toy server did not start within 30 s")
        return self

    def close(self) -> None:
        if self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    # -- HTTP ---------------------------------------------------------------------------------
    async def _connection(self, reader, writer) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def _one(self, reader, writer) -> bool:
        """Answer one request; False when the connection is to end."""
        line = await reader.readline()
        if not line:
            return False
        method, path, _ = line.decode("latin-1").split(" ", 2)
        headers = {}
        while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
            key, _, value = header.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        length = int(headers.get("content-length", 0))
        body = await reader.readexactly(length) if 0 < length <= MAX_BODY else b""
        path = path.split("?", 1)[0]
        if method == "GET" and path in ("/health", "/"):
            return await self._json(writer, 200, {"status": "ok"})
        if self.behaviour.api_key and headers.get("authorization") != f"Bearer {self.behaviour.api_key}":
            return await self._json(writer, 401, {"error": {"message": "Unauthorized", "code": 401}})
        if method == "GET" and path in ("/v1/models", "/models"):
            return await self._json(writer, 200, {"object": "list", "data": [
                {"id": self.behaviour.model, "object": "model", "owned_by": "tpunb"}]})
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            return await self._json(writer, 400, {"error": {"message": "the body is not JSON", "code": 400}})
        if method == "POST" and path == "/tokenize":
            ids = self.ids(_words(request))
            return await self._json(writer, 200, {"count": len(ids), "tokens": ids, "max_model_len": 1 << 20})
        if method == "POST" and path == "/detokenize":
            ids = request.get("tokens")
            if not isinstance(ids, list) or not all(isinstance(i, int) and 0 <= i < len(self.words) for i in ids):
                return await self._json(writer, 400, {"error": {"message": "tokens: ids this server gave", "code": 400}})
            return await self._json(writer, 200, {"prompt": " ".join(self.words[i] for i in ids)})
        if method == "POST" and path == "/reset_prefix_cache" and self.behaviour.dev_mode:
            self.cache.clear()
            return await self._empty(writer)
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            return await self._complete(writer, request, chat=path.endswith("chat/completions"))
        return await self._json(writer, 404, {"error": {"message": f"no route {method} {path}", "code": 404}})

    def ids(self, words: list[str]) -> list[int]:
        """Each word's id, a new word getting the next one."""
        for word in words:
            if word not in self.vocabulary:
                self.vocabulary[word] = len(self.words)
                self.words.append(word)
        return [self.vocabulary[word] for word in words]

    async def _empty(self, writer) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        return True

    async def _json(self, writer, status: int, value: dict) -> bool:
        body = json.dumps(value).encode()
        writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            status, _REASONS.get(status, b"Error"), len(body), body))
        await writer.drain()
        return True

    async def _complete(self, writer, request: dict, chat: bool) -> bool:
        b = self.behaviour
        arrived = self._loop.time()
        self.requests.append(request)
        self.count += 1
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self.count}"
        sent = self._note([], rid, "received")
        if b.fail and self.count % max(1, b.fail_every) == 0:
            return await self._json(writer, b.fail, {"error": {"message": f"failing on purpose ({b.fail})",
                                                               "code": b.fail}})
        if not request.get("stream"):
            return await self._json(writer, 400, {"error": {"message": "this server only streams", "code": 400}})
        tokens = int(request.get("max_completion_tokens") or request.get("max_tokens") or b.tokens)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        model = request.get("model") or b.model
        prompt = self.ids(_words(request))
        held = self.cache.held(prompt) if b.prefix_cache else 0
        self.prefills.append((len(prompt), held))
        first = b.ttft + b.prefill_per_token * (len(prompt) - held)
        kind = "chat.completion.chunk" if chat else "text_completion"
        try:
            for k in range(tokens):
                await asyncio.sleep(max(0.0, arrived + first + k * b.itl - self._loop.time()))
                if k == 0 and b.prefix_cache:
                    self.cache.add(prompt)
                if k == 0 and chat:  # vLLM opens a chat stream with the role, no token
                    _event(writer, {"id": rid, "object": kind, "model": model, "choices": [
                        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
                piece = f" t{k}"
                if chat:
                    delta = {b.reasoning_field: piece, "content": None} if k < b.reasoning else {"content": piece}
                    choice = {"index": 0, "delta": delta}
                else:
                    choice = {"index": 0, "text": piece}
                choice["finish_reason"] = "length" if k == tokens - 1 else None
                _event(writer, {"id": rid, "object": kind, "model": model, "choices": [choice]})
                self._note(sent, rid, "token")
                if k == 0 and b.malformed:
                    writer.write(_chunk(b"data: {not json\n\n"))
                if k == 0 and b.stall:
                    await writer.drain()
                    await asyncio.Event().wait()  # never: the client's deadline has to end it
            if b.usage and (request.get("stream_options") or {}).get("include_usage"):
                _event(writer, {"id": rid, "object": kind, "model": model, "choices": [], "usage": {
                    "prompt_tokens": len(prompt), "completion_tokens": tokens, "total_tokens": len(prompt) + tokens}})
                self._note(sent, rid, "usage")
            writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
            self._note(sent, rid, "done")
        finally:
            self._write(sent)
        return True

    def _note(self, sent: list[Sent], rid: str, kind: str) -> list[Sent]:
        """Log one event now (``log`` is read while requests run); the file gets them at the end."""
        event = Sent(rid, kind, time.perf_counter())
        sent.append(event)
        self.log.append(event)
        return sent

    def _write(self, sent: list[Sent]) -> None:
        if self.log_path:
            with open(self.log_path, "a") as f:
                f.write("".join(json.dumps(dataclasses.asdict(s)) + "\n" for s in sent))


class PrefixCache:
    """Full blocks of ``size`` tokens from the first, each known by a hash of its tokens and the
    hash of the block before it (so a block is held only with everything before it)."""

    def __init__(self, size: int) -> None:
        self.size, self.blocks = max(1, size), set()

    def _keys(self, tokens: list[int]) -> list[bytes]:
        keys, parent = [], b""
        for start in range(0, len(tokens) - self.size + 1, self.size):
            parent = hashlib.sha256(parent + json.dumps(tokens[start:start + self.size]).encode()).digest()
            keys.append(parent)
        return keys

    def held(self, tokens: list[int]) -> int:
        """How many of the first tokens the cache holds (whole blocks)."""
        count = 0
        for key in self._keys(tokens):
            if key not in self.blocks:
                break
            count += self.size
        return count

    def add(self, tokens: list[int]) -> None:
        self.blocks.update(self._keys(tokens))

    def clear(self) -> None:
        self.blocks.clear()


_REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 404: b"Not Found", 429: b"Too Many Requests",
            500: b"Internal Server Error", 503: b"Service Unavailable"}


def _words(request: dict) -> list[str]:
    if "messages" in request:
        return " ".join(str(m.get("content", "")) for m in request["messages"]).split()
    prompt = request.get("prompt", "")
    return (prompt if isinstance(prompt, str) else " ".join(map(str, prompt))).split()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(writer, value: dict) -> None:
    writer.write(_chunk(b"data: " + json.dumps(value).encode() + b"\n\n"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="an OpenAI-compatible server with known delays")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--ttft", type=float, default=0.05, help="seconds from a request to its first token")
    parser.add_argument("--itl", type=float, default=0.01, help="seconds between tokens")
    parser.add_argument("--model", default="toy")
    parser.add_argument("--no-usage", action="store_true", help="never send the usage chunk")
    parser.add_argument("--fail", type=int, default=None, metavar="STATUS", help="answer with this HTTP status")
    parser.add_argument("--fail-every", type=int, default=1, metavar="N", help="only every N-th request fails")
    parser.add_argument("--stall", action="store_true", help="stop sending after the first token")
    parser.add_argument("--malformed", action="store_true", help="send a chunk that is not JSON")
    parser.add_argument("--log", default=None, help="append each sent chunk's time here (JSON lines)")
    parser.add_argument("--api-key", default=None, help="answer only requests with Authorization: Bearer KEY")
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.0,
                        help="ms added to the first token per prompt token the prefix cache does not hold")
    parser.add_argument("--prefix-cache", action="store_true", help="cache prompts' full blocks, as vLLM does")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per cached block")
    parser.add_argument("--dev-mode", action="store_true", help="expose POST /reset_prefix_cache")
    parser.add_argument("--reasoning", type=int, default=0, metavar="N",
                        help="a chat answer's first N tokens go as reasoning, not content")
    parser.add_argument("--reasoning-field", default="reasoning", choices=["reasoning", "reasoning_content"])
    args = parser.parse_args(argv)
    behaviour = Behaviour(ttft=args.ttft, itl=args.itl, usage=not args.no_usage, fail=args.fail,
                          fail_every=args.fail_every, stall=args.stall, malformed=args.malformed, model=args.model,
                          api_key=args.api_key, prefill_per_token=args.prefill_ms_per_token / 1000,
                          prefix_cache=args.prefix_cache, block_size=args.block_size, dev_mode=args.dev_mode,
                          reasoning=args.reasoning, reasoning_field=args.reasoning_field)
    try:
        asyncio.run(ToyLLM(behaviour, args.host, args.port, args.log).serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
