"""Secret values masked in text and in a stream of bytes, in every form a value takes in output:
what the kernel's masker (``tpunb/engine/masking.py``) and each service's supervisor on a host
(``service.py``, which the kernel sends this file ahead of) both apply, so both hide the same forms.

Shipped to hosts: standard library only.
"""
from __future__ import annotations

import base64
import json
import os
import urllib.parse

#: shorter values (and forms of them) would mask ordinary text: never masked
MIN_SECRET = 8
#: what a masked value becomes
MASK = "****"


def secret_forms(value: str) -> list[str]:
    """The forms a secret takes in output, each to be masked, longest first: the value; each
    trimmed line of a multi-line value; its JSON escaping (and with ``\\/``); its percent-encoding
    (``%20`` and ``+`` for spaces); and the core of its base64 at each of the three byte alignments,
    which is the base64 of its whole 3-byte groups (no padding, no partial last character, standard
    and URL-safe alphabets), so the value is found inside a longer encoded stream
    (``echo user:$TOKEN | base64``) whatever precedes it. Forms under MIN_SECRET characters are left
    out. GitHub Actions' runner registers padded base64 forms (``HostContext``'s value encoders);
    their cores are what survive the value being part of a longer encoding."""
    found = {value}
    found.update(line.strip() for line in value.splitlines())
    escaped = json.dumps(value)[1:-1]
    found.update({escaped, json.dumps(value, ensure_ascii=False)[1:-1], escaped.replace("/", "\\/")})
    found.update({urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value, safe="")})
    raw = value.encode()
    for shift in range(3):
        whole = raw[shift:][:(len(raw) - shift) // 3 * 3]
        if whole:
            found.update({base64.b64encode(whole).decode(), base64.urlsafe_b64encode(whole).decode()})
    return sorted((form for form in found if len(form) >= MIN_SECRET), key=lambda form: (-len(form), form))


class MaskedLog:
    """The log as the command writes it, with each secret value replaced by ``****`` first.

    With no secret, the command writes the log file itself (``out`` is the log). Otherwise ``out``
    is a pipe that ``drain`` copies to the log, masked; a tail that could begin a value is held
    back until the next read says whether it does (a value split across two writes), and let go
    at the command's end."""

    def __init__(self, log: int, values: list[str]) -> None:
        self.log = log
        self.values = sorted({form.encode() for v in values if len(v) >= MIN_SECRET for form in secret_forms(v)},
                             key=len, reverse=True)
        self.held = b""
        self.read_end: int | None = None
        self.out = log
        if self.values:
            self.read_end, self.out = os.pipe()
            os.set_blocking(self.read_end, False)

    def text(self, text: str) -> str:
        """``text`` (the command line, kept in the state file) with every secret form masked."""
        for value in self.values:
            text = text.replace(value.decode(errors="replace"), MASK)
        return text

    def drain(self) -> None:
        """Copy what the command wrote so far to the log, masked."""
        if self.read_end is None:
            return
        data = self.held
        for _ in range(64):  # at most 4 MiB a call: a command that writes without pause cannot hold the loop
            try:
                chunk = os.read(self.read_end, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        for value in self.values:
            data = data.replace(value, MASK.encode())
        keep = self._partial(data)
        self.held = data[len(data) - keep:] if keep else b""
        data = data[:len(data) - keep]
        self._write(data)

    def flush(self) -> None:
        """The command ended (or the supervisor speaks): what it wrote goes to the log, a held tail too."""
        self.drain()
        held, self.held = self.held, b""
        self._write(held)

    def _write(self, data: bytes) -> None:
        while data:
            data = data[os.write(self.log, data):]

    def _partial(self, data: bytes) -> int:
        """How many bytes at the end of ``data`` could begin a secret's form (0: none)."""
        return held_tail(data, self.values)


def held_tail(text, forms) -> int:
    """How many characters (or bytes) at the end of ``text`` could begin one of ``forms``: the
    tail to hold back until more of the stream says whether it does (0: none). The window is the
    longest form's, and only places where a form's first character stands are tried."""
    longest = 0
    for form in forms:
        at = text.find(form[:1], max(0, len(text) - len(form) + 1))
        while at != -1 and len(text) - at > longest:  # the earliest match is this form's longest tail
            if form.startswith(text[at:]):
                longest = len(text) - at
                break
            at = text.find(form[:1], at + 1)
    return longest
