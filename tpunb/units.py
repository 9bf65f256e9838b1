"""Durations and byte counts as people write and read them, in one place, so every flag reads
``30m`` alike and every size prints in honest binary units (KiB, MiB, GiB)."""
from __future__ import annotations

import re

from tpunb.errors import UsageError

_SECONDS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = r"(\d+(?:\.\d+)?|\.\d+)\s*(min|s|m|h|d|w)"
_OFF = ("0", "off", "never", "none", "")


def parse_duration(value: str | float | int | None, flag: str = "duration", *, off: bool = False) -> float:
    """Seconds from ``"90s"``, ``"30m"``, ``"2h"``, ``"1d"``, ``"2w"`` or ``"1h30m"``.

    A Python number is seconds; text needs a unit (a bare ``"30"`` is an error, since flags have
    meant hours and seconds before). ``off=True``: None, 0, ``"off"`` or ``"never"`` give 0."""
    hint = f"use 90s, 30m, 2h or 1d{' (0 or off: never)' if off else ''}"
    if off and (value is None or value is False):
        return 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if 0 <= value < float("inf"):
            return float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        if text == "0" or (off and text in _OFF):
            return 0.0
        if re.fullmatch(rf"(?:\s*{_PART})+\s*", text):
            return float(sum(float(n) * _SECONDS[unit] for n, unit in re.findall(_PART, text)))
    raise UsageError(f"{flag} takes a duration with a unit, not {value!r}: {hint}")


def format_duration(seconds: float) -> str:
    """1800 -> '30m', 5400 -> '1h30m', 3 -> '3s': durations as parse_duration reads them."""
    rest, parts = round(seconds), []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size or (unit == "s" and not parts):
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB', 3 * 2**30 -> '3.0 GiB', 512 -> '512 bytes': sizes in binary units."""
    if abs(n) < 1024:
        return f"{n:.0f} bytes"
    value = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def either(items: list[str]) -> str:
    """A list as a sentence offers it: ``a``, ``a or b``, ``a, b or c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]
