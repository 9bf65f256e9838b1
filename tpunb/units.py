"""Durations and byte counts as people read them, in one place: durations as flags take them
(``1h30m``), sizes in honest binary units (KiB, MiB, GiB)."""
from __future__ import annotations


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
