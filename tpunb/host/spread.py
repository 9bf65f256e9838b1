"""A fetch (``%tpu_fetch``) on the hosts of a slice, each byte from the source once, in two round
trips: a probe (where the files go on this host, what it holds, its marker written and the markers
it sees), then the fetch itself. One host downloads (``download.Downloads``: several GETs at once)
and hands each chunk on as it lands, over the slice's own network (a relay tree rooted on it, peers
proving the slice's secret as ``relay`` does) and, for hosts that cannot be reached that way, as
``fetch_chunk`` frames through the kernel. Every receiver writes ``PATH.partial`` at offsets on a
writer thread (``receive.Receiver``), verifies and renames. Once its files are in place a host
writes what Hugging Face's tools read beside them (``hflayout.finish``). All of it runs off the
agent's main thread, so cells run meanwhile.

Shipped to hosts: standard library only (see the package docstring).

The downloader alone gets the entries' headers (a token), inside its request; a Cloud Storage
token comes from the VM's metadata server, or from the kernel for one file at a time
(``fetch_token``). Nothing here prints, logs or writes them, nor changes the agent's environment.
"""
from __future__ import annotations

import os
import socket
import struct
import threading
import time

from .download import STREAMS, TIMEOUT, Downloads
from .fetch import Entry, FetchError, already_there, target_of
from .hflayout import finish, root_of
from .io import quiet_thread
from .jaxcache import publish
from .receive import Receiver
from .relay import UNREACHABLE, RelayError, forward, open_children

#: the frames a fetch answers on a side thread
OPS = ("fetch", "fetch_probe", "fetch_unmark", "fetch_chunk", "fetch_ack", "fetch_cancel", "fetch_token")
#: seconds a downloader waits for the kernel's token for a file the VM's account may not read
TOKEN_WAIT = 60.0
#: a chunk on a peer stream: file index, offset, length (then the bytes); END as the index ends it
RECORD = struct.Struct("!IQI")
END = 0xFFFFFFFF
#: seconds between two progress frames of a host
PROGRESS_EVERY = 0.25
#: seconds a peer's stream waits for its fetch to be known here (its request may come later)
REGISTER_WAIT = 60.0
#: seconds a receiver waits without a byte before it gives up (the kernel cancels sooner on failures)
IDLE = 600.0
#: bytes a downloader sends through the kernel before the kernel says it passed them on
#: (``fetch_ack``): what the kernel holds for a fetch is bounded by it (the request may lower it)
WINDOW = 8 << 20
#: where each host leaves its marker during a probe, below the fetch's root: hosts that see each
#: other's marker share the folder (a network folder too), so the files are written there once
MARKERS = os.path.join(".cache", "tpunb", "hosts")


class Job:
    """One fetch on this host: what it receives (``need``: file indices), its receivers, and how it ends."""

    def __init__(self, rid, message: dict, send) -> None:
        self.rid, self.send = rid, send
        self.root = message["root"]
        self.entries = [Entry.from_wire(w) for w in message["entries"]]
        self.need = set(message.get("need") or ())
        self.layout = message.get("layout")
        self.cond = threading.Condition()
        self.receivers: dict[int, Receiver] = {}
        self.landed: dict[int, int] = {}
        self.ready: list[int] = []
        self.ended = False
        self.error: FetchError | None = None
        self.bytes = 0
        self.heard = time.monotonic()
        #: through the kernel: bytes sent, and bytes the kernel said it passed on
        self.sent = self.acked = 0
        self.window = int(message.get("window") or WINDOW)
        self.tokens: dict[int, dict] = {}  # file -> the kernel's answer to fetch_token
        self._said = 0.0

    def put(self, index: int, offset: int, data) -> None:
        """A chunk of file ``index`` (ignored unless this host needs it); FetchError once failed."""
        if index not in self.need:
            return
        with self.cond:
            if self.error is not None:
                raise self.error
            receiver = self.receivers.get(index)
            if receiver is None:
                receiver = self.receivers[index] = Receiver(self.entries[index], self.root)
        receiver.put(offset, bytes(data))
        with self.cond:
            self.bytes += len(data)
            self.heard = time.monotonic()
            self.landed[index] = self.landed.get(index, 0) + len(data)
            if self.landed[index] >= self.entries[index].size:
                self.ready.append(index)
                self.cond.notify_all()
        self.progress()

    def counted(self, size: int) -> None:
        """``size`` more bytes written here (a download's chunk, from any of its threads)."""
        with self.cond:
            self.bytes += size
        self.progress()

    def end(self) -> None:
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def fail(self, error: FetchError) -> None:
        with self.cond:
            self.error = self.error or error
            self.cond.notify_all()

    @property
    def stopped(self) -> bool:
        return self.error is not None

    def ack(self, passed: int) -> None:
        with self.cond:
            self.acked = max(self.acked, passed)
            self.cond.notify_all()

    def room(self, size: int) -> None:
        """Wait until ``size`` more bytes fit in the kernel's window (backpressure; a chunk larger than
        the window goes once nothing is outstanding); FetchError once stopped."""
        with self.cond:
            while self.sent > self.acked and self.sent + size - self.acked > self.window and self.error is None:
                self.cond.wait(1.0)
            if self.error is not None:
                raise self.error
            self.sent += size

    def kernel_token(self, index: int) -> str:
        """The kernel's token for file ``index`` (asked once per file, refreshed by the kernel for
        each); FetchError when it has none, the fetch stopped, or no answer came."""
        with self.cond:
            if index not in self.tokens:
                self.tokens[index] = {}
                self.send({"op": "fetch_token", "id": self.rid, "file": index})
            deadline = time.monotonic() + TOKEN_WAIT
            while not self.tokens[index] and self.error is None and time.monotonic() < deadline:
                self.cond.wait(0.5)
            if self.error is not None:
                raise self.error
            answer = self.tokens[index]
        if not answer.get("token"):
            raise FetchError(f"{self.entries[index].path}: the source refused this VM's service account, and "
                             f"{answer.get('error') or 'the kernel gave no token in time'}", "source")
        return answer["token"]

    def token_answer(self, message: dict) -> None:
        with self.cond:
            self.tokens[int(message.get("file", -1))] = {"token": message.get("token"), "error": message.get("error")}
            self.cond.notify_all()

    def progress(self, force: bool = False) -> None:
        """Bytes so far to the kernel (its bar), at most every PROGRESS_EVERY seconds."""
        now = time.monotonic()
        if force or now - self._said >= PROGRESS_EVERY:
            self._said = now
            self.send({"op": "fetch_progress", "id": self.rid, "bytes": self.bytes})

    def finish(self) -> None:
        """Every file of this host in place: what Hugging Face's tools read beside them, or (a JAX
        compile cache's entries) the entries published into the cache."""
        if self.layout:
            try:
                if self.layout.get("kind") == "jax-cache":
                    publish(self.root)
                else:
                    finish(self.root, self.layout)
            except OSError as exc:
                raise FetchError(f"cannot write the Hugging Face layout in {self.root}: {exc.strerror or exc}",
                                 "disk") from None

    def answer(self, reply: dict) -> None:
        self.progress(force=True)
        self.send({"op": "done", "id": self.rid, **reply})


class _VmToken:
    """This VM's access token from its metadata server, for Cloud Storage entries; None on a host
    that has no metadata server (asked once: a host off Google Cloud does not wait on every GET)."""

    def __init__(self) -> None:
        self._none = False
        self._lock = threading.Lock()

    def __call__(self) -> str | None:
        if self._none:
            return None
        from .gcs import metadata_token

        try:
            return metadata_token()
        except (OSError, ValueError, KeyError):
            with self._lock:
                self._none = True
            return None


class Fetches:
    """This host's fetches by request id: the ops, the peer streams, the downloader and receivers."""

    def __init__(self, send, relay) -> None:
        self.send = send
        self.relay = relay
        self.jobs: dict = {}
        self._cond = threading.Condition()
        self._markers: set[str] = set()  # this host's markers (their paths) still in place
        self._vm_token = _VmToken()
        relay.kinds["fetch"] = self.serve_peer

    def handle(self, message: dict, blob) -> None:
        op, rid = message.get("op"), message.get("id")
        if op == "fetch_probe":
            quiet_thread(self._probe, "tpunb-fetch-probe", message)
        elif op == "fetch_unmark":  # a fetch that ended after its probe: its markers go
            self._unmark(message["root"])
            self.send({"op": "done", "id": rid, "status": "ok"})
        elif op == "fetch_ack":
            job = self.jobs.get(rid)
            if job is not None:
                job.ack(int(message.get("passed", 0)))
        elif op == "fetch_token":
            job = self.jobs.get(rid)
            if job is not None:
                job.token_answer(message)
        elif op == "fetch":
            job = Job(rid, message, self.send)
            with self._cond:
                self.jobs[rid] = job
                self._cond.notify_all()
            work = {"download": self._download, "receive": self._receive}.get(message.get("role"), self._settle)
            quiet_thread(work, "tpunb-fetch", job, message)
        elif op == "fetch_chunk":
            job = self.jobs.get(rid)
            if job is None:
                return
            try:
                if message.get("end"):
                    job.end()
                else:
                    job.put(int(message["file"]), int(message["at"]), blob)
            except FetchError as exc:
                job.fail(exc)
        elif op == "fetch_cancel":
            job = self.jobs.get(rid)
            if job is not None:
                job.fail(FetchError("cancelled by the kernel (the fetch failed elsewhere)", "cancelled"))

    def _wait_job(self, rid) -> Job | None:
        deadline = time.monotonic() + REGISTER_WAIT
        with self._cond:
            while rid not in self.jobs and time.monotonic() < deadline:
                self._cond.wait(0.5)
            return self.jobs.get(rid)

    # -- the probe: where the files go on this host, what is there already, who shares it -----------
    def _probe(self, message: dict) -> None:
        root = None
        try:
            root = root_of(message["place"])
            os.makedirs(root, exist_ok=True)
            disk = os.statvfs(root)
            marker = self._mark(root)
            entries = [Entry.from_wire(w) for w in message["entries"]]
            have = [i for i, entry in enumerate(entries) if already_there(root, entry)]
            partial = sum(_size(target_of(root, e) + ".partial") for i, e in enumerate(entries) if i not in have)
            reply = {"status": "ok", "root": root, "free": disk.f_bavail * disk.f_frsize, "have": have,
                     "partial": partial, "marker": marker, "seen": self._seen(root)}
        except FetchError as exc:
            reply = {"status": "error", "error": str(exc), "kind": exc.kind, "root": root}
        except OSError as exc:
            reply = {"status": "error", "error": f"cannot use {root}: {exc.strerror or exc}", "kind": "disk",
                     "root": root}
        self.send({"op": "done", "id": message.get("id"), **reply})

    def _mark(self, root: str) -> str | None:
        """A marker of this host's own in ``root`` (its name, unique): whoever sees it shares the
        folder. None if it cannot be written (a full disk: the space check then says so)."""
        name = f"{socket.gethostname()}-{os.getpid()}-{os.urandom(8).hex()}"
        path = os.path.join(root, MARKERS, name)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w"):
                pass
        except OSError:
            return None
        with self._cond:
            self._markers.add(path)
        return name

    @staticmethod
    def _seen(root: str) -> list[str]:
        """The markers in ``root``, listed after this host wrote its own. Of two hosts that share
        the folder, the one that lists last sees the other's (each wrote before it listed), so
        the kernel joins them; markers stay until the fetch's second frame."""
        try:
            return sorted(os.listdir(os.path.join(root, MARKERS)))
        except OSError:
            return []

    def _unmark(self, root: str) -> None:
        """This host's markers in ``root`` removed, and the folders a fetch made for them if empty."""
        folder = os.path.join(root, MARKERS)
        with self._cond:
            mine = [p for p in self._markers if os.path.dirname(p) == folder]
            self._markers.difference_update(mine)
        for path in mine:
            try:
                os.unlink(path)
            except OSError:
                pass
        for empty in (folder, os.path.dirname(folder), os.path.dirname(os.path.dirname(folder))):
            try:
                os.rmdir(empty)  # only if empty: a fetch leaves no folder of its own behind
            except OSError:
                break

    # -- receiving ----------------------------------------------------------------------------
    def serve_peer(self, conn: socket.socket, header: dict) -> None:
        """A peer's stream (on the relay's peer thread): each record passed on to this host's
        children in the tree, then written here."""
        job = self._wait_job(header.get("rid"))
        if job is None:
            return
        parent = header.get("from") or ["?", "?"]
        children: list = []
        got = 0
        try:
            children = open_children(self.relay.secret, header.get("tree") or [], job.rid, 0, header["me"],
                                     kind="fetch")
            conn.settimeout(IDLE)
            while not job.stopped:
                head = _read(conn, RECORD.size)
                index, at, size = RECORD.unpack(head)
                forward(children, memoryview(head))
                if index == END:
                    job.end()
                    return
                data = _read(conn, size)
                forward(children, memoryview(data))
                job.put(index, at, data)
                got += size
        except FetchError as exc:
            job.fail(exc)
        except (OSError, RelayError, ValueError) as exc:
            job.fail(FetchError(f"the stream from host {parent[0]} ({parent[1]}) ended after {got:,} bytes "
                                f"({type(exc).__name__}: {exc}): that host died or was cut off", "network"))
        finally:
            for child in children:
                child[1].close()

    def _settle(self, job: Job, message: dict) -> None:
        """Nothing to receive: its markers go, and (for a host that writes its folder) the layout."""
        try:
            self._unmark(job.root)
            job.finish()
            job.answer({"status": "ok", "files": 0, "moved": 0, "from_source": 0})
        except FetchError as exc:
            job.answer({"status": "error", "error": str(exc), "kind": exc.kind})
        finally:
            self.jobs.pop(job.rid, None)

    def _receive(self, job: Job, message: dict) -> None:
        """Finish each file as its last byte lands; done once the stream ended and every file is in place."""
        self._unmark(job.root)
        finished: set[int] = set()
        try:
            while True:
                with job.cond:
                    while not job.ready and not job.ended and job.error is None:
                        if time.monotonic() - job.heard > IDLE:
                            raise FetchError(f"no byte came for {IDLE:.0f} s: fetch again, it resumes", "network")
                        job.cond.wait(1.0)
                    if job.error is not None:
                        raise job.error
                    ready, job.ready, ended = job.ready, [], job.ended
                for index in ready:
                    job.receivers[index].finish()
                    finished.add(index)
                if ended and not ready:
                    break
            for index in sorted(job.need - finished):
                entry = job.entries[index]
                if entry.size:
                    raise FetchError(f"{entry.path}: {job.landed.get(index, 0):,} of {entry.size:,} bytes arrived: "
                                     "fetch again", "network")
                Receiver(entry, job.root).finish()  # an empty file: no chunk ever comes
            job.finish()
            job.answer({"status": "ok", "files": len(job.need), "moved": job.bytes, "from_source": 0})
        except FetchError as exc:
            for receiver in job.receivers.values():
                receiver.abort()
            job.answer({"status": "error", "error": str(exc), "kind": exc.kind})
        finally:
            self.jobs.pop(job.rid, None)

    # -- downloading ----------------------------------------------------------------------------
    def _download(self, job: Job, message: dict) -> None:
        """Every file not in place downloaded, several at once, and each one another host needs
        handed on as it lands (the files already here too)."""
        self._unmark(job.root)
        others = set(message.get("forward") or ())
        via_kernel = bool(message.get("via_kernel"))
        children: list = []
        sending = threading.Lock()  # a record's head and bytes go to the children together
        downloads = None
        try:
            if message.get("tree"):
                children = open_children(self.relay.secret, message["tree"], job.rid, 0, message["me"], kind="fetch")

            def hand(index: int, at: int, data) -> None:
                if index not in others:
                    return
                if children:
                    with sending:
                        forward(children, memoryview(RECORD.pack(index, at, len(data))))
                        forward(children, memoryview(data))
                if via_kernel:
                    job.room(len(data))  # the kernel holds at most a window of them
                    self.send({"op": "fetch_chunk", "id": job.rid, "file": index, "at": at}, bytes(data))

            def token(index: int, entry: Entry, refused: bool) -> str | None:
                if entry.auth != "gcs":
                    return None
                return job.kernel_token(index) if refused else self._vm_token()

            wanted = sorted(job.need | others)
            downloads = Downloads(job.root, hand, job.counted, lambda: job.stopped,
                                  float(message.get("timeout") or TIMEOUT), int(message.get("streams") or STREAMS),
                                  token)
            done = downloads.run([(i, job.entries[i]) for i in wanted])
            if children:
                with sending:
                    forward(children, memoryview(RECORD.pack(END, 0, 0)))
            job.finish()
            moved = sum(o.moved for o in done.values())
            job.answer({"status": "ok", "files": len(wanted), "moved": moved, "from_source": moved,
                        "already": sum(o.already for o in done.values())})
        except FetchError as exc:
            moved = exc.moved if downloads is not None else 0  # bytes came: the source is reachable
            job.answer({"status": "error", "error": str(exc), "kind": exc.kind, "from_source": moved})
        except (RelayError, OSError) as exc:
            kind = "unreachable" if UNREACHABLE in str(exc) else "network"
            job.answer({"status": "error", "error": str(exc), "kind": kind, "from_source": 0})
        finally:
            for child in children:
                child[1].close()
            self.jobs.pop(job.rid, None)


def _read(conn: socket.socket, n: int) -> bytearray:
    """Exactly ``n`` bytes from a peer; RelayError if it closes first."""
    data = bytearray(n)
    view, got = memoryview(data), 0
    while got < n:
        count = conn.recv_into(view[got:])
        if not count:
            raise RelayError("the peer closed the connection")
        got += count
    return data


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
