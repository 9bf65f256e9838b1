"""Prompts of a given length in the served model's tokens, for ``%tpu_bench --input-len``.

Lengths are counted by a tokenizer: ``--tokenizer PATH`` (transformers' AutoTokenizer, else the
``tokenizers`` package on a tokenizer.json), else the server's own ``POST /tokenize`` (vLLM and
SGLang answer it). Without either, a prompt of that many words is sent and one line says so.
Each request gets a different prompt (a rotation of the same words), so a prefix cache does not
answer them all from the first.
"""
from __future__ import annotations

import json
import random
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable

from tpunb import report
from tpunb.errors import UsageError

#: the words prompts are made of (common English: about one token each in most vocabularies)
WORDS = ("the of and to in is that for it as with was on be by at this from have or are not but an "
         "which one all were when we there can more their if will out so up said what about into than "
         "them only other new some time could these two may first then do any like my now over such "
         "our man me even most made after also did many before must through back years where much your "
         "way well down should because each just those people how too little state good very make world").split()


def prompts(count: int, input_len: int, tokenizer: str | None, base_url: str, model: str,
            seed: int = 0, headers: dict | None = None) -> tuple[list[str], list[int]]:
    """``count`` prompts of ``input_len`` tokens each (the first exactly, the others are its words
    rotated), and their lengths as counted."""
    counter = _local_counter(tokenizer) if tokenizer else _server_counter(base_url, model, headers or {})
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(max(1, input_len))]
    if counter is None:
        report.warn(f"[tpunb] no tokenizer: --input-len {input_len} counts words (give --tokenizer PATH, or serve "
                    "a model that answers POST /tokenize)")
        base, length = words, len(words)
    else:
        text = _fit(" ".join(words), input_len, counter, rng)
        base, length = text.split(), counter(text)
    texts = [" ".join(base[i % len(base):] + base[:i % len(base)]) for i in range(count)]
    return texts, [length] * count


def _fit(text: str, target: int, counter: Callable[[str], int], rng: random.Random) -> str:
    """The longest start of ``text`` (grown first if short) that counts at most ``target`` tokens:
    a binary search over characters, a few dozen counts at most."""
    while counter(text) < target:
        text += " " + " ".join(rng.choice(WORDS) for _ in range(max(1, target)))
    low, high = 1, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if counter(text[:middle].rstrip()) <= target:
            low = middle
        else:
            high = middle - 1
    return text[:low].rstrip()


def _local_counter(path: str) -> Callable[[str], int]:
    where = Path(path).expanduser()
    if not where.exists():
        raise UsageError(f"--tokenizer {path}: no such file or folder (a model folder, or its tokenizer.json)")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        AutoTokenizer = None
    if AutoTokenizer is not None and where.is_dir():  # a model folder: its own tokenizer class and settings
        made = _load(path, lambda: AutoTokenizer.from_pretrained(str(where)))
        return lambda text: len(made.encode(text, add_special_tokens=False))
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError("--tokenizer needs transformers or tokenizers: pip install tokenizers") from None
    file = where / "tokenizer.json" if where.is_dir() else where
    if not file.exists():
        raise UsageError(f"--tokenizer {path}: no tokenizer.json there (give the file, or install transformers)")
    made = _load(path, lambda: Tokenizer.from_file(str(file)))
    return lambda text: len(made.encode(text, add_special_tokens=False).ids)


def _load(path: str, make: Callable[[], object]):
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - the libraries raise many kinds for a file they cannot read
        raise UsageError(f"--tokenizer {path}: cannot read it ({' '.join(str(exc).split())[:200]})") from None


def _server_counter(base_url: str, model: str, headers: dict) -> Callable[[str], int] | None:
    """The server's ``POST /tokenize`` (at its root, beside /v1), if it answers one."""
    parts = urllib.parse.urlsplit(base_url)
    root = parts.path.rstrip("/").removesuffix("/v1")
    url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, root + "/tokenize", "", ""))

    def count(text: str) -> int:
        body = json.dumps({"model": model, "prompt": text, "add_special_tokens": False}).encode()
        request = urllib.request.Request(url, body, {"Content-Type": "application/json", **headers})
        with urllib.request.urlopen(request, timeout=10) as reply:  # the server's own work is small
            return int(json.load(reply)["count"])

    try:
        count("hello")
    except (OSError, ValueError, KeyError, TypeError, urllib.error.URLError):
        return None
    return count
