"""Process 0's compile-cache entries copied to the other hosts (``%tpu_restart`` does it), so that
a multi-host slice whose hosts keep JAX's cache on their own disks hits it on every host: JAX
writes entries from process 0 only (``tpunb.host.jaxcache``). The entries go as a fetch does
(``tpunb.fetch.spread``): host 0 hands them on over the slice's network, each host checks each
entry's sha256 and publishes it into its cache under JAX's lock."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from tpunb.errors import FetchFailed
from tpunb.fetch.source import Manifest, Source
from tpunb.host.fetch import Entry
from tpunb.host.jaxcache import INCOMING

if TYPE_CHECKING:
    from tpunb.engine.session import Session

#: seconds the hosts get to list their caches, and host 0 to stage (hash) its new entries
TIMEOUT = 600.0


@dataclass
class CacheShare:
    """What a copy did: entries (and bytes) host 0 had that some host lacked, and the hosts given them."""

    entries: int
    bytes: int
    hosts: list[int]

    def line(self, names: Callable[[list[int]], str]) -> str:
        if not self.entries:
            return "every host holds host 0's compile-cache entries"
        return (f"{self.entries} compile-cache entr{'ies' if self.entries != 1 else 'y'} of host 0 copied to "
                f"host{'s' if len(self.hosts) > 1 else ''} {names(self.hosts)}")


def share(session: Session, indices: list[int], names: Callable[[list[int]], str]) -> CacheShare | None:
    """Host 0's entries that hosts ``indices`` lack, copied to them; None where the cache is not on
    the hosts' own disks (a gs:// cache, which every host reads already). FetchFailed or
    TransportError (one line) when a host cannot take part."""
    from tpunb.fetch.spread import fetch

    if 0 not in indices or len(indices) < 2:
        return None
    listed = {i: r for i, (r, _) in session.call(indices, {"op": "cache_list"}, timeout=TIMEOUT).items()}
    source = listed[0]
    if not source.get("root"):
        return None
    mine = set(source.get("keys") or {})
    lacking = {i: mine - set(r.get("keys") or {}) for i, r in listed.items() if i != 0 and r.get("root")}
    wanted = sorted(set().union(*lacking.values())) if lacking else []
    if not wanted:
        return CacheShare(0, 0, [])
    staged = session.call([0], {"op": "cache_stage", "keys": wanted}, timeout=TIMEOUT)[0][0]
    if staged.get("status") != "ok":
        raise FetchFailed(f"host {names([0])} cannot stage its compile cache: {staged.get('error')}", "disk")
    entries = [Entry.from_wire(w) for w in staged["entries"]]
    manifest = Manifest(Source("the compile cache of host 0", "cache", source["root"]), None, entries)
    takers = [0] + [i for i in sorted(lacking) if lacking[i]]
    fetch(session, manifest, source["root"], takers, names, ({"jax_cache": INCOMING}, {"kind": "jax-cache"}, 0))
    return CacheShare(sum(e.path.endswith("-cache") for e in entries), sum(e.size for e in entries), takers[1:])


def stats(session: Session, indices: list[int]) -> dict[int, dict]:
    """Each host's compiles that asked the cache (``requests``), its ``hits`` and ``misses``, and the
    entries it ``written``, as JAX's monitoring events counted them in its current Python session
    (0 before it imports JAX)."""
    replies = session.call(indices, {"op": "cache_stats"}, timeout=60.0)
    return {i: {k: r.get(k, 0) for k in ("requests", "hits", "misses", "written")} for i, (r, _) in replies.items()}
