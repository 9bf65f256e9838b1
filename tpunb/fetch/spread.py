"""``%tpu_fetch`` on a slice: the same bytes on every host, each byte from the source once; at
PATH (``--to``: as ``hf download --local-dir`` leaves a folder), or, for a Hub repository without
``--to``, in each host's Hugging Face cache (``tpunb.host.hflayout``: where and how
huggingface_hub keeps it, so ``from_pretrained`` and ``vllm serve ORG/NAME`` find it).

Two round trips. The kernel lists the manifest (``fetch.manifest``), then asks every host where
the files go and what it holds already (``fetch_probe``; each leaves a marker there and lists the
markers it sees: hosts that see one another's share the folder, a network folder too, so one of
them writes for all). Then the fetch: one host downloads, several GETs at once, and hands each
chunk on as it lands (``tpunb.host.spread``): over a relay tree rooted on it when the hosts reach
each other, else as frames through the kernel, which holds at most ``WINDOW`` bytes of them (the
downloader waits for the kernel's ``fetch_ack``); every host removes its marker and writes the
Hugging Face layout once its files are in place. Every frame goes through the engine's routes.
The kernel downloads only when the downloader has no route to the source (a network error before
any byte of it arrived), streaming each file to the hosts without keeping it; after that, a
failure is one line that resumes. A Hub token travels inside the downloader's request alone; a
Cloud Storage token of the kernel's only when a host's own account is refused, one per file; both
are masked in everything hosts send back.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from tpunb.engine import relay as relaying
from tpunb.engine.routes import Frame, hand_on
from tpunb.errors import FetchFailed, TransportError, UsageError
from tpunb.fetch.source import Manifest
from tpunb.host.download import stream
from tpunb.host.fetch import Entry, FetchError
from tpunb.host.hflayout import repo_folder
from tpunb.secrets import urls
from tpunb.units import format_bytes

if TYPE_CHECKING:
    from tpunb.engine.session import Session

CANCEL = {"op": "fetch_cancel"}
#: seconds hosts get to say where PATH is and what it holds (hashing files already there)
PROBE_TIMEOUT = 600.0
#: bytes a downloader may have sent through the kernel that the kernel has not passed on yet:
#: what a fetch through the kernel holds in its memory, however large the files
WINDOW = 8 << 20
#: seconds hosts get to stop once the fetch stopped (Ctrl-C, a failure elsewhere): a fetch started
#: right after finds no download of the last one still writing its partials
GRACE = 10.0
#: where a fetch without --to puts a Hub repository, as reports name it
HF_CACHE = "the Hugging Face cache"


@dataclass
class FetchReport:
    """What a fetch did: files and bytes, the bytes that left the source and that crossed the
    kernel's link, the route, which host downloaded, and which hosts saw another's copy."""

    source: str
    revision: str | None
    root: str
    hosts: list[int]
    files: int
    bytes: int
    from_source: int = 0
    through_kernel: int = 0
    #: "none" (all there), "source" (one host, nobody else needs bytes), "relay", "kernel" (hosts
    #: cannot reach each other) or "kernel-download" (the hosts cannot reach the source)
    route: str = "none"
    downloader: int | None = None
    #: host -> the host whose folder it shares (its files were written once, there)
    shared: dict[int, int] = field(default_factory=dict)
    #: host -> bytes written there
    received: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0
    names: Callable[[list[int]], str] = field(default=lambda hosts: ",".join(map(str, hosts)), repr=False)

    def __str__(self) -> str:
        at = f"@{self.revision[:12]}" if self.revision else ""
        head = (f"{urls.bare(self.source)}{at} at {self.root} on host{'s' if len(self.hosts) > 1 else ''} "
                f"{self.names(self.hosts)}: {self.files} file{'s' if self.files != 1 else ''}, {format_bytes(self.bytes)}")
        if self.route == "none":
            return f"{head}; already there: no bytes moved"
        parts = [f"host {self.names([self.downloader])} took {format_bytes(self.from_source)} from the source once"
                 if self.route != "kernel-download" else
                 f"the hosts cannot reach the source, so the kernel downloaded {format_bytes(self.from_source)} once"]
        others = sorted(h for h in self.received if h != self.downloader)
        if self.route == "relay":
            parts.append(f"relayed to host{'s' if len(others) > 1 else ''} {self.names(others)} over the slice's "
                         f"network as it downloaded ({format_bytes(self.through_kernel)} through the kernel)")
        elif self.route in ("kernel", "kernel-download"):
            reason = "" if self.route == "kernel-download" else "the hosts cannot reach each other, so "
            parts.append(f"{reason}host{'s' if len(others) > 1 else ''} {self.names(others)} got the bytes through "
                         f"the kernel ({format_bytes(self.through_kernel)} on its link)")
        if self.shared:
            readers = sorted(self.shared)
            parts.append(f"written once: host{'s' if len(readers) > 1 else ''} {self.names(readers)} share"
                         f"{'' if len(readers) > 1 else 's'} the file system of host "
                         f"{self.names(sorted(set(self.shared.values())))}")
        return f"{head}; " + "; ".join(parts) + f"; {self.seconds:.1f} s"


def fetch(session: Session, manifest: Manifest, root: str | None, indices: list[int],
          names: Callable[[list[int]], str], within: tuple[dict, dict, int] | None = None) -> FetchReport:
    """Put ``manifest``'s files at ``root`` (None: a Hub repository in each host's Hugging Face
    cache) on the hosts ``indices`` of ``session``; FetchFailed (one line) when it cannot, with
    nothing that looks complete left half-written. ``within``: (place, layout, host) for files
    that are on one of the hosts already (a compile cache's entries): that host hands them on."""
    started = time.monotonic()
    for entry in manifest.entries:  # the token is masked in whatever a host prints
        for value in entry.headers.values():
            secret = str(value).removeprefix("Bearer ").strip()
            if len(secret) >= 8:
                session.masker.add(secret)
    query = urls.query(manifest.source.text)  # a presigned URL's signature: masked from now on
    if query:
        session.masker.add(query)
    if within is None:
        place, entries, layout = placement(manifest, root)
    else:
        (place, layout, _), entries = within, list(manifest.entries)
    report = FetchReport(manifest.source.shown, manifest.revision, root or HF_CACHE, list(indices),
                         len(manifest.entries), manifest.total, names=names)
    bare = [{**entry.to_wire(), "headers": {}} for entry in entries]
    probes = _probe(session, place, bare, indices, names)
    if root is None:
        report.root = _cache_roots(probes, names)
    try:
        groups = _sharing(probes)
        reps = [hosts[0] for hosts in groups]
        report.shared = {h: hosts[0] for hosts in groups for h in hosts[1:]}
        need = {i: [k for k in range(len(bare)) if k not in set(probes[i]["have"])] for i in reps}
        _check_space(entries, probes, need, names)
    except BaseException:
        _unmark(session, probes)
        raise
    plan = _Plan(entries, bare, probes, layout, reps, need, manifest.timeout)
    wanting = [i for i in reps if need[i]]
    if not wanting:
        _run(session, plan, None, [], False, report, names)  # the markers go, the layout is written
        report.seconds = time.monotonic() - started
        return report
    downloader = min(wanting, key=lambda i: (sum(entries[k].size for k in need[i]), i)) if within is None else \
        within[2]
    receivers = [i for i in wanting if i != downloader]
    report.downloader = downloader
    through_kernel = not _peers_reachable(session, receivers)
    try:
        _run(session, plan, downloader, receivers, through_kernel, report, names)
    except _Unreachable:  # the relay could not reach a receiver: the kernel carries the bytes instead
        session.relay.unreachable = True
        _run(session, plan, downloader, receivers, True, report, names)
    except _NoRoute as exc:  # the downloader cannot reach the source: the kernel downloads it once
        _from_kernel(session, plan, wanting, report, names, str(exc))
    report.seconds = time.monotonic() - started
    return report


def placement(manifest: Manifest, root: str | None) -> tuple[dict, list[Entry], dict | None]:
    """Where the files go (``place``, which each host resolves), the entries the hosts write, and
    what Hugging Face's tools read beside them (``layout``, for ``tpunb.host.hflayout.finish``).
    In the hub cache a file's bytes are its blob, named by its ETag and written once however many
    paths share it; at a --to PATH, each file at its path with huggingface_hub's local-dir metadata."""
    hub = manifest.repo_id is not None
    files = [[e.path, f"blobs/{e.digest.lower()}" if root is None else e.path, e.digest.lower()]
             for e in manifest.entries]
    layout = {"kind": "hf-cache" if root is None else "local-dir", "commit": manifest.revision, "ref": manifest.ref,
              "tree": manifest.tree, "files": files} if hub else None
    if root is not None:
        return {"path": root}, list(manifest.entries), layout
    blobs: dict[str, Entry] = {}
    for entry, (_, blob, _) in zip(manifest.entries, files):
        blobs.setdefault(blob, Entry(blob, entry.size, entry.url, entry.check, entry.digest, dict(entry.headers),
                                     entry.auth))
    return {"hf_cache": repo_folder(manifest.repo_type, manifest.repo_id)}, list(blobs.values()), layout


@dataclass
class _Plan:
    """What the fetch request tells every host: the entries, where each host writes, what it lacks."""

    entries: list[Entry]
    bare: list[dict]
    probes: dict[int, dict]
    layout: dict | None
    reps: list[int]
    need: dict[int, list[int]]
    timeout: float | None

    def message(self, index: int, role: str) -> dict:
        """Host ``index``'s fetch frame: ``role`` download, receive or settle (its marker goes,
        and a host that writes its folder finishes the layout)."""
        layout = self.layout if index in self.reps else None
        return {"op": "fetch", "role": role, "root": self.probes[index]["root"], "entries": self.bare,
                "need": self.need.get(index, []) if role != "settle" else [], "layout": layout}


class _Unreachable(Exception):
    pass


class _NoRoute(Exception):
    pass


def _probe(session: Session, place: dict, bare: list[dict], indices: list[int], names) -> dict[int, dict]:
    """Each host's answer: its folder, free space, the files it holds, its marker and those it sees."""
    try:
        replies = session.call(indices, {"op": "fetch_probe", "place": place, "entries": bare}, timeout=PROBE_TIMEOUT)
    except TransportError as exc:
        raise FetchFailed(f"cannot fetch to {place.get('path') or HF_CACHE}: {exc}", "host") from None
    probes = {i: r for i, (r, _) in replies.items()}
    failed = {i: r.get("error") for i, r in probes.items() if r.get("status") != "ok"}
    if failed:
        _unmark(session, probes)
        i = min(failed)
        raise FetchFailed(f"host {names([i])}: {failed[i]}: choose another --to", "disk")
    return probes


def _unmark(session: Session, probes: dict[int, dict]) -> None:
    """A fetch that ends before its second frame (a host without room, a failed probe): each host's
    marker goes all the same, before the error is raised (a third round trip, on failures only)."""
    for root, hosts in _by_root(probes).items():
        try:
            session.call(hosts, {"op": "fetch_unmark", "root": root}, timeout=PROBE_TIMEOUT)
        except TransportError:
            pass


def _by_root(probes: dict[int, dict]) -> dict[str, list[int]]:
    """The probed hosts by the folder each resolved (a Hugging Face cache may differ per host)."""
    roots: dict[str, list[int]] = {}
    for i, probe in sorted(probes.items()):
        if probe.get("root"):
            roots.setdefault(probe["root"], []).append(i)
    return roots


def _cache_roots(probes: dict[int, dict], names) -> str:
    """Where the hosts' Hugging Face caches are, as a report says it."""
    caches: dict[str, list[int]] = {}
    for i, probe in sorted(probes.items()):
        caches.setdefault(probe["root"].rsplit("/", 1)[0], []).append(i)
    if len(caches) == 1:
        return f"{HF_CACHE} ({next(iter(caches))})"
    return f"{HF_CACHE} ({'; '.join(f'host {names(hosts)}: {cache}' for cache, hosts in caches.items())})"


def _sharing(probes: dict[int, dict]) -> list[list[int]]:
    """The hosts grouped by the folder they write: hosts that see one another's marker share it
    (one machine's disk, or a network folder mounted on several), so one host writes for all.
    Markers, not device and inode numbers: those differ across machines on one network folder,
    and may match on machines made from one image."""
    owner = {probe["marker"]: i for i, probe in probes.items() if probe.get("marker")}
    leader = {i: i for i in probes}

    def top(i: int) -> int:
        while leader[i] != i:
            i = leader[i]
        return i

    for i, probe in probes.items():
        for marker in probe.get("seen") or ():
            if marker in owner and owner[marker] != i:
                a, b = sorted((top(i), top(owner[marker])))
                leader[b] = a
    groups: dict[int, list[int]] = {}
    for i in sorted(probes):
        groups.setdefault(top(i), []).append(i)
    return list(groups.values())


def _check_space(entries: list[Entry], probes: dict, need: dict, names) -> None:
    """A host without room for what it lacks fails the fetch before a byte moves."""
    for i, lacking in sorted(need.items()):
        wanted = sum(entries[k].size for k in lacking) - probes[i]["partial"]
        if wanted > probes[i]["free"]:
            raise FetchFailed(f"host {names([i])} has {format_bytes(probes[i]['free'])} free at {probes[i]['root']} and "
                              f"the fetch needs {format_bytes(wanted)} more (no space left on the device): free space "
                              "or choose another --to; nothing was written", "disk")


def _peers_reachable(session: Session, receivers: list[int]) -> bool:
    if not receivers:
        return True
    hosts = session.hosts
    if relaying.mode() == "never" or session.relay.unreachable or \
            not all(hosts[i].transport.reaches_peers for i in receivers):
        return False
    return True


def _bars(total: dict[int, int], names) -> dict:
    """A tqdm bar per host with bytes and rate (tqdm.auto: a widget in a notebook)."""
    from tqdm.auto import tqdm

    return {i: tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc=f"host {names([i])}",
                    position=k, leave=True, mininterval=0.2)
            for k, (i, size) in enumerate(sorted(total.items()))}


def _close(bars: dict) -> None:
    for bar in bars.values():
        bar.close()


def _answer_token(request, index: int, reply: dict, masker) -> None:
    """A downloader whose VM account the bucket refused asks for the kernel's token for one file:
    a fresh one (google-auth refreshes a stale token), masked, or why there is none."""
    from tpunb.fetch.storage import kernel_token

    try:
        token, error = kernel_token(), None
        masker.add(token)
    except UsageError as exc:
        token, error = None, str(exc)
    hand_on(request, [index], {"op": "fetch_token", "file": reply.get("file"), "token": token, "error": error})


def _run(session: Session, plan: _Plan, downloader: int | None, receivers: list[int], through_kernel: bool,
         report: FetchReport, names) -> None:
    """The fetch frame to every probed host: one downloader, the receivers fed by relay (or through
    the kernel), the rest settle; the report filled in."""
    entries, need = plan.entries, plan.need
    forward = sorted({k for i in receivers for k in need[i]})
    tree, me = [], None
    if receivers and not through_kernel:
        try:
            where = session.relay.listen([downloader, *receivers])
        except TransportError:
            through_kernel = True
        else:
            nodes = [[i, *where[i]] for i in [downloader, *receivers]]
            tree = relaying.plan(nodes, relaying.FANOUT)
            me = [downloader, session.hosts[downloader].transport.address]
    report.route = ("kernel" if through_kernel else "relay") if receivers else ("source" if downloader is not None
                                                                                 else "none")
    sizes = [e.size for e in entries]
    totals = {} if downloader is None else {downloader: sum(sizes[k] for k in set(need[downloader]) | set(forward)),
                                            **{i: sum(sizes[k] for k in need[i]) for i in receivers}}
    settling = [i for i in plan.probes if i != downloader and i not in receivers]
    replies: dict[int, dict] = {}
    bars = _bars(totals, names)
    try:
        with session.request(list(plan.probes), kind="fetch", exclusive=False, grace=GRACE) as request:
            for i in [*receivers, *settling]:
                request.send(Frame(plan.message(i, "receive" if i in receivers else "settle"), stop=CANCEL), [i])
            if downloader is not None:
                secret = {**plan.message(downloader, "download"), "entries": [e.to_wire() for e in entries],
                          "forward": forward, "tree": tree, "me": me, "via_kernel": through_kernel and bool(receivers),
                          "window": WINDOW, "timeout": plan.timeout}
                request.send(Frame(secret, stop=CANCEL), [downloader])

            passed = [0]

            def other(index: int, reply: dict, blob) -> None:
                if index != downloader:
                    return
                if reply.get("op") == "fetch_token":
                    _answer_token(request, index, reply, session.masker)
                elif reply.get("op") == "fetch_chunk":
                    report.through_kernel += len(blob)
                    takers = [i for i in receivers if reply["file"] in need[i]]
                    report.through_kernel += hand_on(request, takers, reply, blob)
                    passed[0] += len(blob)  # passed on: the downloader may send that much more
                    hand_on(request, [downloader], {"op": "fetch_ack", "passed": passed[0]})

            def done(index: int, reply: dict) -> None:
                if index == downloader and reply.get("status") == "ok" and through_kernel and receivers:
                    hand_on(request, receivers, {"op": "fetch_chunk", "end": True})

            _collect(request, bars, replies, other, done)
    finally:
        _close(bars)
    _raise_for(request, replies, downloader, names)
    if downloader is not None:
        report.from_source = int(replies[downloader].get("from_source", 0))
    report.received = {i: int(replies[i].get("moved", 0)) for i in [downloader, *receivers] if i in replies}


def _collect(request, bars: dict, replies: dict, other: Callable | None = None, done: Callable | None = None) -> None:
    """Every host's answer into ``replies``: progress to its bar, other frames to ``other``, a
    failure stops the rest (they are told ``fetch_cancel``)."""
    def answer(index: int, reply: dict, blob) -> bool:
        op = reply.get("op")
        if op == "fetch_progress" and index in bars:
            bars[index].update(max(0, int(reply.get("bytes", 0)) - bars[index].n))
        elif op == "done":
            replies[index] = reply
            if done is not None:
                done(index, reply)
            if reply.get("status") != "ok":
                request.fail(index, reply.get("error") or "failed")
            return True
        elif other is not None:
            other(index, reply, blob)
        return False

    request.collect(answer)


def _raise_for(request, replies: dict, downloader: int | None, names) -> None:
    """The fetch's failure as one line: the downloader's own first (the receivers only saw it end)."""
    if request.stopped == "interrupted":
        raise FetchFailed("the fetch was interrupted: fetch again, it resumes from what arrived", "cancelled")
    mine = replies.get(downloader, {})
    if mine.get("status") == "error" and mine.get("kind") != "cancelled":  # cancelled: another host failed first
        if mine.get("kind") == "unreachable":
            raise _Unreachable(mine.get("error"))
        if mine.get("kind") == "network" and not mine.get("from_source"):  # not a byte from the source
            raise _NoRoute(mine.get("error"))
        raise FetchFailed(f"host {names([downloader])}: {mine.get('error')}", mine.get("kind") or "source")
    if request.died:
        i = min(request.died)
        raise FetchFailed(f"host {names([i])} died during the fetch ({request.died[i]}): fetch again, it resumes",
                          "host")
    errors = {i: r for i, r in replies.items() if r.get("status") == "error" and r.get("kind") != "cancelled"}
    if errors:
        i = min(errors)
        raise FetchFailed(f"host {names([i])}: {errors[i].get('error')}", errors[i].get("kind") or "network")
    if request.stopped:
        raise FetchFailed(f"the fetch stopped ({request.stopped}) on hosts {names(request.stopped_hosts)}: fetch "
                          "again, it resumes", "host")


def _kernel_entry(entry: Entry) -> Entry:
    """An entry as the kernel downloads it: a Cloud Storage one with the kernel's own token."""
    from tpunb.host import gcs

    if entry.auth == "gcs" and gcs.endpoint() == gcs.API:
        from tpunb.fetch.storage import kernel_token

        return Entry(entry.path, entry.size, entry.url, entry.check, entry.digest,
                     {**entry.headers, "Authorization": f"Bearer {kernel_token()}"})
    return entry


def _from_kernel(session: Session, plan: _Plan, wanting: list[int], report: FetchReport, names, why: str) -> None:
    """The hosts cannot reach the source: the kernel downloads each file once and streams its
    chunks to every host that lacks it as they come, keeping none of it (a model may be larger
    than the kernel's disk)."""
    report.route, report.downloader = "kernel-download", None
    sizes = [e.size for e in plan.entries]
    replies: dict[int, dict] = {}
    settling = [i for i in plan.probes if i not in wanting]
    bars = _bars({i: sum(sizes[k] for k in plan.need[i]) for i in wanting}, names)
    try:
        with session.request(list(plan.probes), kind="fetch", exclusive=False, grace=GRACE) as request:
            for i in plan.probes:
                request.send(Frame(plan.message(i, "receive" if i in wanting else "settle"), stop=CANCEL), [i])
            for k, entry in enumerate(plan.entries):
                takers = [i for i in wanting if k in plan.need[i]]
                if not takers or not entry.size:
                    continue

                def hand(at: int, data, k=k, takers=takers) -> None:
                    report.through_kernel += hand_on(request, takers, {"op": "fetch_chunk", "file": k, "at": at}, data)
                try:
                    report.from_source += stream(_kernel_entry(entry), hand, lambda: request.presses > 0)
                except FetchError as exc:
                    hand_on(request, wanting, CANCEL)
                    raise FetchFailed(f"neither the hosts nor the kernel can fetch {entry.path} ({why}; the kernel: "
                                      f"{exc})", exc.kind) from None
            hand_on(request, wanting, {"op": "fetch_chunk", "end": True})
            _collect(request, bars, replies)
    finally:
        _close(bars)
    _raise_for(request, replies, -1, names)
    report.received = {i: int(replies[i].get("moved", 0)) for i in wanting if i in replies}
