"""Quantities as people write them and as the planner shows them: counts, dtypes, times, money.

One place for the suffixes (``7B``, ``2^20``) and the readable forms (``8.03B``, ``14.8 s``,
``$9.60``), so the model, the estimator and the tables all read and print alike. Durations
people write (``36h``) are read by tpunb.units, as every other flag's are.
"""
from __future__ import annotations

import re
from typing import Union

from tpunb.errors import UsageError

GIB = 2**30
DTYPE_BYTES = {
    "fp32": 4.0, "float32": 4.0, "f32": 4.0,
    "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "float16": 2.0, "f16": 2.0,
    "fp8": 1.0, "float8": 1.0, "int8": 1.0, "i8": 1.0,
    "int4": 0.5, "i4": 0.5,
}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name (``bf16``, ``int8``, ``fp32``...)."""
    try:
        return DTYPE_BYTES[dtype.lower()]
    except (KeyError, AttributeError):
        raise UsageError(
            f"unknown dtype {dtype!r}: use one of {', '.join(sorted(set(DTYPE_BYTES) - {'f32', 'f16', 'i8', 'i4'}))}"
        ) from None


_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_count(value: Union[str, float, int], what: str = "count") -> float:
    """``"7B"`` -> 7e9, ``"1M"`` -> 1e6, ``"1Mi"`` or ``"2^20"`` -> 1048576, numbers unchanged."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip().lower().replace("_", "").replace(",", "")
    m = re.fullmatch(r"(\d+)\^(\d+)", text)
    if m:
        return float(int(m[1]) ** int(m[2]))
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*(ki|mi|gi|k|m|b|g|t)?", text)
    if not m:
        raise UsageError(f"cannot read {what} {value!r}: write it like 4096, 1M, 2^20, 7B or 1.5e12")
    return float(m[1]) * _SUFFIX[m[2] or ""]


def human_count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def _sig(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def human_time(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, size in (("years", 365 * 86400), ("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if s >= size:
            return f"{_sig(s / size)} {unit}"
    return f"{_sig(s * 1e3)} ms" if s >= 1e-3 else f"{_sig(s * 1e6)} us"


def money(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}" if x >= 0.01 else f"${x:.2g}"
