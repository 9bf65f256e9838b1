"""How hosts are named in output and picked by --hosts, and where each sits in a multislice.

Hosts are numbered 0..N-1 over every slice, slice 0's hosts first, as JAX numbers processes on a
Cloud TPU multislice (process id = slice id x hosts per slice + worker id). One slice keeps
plain numbers ("0-3"); several slices name hosts ``s1/3`` (host 3 of slice 1) and whole slices
``s1`` (or ``s0-1``), in labels and in ``--hosts`` alike, so what a label says can be typed back.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from tpunb.errors import UsageError

#: how hosts are named in labels: format_hosts ('0-3'), or Layout.names in a multislice ('s1/3')
HostNames = Callable[[Iterable[int]], str]
_SLICE_PART = re.compile(r"s(?P<slices>\*|-?\d+(?:-\d+)?)(?:/(?P<hosts>.+))?")


def format_hosts(hosts: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    ordered = sorted(set(hosts))
    parts, i = [], 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass(frozen=True)
class Layout:
    """``num_hosts`` hosts in ``num_slices`` equal slices, numbered slice by slice."""

    num_hosts: int
    num_slices: int = 1

    @property
    def hosts_per_slice(self) -> int:
        return self.num_hosts // self.num_slices

    @property
    def multislice(self) -> bool:
        return self.num_slices > 1

    def slice_of(self, host: int) -> int:
        return host // self.hosts_per_slice

    def hosts_of(self, slice_index: int) -> list[int]:
        start = slice_index * self.hosts_per_slice
        return list(range(start, start + self.hosts_per_slice))

    def name(self, host: int) -> str:
        """One host: '3', or 's1/1' in a multislice."""
        return self.names([host])

    def names(self, hosts: Iterable[int]) -> str:
        """Hosts as a label: '0-2,5'; in a multislice 's0/0-1,s1/3', whole slices as 's0-1'."""
        chosen = sorted(set(hosts))
        if not self.multislice:
            return format_hosts(chosen)
        by_slice: dict[int, list[int]] = {}
        for host in chosen:
            by_slice.setdefault(self.slice_of(host), []).append(host - self.slice_of(host) * self.hosts_per_slice)
        whole = [s for s, local in by_slice.items() if len(local) == self.hosts_per_slice]
        parts = [f"s{run}" for run in format_hosts(whole).split(",") if run]
        parts += [f"s{s}/{format_hosts(local)}" for s, local in by_slice.items() if s not in whole]
        return ",".join(sorted(parts, key=lambda p: int(re.match(r"s(\d+)", p).group(1))))

    def parse(self, spec: str | int | Sequence[int] | None) -> list[int]:
        """--hosts: 'all'; global numbers '0', '0,2', '1:3' (a Python slice), '-1'; in a multislice
        also 's1' (slice 1), 's0-1', 's1/0' (host 0 of slice 1), 's1/0-2', 's1/1:', 's*/0' (host 0
        of every slice) -> sorted global host indices. Anything else: a one-line UsageError."""
        if spec is None or (isinstance(spec, str) and spec.strip() in ("", "all")):
            return list(range(self.num_hosts))
        parts = [spec] if isinstance(spec, int) else (spec if isinstance(spec, (list, tuple)) else str(spec).split(","))
        hosts: list[int] = []
        for part in parts:
            part = str(part).strip()
            if part.startswith("s"):
                hosts.extend(self._slice_part(spec, part))
            else:
                hosts.extend(_pick(spec, part, self.num_hosts, "host", "this slice has", self._forms()))
        return sorted(set(hosts))

    def _forms(self) -> str:
        return ("all, 0, 0,2, 1:3, s1 (a slice), s1/0 (host 0 of slice 1) or s*/0 (host 0 of every slice)"
                if self.multislice else "all, 0, 0,2 or 1:3")

    def _slice_part(self, spec, part: str) -> list[int]:
        if not self.multislice:
            raise UsageError(f"--hosts {spec}: {part} names a slice of a multislice, and this is one slice: "
                             f"use {self._forms()}")
        match = _SLICE_PART.fullmatch(part)
        if match is None:
            raise UsageError(f"--hosts {spec}: {part} is not a host; use {self._forms()}")
        if match["slices"] == "*":
            chosen = list(range(self.num_slices))
        else:
            chosen = _pick(spec, match["slices"], self.num_slices, "slice", "this multislice has", self._forms(),
                           dash_range=True)
        if match["hosts"] is None:
            return [h for s in chosen for h in self.hosts_of(s)]
        local = _pick(spec, match["hosts"], self.hosts_per_slice, "host", "each slice has", self._forms(),
                      dash_range=True)
        return [self.hosts_of(s)[i] for s in chosen for i in local]


def _pick(spec, part: str, count: int, noun: str, owner: str, forms: str, dash_range: bool = False) -> list[int]:
    """One comma-separated part among ``count`` things: an index (negative counts from the end),
    a Python slice 'a:b', or with ``dash_range`` an inclusive 'a-b' as labels print it."""
    every = list(range(count))
    there = f"({owner} {noun}s 0-{count - 1})"
    try:
        if ":" in part:
            bits = [int(b) if b.strip() else None for b in part.split(":")]
            if len(bits) > 3:
                raise ValueError(part)
            chosen = every[slice(*bits)]
            if not chosen:
                raise UsageError(f"--hosts {spec}: {part} selects no {noun} {there}")
            return chosen
        if dash_range and re.fullmatch(r"\d+-\d+", part):
            low, high = (int(b) for b in part.split("-"))
            if not 0 <= low <= high < count:
                raise UsageError(f"--hosts {spec}: {noun}s {part} do not exist {there}")
            return every[low:high + 1]
        index = int(part)
    except ValueError:
        raise UsageError(f"--hosts {spec}: use {forms}") from None
    if not -count <= index < count:
        raise UsageError(f"--hosts {spec}: {noun} {index} does not exist {there}")
    return [every[index]]
