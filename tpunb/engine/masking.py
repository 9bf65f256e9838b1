"""Secrets masked in everything a host sends back, before it reaches the notebook, a log or a
result: each value becomes ``****``, as CI systems mask theirs (GitHub Actions' ``add-mask``), in
every form it takes in output (``secret_forms``: each line, JSON and percent escapes, base64 at
each byte alignment), the same forms the hosts' service supervisors mask in their logs.

A host's output arrives in stream frames cut anywhere, so a value can straddle two frames: the end
of a stream frame that could be the start of a secret is held back (per host, request and stream)
until the next frame of that stream says whether it is, or the request ends. Every other frame
(errors and their tracebacks, displays, results, events) is masked field by field. With no secret
set, frames pass untouched (one attribute test per frame)."""
from __future__ import annotations

import threading
from typing import Any

from tpunb.host.standalone.log_mask import MASK, MIN_SECRET, held_tail, secret_forms

#: shorter values would mask ordinary words: they are refused as secrets
MIN_LENGTH = MIN_SECRET


class Masker:
    """The kernel's secret values and, per (host, request, stream), a tail held back."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()
        self._values: tuple[str, ...] = ()  # every form of every secret, longest first
        self._held: dict[tuple[int, Any, str], str] = {}
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return bool(self._values)

    def add(self, value: str) -> None:
        """Mask ``value`` and its forms from now on (longest first, so one inside another is masked whole)."""
        if len(value) < MIN_LENGTH:
            raise ValueError(f"a secret of {len(value)} characters would mask ordinary text")
        with self._lock:
            self._secrets.add(value)
            self._values = tuple(sorted(set(self._values) | set(secret_forms(value)), key=len, reverse=True))

    def secret_names(self, env: dict[str, str]) -> list[str]:
        """The names in ``env`` whose values are secrets: what a host is told to mask (never the values)."""
        return sorted(k for k, v in env.items() if v in self._secrets)

    def text(self, text: str) -> str:
        """``text`` with every secret value replaced by ``****``."""
        for value in self._values:
            if value in text:
                text = text.replace(value, MASK)
        return text

    def frames(self, host: int, message: dict) -> list[dict]:
        """What to route in place of ``message``: masked, with a held tail let go once it is known."""
        if not self._values:
            return [message]
        op = message.get("op")
        if op == "stream":
            return self._stream(host, message)
        out = self._release(host, message.get("id")) if op in ("done", "died") else []
        return out + [self.deep(message)]

    def deep(self, value: Any) -> Any:
        """Every string in ``value`` (dicts and lists walked) masked."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.deep(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.deep(v) for v in value]
        return value

    def _stream(self, host: int, message: dict) -> list[dict]:
        key = (host, message.get("id"), message.get("name", "stdout"))
        with self._lock:
            text = self.text(self._held.pop(key, "") + str(message.get("text", "")))
            keep = self._partial(text)
            if keep:
                self._held[key] = text[len(text) - keep:]
                text = text[:len(text) - keep]
        return [{**message, "text": text}] if text else []

    def _partial(self, text: str) -> int:
        """How many characters at the end of ``text`` could begin a secret's form (0: none)."""
        return held_tail(text, self._values)

    def _release(self, host: int, rid: Any) -> list[dict]:
        """The tails held for this host (and request, if it has one), as the stream frames they were."""
        with self._lock:
            keys = [k for k in self._held if k[0] == host and (rid is None or k[1] == rid)]
            return [{"op": "stream", "id": k[1], "name": k[2], "text": self._held.pop(k)} for k in keys]
