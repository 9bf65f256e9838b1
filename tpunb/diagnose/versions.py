"""Version skew: the first question JAX's maintainers ask when a pod stalls (jax #10218).

Each host's agent reports its versions in its hello (read from package metadata, never by
importing jax); these functions compare them and name the hosts that differ, in one line.
"""
from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from tpunb.host import diagnose as _host
from tpunb.host.diagnose import PACKAGES as _HOST_PACKAGES

#: what is compared, in the order shown
PACKAGES = ("python", *_HOST_PACKAGES)


@dataclass
class VersionRow:
    """One host's versions, as %tpu_status --versions shows them (None: not installed)."""

    slice: str
    host: int
    address: str | None
    python: str | None = None
    jax: str | None = None
    jaxlib: str | None = None
    libtpu: str | None = None
    flax: str | None = None
    #: the environment tpunb made on the host (None: the host's own Python, as it is)
    env: str | None = None


@functools.cache
def kernel_versions() -> dict:
    """This kernel's own versions: those of every host that runs on its Python (a local slice)."""
    return _host.versions()


def version_rows(slice_name: str, infos: list[tuple[int, str | None, dict | None]]) -> list[VersionRow]:
    """Rows from (host, address, versions from its hello) triples."""
    return [VersionRow(slice_name, host, address, **{k: (versions or {}).get(k) for k in PACKAGES})
            for host, address, versions in infos]


def skew_line(versions: dict[int, dict | None], name: Callable[[list[int]], str] = None) -> str | None:
    """One line naming the hosts whose versions differ from the most common ones, or None when
    all agree. ``versions``: host -> its versions (None: unknown, skipped); ``name`` labels hosts."""
    known = {h: v for h, v in versions.items() if v}
    label = name or (lambda hosts: ",".join(str(h) for h in sorted(hosts)))
    parts = []
    for package in PACKAGES:
        seen = Counter(v.get(package) or "none" for v in known.values())
        if len(seen) < 2:
            continue
        common = seen.most_common(1)[0][0]
        others = {}
        for host, v in sorted(known.items()):
            value = v.get(package) or "none"
            if value != common:
                others.setdefault(value, []).append(host)
        rest = [h for h, v in known.items() if (v.get(package) or "none") == common]
        parts.append(f"{package} {common} on host{'s' if len(rest) > 1 else ''} {label(rest)} but "
                     + ", ".join(f"{value} on host{'s' if len(hosts) > 1 else ''} {label(hosts)}"
                                 for value, hosts in others.items()))
    if not parts:
        return None
    return ("[tpunb] hosts run different versions: " + "; ".join(parts)
            + " (install the same on every host; %tpu_status --versions lists them)")
