"""The served model's tokens, for ``%tpu_bench``: a tokenizer given with ``--tokenizer PATH``
(transformers' AutoTokenizer on a model folder, else the ``tokenizers`` package on a
tokenizer.json), or the server's own ``POST /tokenize`` and ``POST /detokenize`` (vLLM's routes;
SGLang answers them too). Both encode text to ids, decode ids to text, and name the ids a random
prompt may use: a local tokenizer its whole vocabulary less the special tokens (as vLLM's random
dataset); the server, which says nothing of its vocabulary, the ids of a sample text it tokenized.
"""
from __future__ import annotations

import http.client
import json
import random
import string
import threading
import urllib.parse
from pathlib import Path
from typing import Callable

from tpunb.errors import UsageError

#: words in the sample text whose tokens are a server tokenizer's ids for random prompts
SAMPLE_WORDS = 4000
#: seconds one tokenize or detokenize call may take
CALL_TIMEOUT = 30.0


class Tokenizer:
    """``encode(text) -> ids``, ``decode(ids) -> text`` (None: a server without /detokenize),
    ``allowed`` (ids a prompt may use, in order) and ``whole`` (``allowed`` is the whole
    vocabulary: vLLM's rotations of it are distinct)."""

    def __init__(self, source: str, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str] | None,
                 allowed: list[int], whole: bool) -> None:
        self.source, self.encode, self.decode, self.allowed, self.whole = source, encode, decode, allowed, whole

    def count(self, text: str) -> int:
        return len(self.encode(text))


def local(path: str) -> Tokenizer:
    """``--tokenizer PATH``: a model folder or its tokenizer.json; a one-line UsageError otherwise."""
    where = Path(path).expanduser()
    if not where.exists():
        raise UsageError(f"--tokenizer {path}: no such file or folder (a model folder, or its tokenizer.json)")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        AutoTokenizer = None
    if AutoTokenizer is not None and where.is_dir():  # a model folder: its own tokenizer class and settings
        made = _load(path, lambda: AutoTokenizer.from_pretrained(str(where)))
        special = set(getattr(made, "all_special_ids", []) or [])
        allowed = [i for i in range(len(made)) if i not in special]
        return Tokenizer(f"--tokenizer {path}", lambda text: list(made.encode(text, add_special_tokens=False)),
                         lambda ids: made.decode(ids), allowed, True)
    try:
        from tokenizers import Tokenizer as Raw
    except ImportError:
        raise UsageError("--tokenizer needs transformers or tokenizers: pip install tokenizers") from None
    file = where / "tokenizer.json" if where.is_dir() else where
    if not file.exists():
        raise UsageError(f"--tokenizer {path}: no tokenizer.json there (give the file, or install transformers)")
    made = _load(path, lambda: Raw.from_file(str(file)))
    special = {token.id for token in _added(made) if token.special}
    allowed = [i for i in range(made.get_vocab_size(with_added_tokens=True)) if i not in special]
    return Tokenizer(f"--tokenizer {path}", lambda text: made.encode(text, add_special_tokens=False).ids,
                     lambda ids: made.decode(ids, skip_special_tokens=False), allowed, True)


def _added(made) -> list:
    try:
        return list(made.get_added_tokens_decoder().values())
    except AttributeError:  # an older tokenizers
        return []


def _load(path: str, make: Callable[[], object]):
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - the libraries raise many kinds for a file they cannot read
        raise UsageError(f"--tokenizer {path}: cannot read it ({' '.join(str(exc).split())[:200]})") from None


class ServerCalls:
    """POSTs to the server's root (beside /v1) on a keep-alive connection per thread."""

    def __init__(self, base_url: str, headers: dict) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.parts, self.headers = parts, {"Content-Type": "application/json", **headers}
        self.root = parts.path.rstrip("/").removesuffix("/v1")
        self.local = threading.local()

    def post(self, route: str, body: dict) -> dict:
        for attempt in (0, 1):  # a keep-alive connection the server closed: once more on a new one
            conn = getattr(self.local, "conn", None)
            if conn is None:
                kind = http.client.HTTPSConnection if self.parts.scheme == "https" else http.client.HTTPConnection
                conn = self.local.conn = kind(self.parts.hostname, self.parts.port, timeout=CALL_TIMEOUT)
            try:
                conn.request("POST", self.root + route, json.dumps(body).encode(), self.headers)
                reply = conn.getresponse()
                data = reply.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
                continue
            if reply.status != 200:
                raise ValueError(f"HTTP {reply.status} from {route}")
            return json.loads(data)
        raise OSError("unreachable")


def server(base_url: str, model: str, headers: dict) -> Tokenizer | None:
    """The server's /tokenize and /detokenize (``decode`` None when it has no /detokenize); None
    when it does not tokenize."""
    calls = ServerCalls(base_url, headers)

    def encode(text: str) -> list[int]:
        return [int(i) for i in calls.post("/tokenize", {"model": model, "prompt": text,
                                                         "add_special_tokens": False})["tokens"]]

    def decode(ids: list[int]) -> str:
        return str(calls.post("/detokenize", {"model": model, "tokens": list(ids)})["prompt"])

    rng = random.Random(0)
    sample = " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 9)))
                      for _ in range(SAMPLE_WORDS))
    failures = (OSError, ValueError, KeyError, TypeError, http.client.HTTPException)
    try:
        allowed = sorted(set(encode(sample)))
    except failures:
        return None
    try:
        decode(allowed[:4])
    except failures:
        return Tokenizer("the server's /tokenize", encode, None, allowed, False)
    return Tokenizer("the server's /tokenize and /detokenize", encode, decode, allowed, False)
