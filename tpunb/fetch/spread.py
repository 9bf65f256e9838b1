"""``%tpu_fetch`` on a slice: the same bytes at PATH on every host, each byte from the source once.

The kernel lists the manifest (``fetch.manifest``), asks every host where PATH is and what it
holds already (``fetch_probe``; each leaves a marker there, and hosts that see one another's
marker share the folder, a network folder too, so one of them writes for all), then one host
downloads and hands each chunk on as it lands (``tpunb.host.spread``): over a relay tree rooted
on it and backed by files when the hosts reach each other, else as frames through the kernel,
which holds at most ``WINDOW`` bytes of them (the downloader waits for the kernel's
``fetch_ack``). The kernel downloads only when the downloader has no route to the source: a
network error before any byte of it arrived; after that, a failure is one line that resumes. The
token travels inside the downloader's request alone, and is masked in everything hosts send back.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from tpunb.engine import relay as relaying
from tpunb.engine.routes import Frame
from tpunb.errors import FetchFailed, TransportError
from tpunb.fetch.source import Manifest
from tpunb.host import protocol
from tpunb.host.fetch import FetchError, download
from tpunb.secrets import urls
from tpunb.units import format_bytes

if TYPE_CHECKING:
    from tpunb.session import Session

CANCEL = {"op": "fetch_cancel"}
#: seconds hosts get to say where PATH is and what it holds (hashing files already there)
PROBE_TIMEOUT = 600.0
#: bytes a downloader may have sent through the kernel that the kernel has not passed on yet:
#: what a fetch through the kernel holds in its memory, however large the files
WINDOW = 8 << 20
#: seconds hosts get to stop once the fetch stopped (Ctrl-C, a failure elsewhere): a fetch started
#: right after finds no download of the last one still writing its partials
GRACE = 10.0


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


def fetch(session: Session, manifest: Manifest, root: str, indices: list[int],
          names: Callable[[list[int]], str]) -> FetchReport:
    """Put ``manifest``'s files at ``root`` on the hosts ``indices`` of ``session``; FetchFailed
    (one line) when it cannot, with nothing that looks complete left half-written."""
    started = time.monotonic()
    for entry in manifest.entries:  # the token is masked in whatever a host prints
        for value in entry.headers.values():
            secret = str(value).removeprefix("Bearer ").strip()
            if len(secret) >= 8:
                session.masker.add(secret)
    query = urls.query(manifest.source.text)  # a presigned URL's signature: masked from now on
    if query:
        session.masker.add(query)
    report = FetchReport(manifest.source.text, manifest.revision, root, list(indices), len(manifest.entries),
                         manifest.total, names=names)
    bare = [{**entry.to_wire(), "headers": {}} for entry in manifest.entries]
    probes = _probe(session, bare, root, indices, names)
    groups = _sharing(session, root, probes)
    reps = [hosts[0] for hosts in groups]
    report.shared = {h: hosts[0] for hosts in groups for h in hosts[1:]}
    need = {i: [k for k in range(len(bare)) if k not in set(probes[i]["have"])] for i in reps}
    _check_space(manifest, probes, need, names)
    wanting = [i for i in reps if need[i]]
    if not wanting:
        report.seconds = time.monotonic() - started
        return report
    downloader = min(wanting, key=lambda i: (sum(manifest.entries[k].size for k in need[i]), i))
    receivers = [i for i in wanting if i != downloader]
    report.downloader = downloader
    through_kernel = not _peers_reachable(session, receivers)
    try:
        _run(session, manifest, bare, root, downloader, receivers, need, through_kernel, report, names)
    except _Unreachable:  # the relay could not reach a receiver: the kernel carries the bytes instead
        session.relay.unreachable = True
        _run(session, manifest, bare, root, downloader, receivers, need, True, report, names)
    except _NoRoute as exc:  # the downloader cannot reach the source: the kernel downloads it once
        _from_kernel(session, manifest, bare, root, wanting, need, report, names, str(exc))
    report.seconds = time.monotonic() - started
    return report


class _Unreachable(Exception):
    pass


class _NoRoute(Exception):
    pass


def _probe(session: Session, bare: list[dict], root: str, indices: list[int], names) -> dict[int, dict]:
    try:
        replies = session.call(indices, {"op": "fetch_probe", "root": root, "entries": bare}, timeout=PROBE_TIMEOUT)
    except TransportError as exc:
        raise FetchFailed(f"cannot fetch to {root}: {exc}", "host") from None
    failed = {i: r.get("error") for i, (r, _) in replies.items() if r.get("status") != "ok"}
    if failed:
        _look(session, root, {i: r for i, (r, _) in replies.items() if i not in failed})  # their markers go
        i = min(failed)
        raise FetchFailed(f"host {names([i])}: {failed[i]}: choose another --to", "disk")
    return {i: r for i, (r, _) in replies.items()}


def _look(session: Session, root: str, probes: dict[int, dict]) -> dict[int, list[str]]:
    """Which of the probe's markers each host sees in its folder (each then removes its own)."""
    if not probes:
        return {}
    markers = [probe["marker"] for probe in probes.values() if probe.get("marker")]
    try:
        replies = session.call(list(probes), {"op": "fetch_look", "root": root, "markers": markers},
                               timeout=PROBE_TIMEOUT)
    except TransportError as exc:
        raise FetchFailed(f"cannot fetch to {root}: {exc}", "host") from None
    return {i: list(r.get("seen") or ()) for i, (r, _) in replies.items()}


def _sharing(session: Session, root: str, probes: dict[int, dict]) -> list[list[int]]:
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

    for i, seen in _look(session, root, probes).items():
        for marker in seen:
            a, b = sorted((top(i), top(owner[marker])))
            leader[b] = a
    groups: dict[int, list[int]] = {}
    for i in sorted(probes):
        groups.setdefault(top(i), []).append(i)
    return list(groups.values())


def _check_space(manifest: Manifest, probes: dict, need: dict, names) -> None:
    """A host without room for what it lacks fails the fetch before a byte moves."""
    for i, lacking in sorted(need.items()):
        wanted = sum(manifest.entries[k].size for k in lacking) - probes[i]["partial"]
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


def _send(session: Session, index: int, message: dict, blob=b"") -> int:
    """A frame to one host (outside any route): the bytes it put on the kernel's link (0: host gone)."""
    host = session.hosts[index]
    try:
        host.send_part(protocol.encode_head(message, len(blob), host.fast), blob)
    except TransportError:
        return 0
    return len(blob)


def _run(session: Session, manifest: Manifest, bare: list[dict], root: str, downloader: int, receivers: list[int],
         need: dict, through_kernel: bool, report: FetchReport, names) -> None:
    """One downloader, the receivers fed by relay (or through the kernel); the report filled in."""
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
    report.route = ("kernel" if through_kernel else "relay") if receivers else "source"
    sizes = [e.size for e in manifest.entries]
    totals = {downloader: sum(sizes[k] for k in set(need[downloader]) | set(forward)),
              **{i: sum(sizes[k] for k in need[i]) for i in receivers}}
    replies: dict[int, dict] = {}
    bars = _bars(totals, names)
    try:
        with session.request([downloader, *receivers], kind="fetch", exclusive=False, grace=GRACE) as request:
            for i in receivers:
                request.send(Frame({"op": "fetch", "role": "receive", "root": root, "entries": bare, "need": need[i]},
                                   stop=CANCEL), [i])
            secret = {"op": "fetch", "role": "download", "root": root, "entries": [e.to_wire() for e in manifest.entries],
                      "need": need[downloader], "forward": forward, "tree": tree, "me": me,
                      "via_kernel": through_kernel and bool(receivers), "window": WINDOW,
                      "settings": manifest.settings}
            request.send(Frame(secret, stop=CANCEL), [downloader])

            passed = [0]

            def chunk(index: int, reply: dict, blob) -> None:
                if reply.get("op") == "fetch_chunk" and index == downloader:
                    report.through_kernel += len(blob)
                    for i in receivers:
                        if reply["file"] in need[i]:
                            report.through_kernel += _send(session, i, {**reply, "id": request.rid}, blob)
                    passed[0] += len(blob)  # passed on: the downloader may send that much more
                    _send(session, downloader, {"op": "fetch_ack", "id": request.rid, "passed": passed[0]})

            def done(index: int, reply: dict) -> None:
                if index == downloader and reply.get("status") == "ok" and through_kernel:
                    for i in receivers:
                        _send(session, i, {"op": "fetch_chunk", "id": request.rid, "end": True})

            _collect(request, bars, replies, chunk, done)
    finally:
        _close(bars)
    _raise_for(request, replies, downloader, names)
    report.from_source = int(replies[downloader].get("from_source", 0))
    report.received = {i: int(r.get("moved", 0)) for i, r in replies.items()}


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


def _raise_for(request, replies: dict, downloader: int, names) -> None:
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


def _from_kernel(session: Session, manifest: Manifest, bare: list[dict], root: str, wanting: list[int], need: dict,
                 report: FetchReport, names, why: str) -> None:
    """The hosts cannot reach the source: the kernel downloads each file once (into a folder it
    removes after) and sends its chunks to every host that lacks it."""
    report.route, report.downloader = "kernel-download", None
    sizes = [e.size for e in manifest.entries]
    replies: dict[int, dict] = {}
    scratch = tempfile.mkdtemp(prefix="tpunb-fetch-")
    bars = _bars({i: sum(sizes[k] for k in need[i]) for i in wanting}, names)
    try:
        with session.request(wanting, kind="fetch", exclusive=False, grace=GRACE) as request:
            for i in wanting:
                request.send(Frame({"op": "fetch", "role": "receive", "root": root, "entries": bare, "need": need[i]},
                                   stop=CANCEL), [i])
            for k, entry in enumerate(manifest.entries):
                takers = [i for i in wanting if k in need[i]]
                if not takers:
                    continue

                def hand(at: int, data, k=k, takers=takers) -> None:
                    for i in takers:
                        report.through_kernel += _send(session, i, {"op": "fetch_chunk", "id": request.rid,
                                                                    "file": k, "at": at}, data)
                try:
                    report.from_source += download(entry, scratch, on_chunk=hand).moved
                except FetchError as exc:
                    for i in wanting:
                        _send(session, i, {**CANCEL, "id": request.rid})
                    raise FetchFailed(f"neither the hosts nor the kernel can fetch {entry.path} ({why}; the kernel: "
                                      f"{exc})", exc.kind) from None
            for i in wanting:
                _send(session, i, {"op": "fetch_chunk", "id": request.rid, "end": True})

            _collect(request, bars, replies)
    finally:
        _close(bars)
        shutil.rmtree(scratch, ignore_errors=True)
    _raise_for(request, replies, -1, names)
    report.received = {i: int(r.get("moved", 0)) for i, r in replies.items()}
