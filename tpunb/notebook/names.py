"""The name a new slice gets: the one asked for if it is free and valid (as Cloud TPU node names
are), else a one-line error; with none asked for, the backend's base, base-2, base-3 ..."""
from __future__ import annotations

import re
from collections.abc import Container

from tpunb import provision
from tpunb.errors import NoSliceError, UsageError
from tpunb.registry import Registry


def taken(name: str, reg: Registry, attached: Container[str]) -> bool:
    """In use: attached here, or recorded (a local slice whose kernel is gone may be reused)."""
    record = reg.get_slice(name)
    return name in attached or (record is not None and not provision.backend(record.backend).name_reusable(record))


def claim(name: str | None, base: str, reg: Registry, attached: Container[str]) -> str:
    """``name`` if free (else a one-line error), or the first free of base, base-2, ..."""
    if name is None:
        candidate, n = base, 1
        while taken(candidate, reg, attached):
            n += 1
            candidate = f"{base}-{n}"
        return candidate
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
        raise UsageError(f"slice name {name!r}: use lowercase letters, digits and '-', starting with a letter "
                         "(as Cloud TPU node names)")
    if taken(name, reg, attached):
        raise UsageError(f"a slice named {name!r} exists: attach with %tpu_use {name}, or %tpu_down {name} first")
    return name


def unknown(name: str, reg: Registry) -> NoSliceError:
    """The error for a name no record (and no cloud) knows, with the names that are known."""
    known = [r.name for r in reg.list_slices()]
    return NoSliceError(f"no slice named {name!r}: " + (f"known slices: {', '.join(known)}" if known else
                                                         "launch one with %tpu_launch v4-16"))
