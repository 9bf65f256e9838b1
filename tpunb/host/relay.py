"""Relay of a pushed value inside the slice: the kernel sends it once, hosts pass it on.

Shipped to hosts: standard library only (see the package docstring).

Why: across a slow link the notebook's uplink is the bottleneck, and a value for N hosts would
cross it N times. The kernel cuts the value into K stripes (byte ranges) and sends stripe j over
SSH to one host, the root of stripe j's tree (K SSH channels fill their windows at once); every
host forwards each chunk to its children over the slice's own network as the chunk arrives, so a
tree is pipelined, and places it at its offset in one buffer, whole once all K stripes arrived.
Every host still answers its own ``done`` over its SSH channel.

The link is authenticated both ways: the listener and the connecting peer each prove they hold
the slice's secret (HMAC-SHA256 over both sides' random nonces), which the kernel made for this
session and sent in the init frame over SSH. A peer that cannot prove it is dropped. A host
listens only on its slice-internal address (the address sshd was reached on), on an ephemeral
port, opened at the first relay.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
import threading
import time

from .io import quiet_thread

#: frames the relay answers on a side thread (not requests): open the listener, give up a transfer
OPS = ("relay_listen", "relay_cancel")
CHUNK = 1 << 20
NONCE = 32
#: seconds a peer gets to prove the secret and name its transfer
AUTH_TIMEOUT = 5.0
#: seconds without a byte from a parent after which a transfer fails
IDLE_TIMEOUT = 30.0
_LENGTH = struct.Struct("!I")
#: how a host's error says a peer could not be reached (the kernel then sends directly)
UNREACHABLE = "to relay to it"


class RelayError(Exception):
    """A transfer that cannot go on; its text names the peer and what happened."""


#: the host's slice-internal address, where its backend knows it (a pod's IP): its init environment says
PEER_ADDRESS = "TPUNB_PEER_ADDRESS"


def own_address() -> str:
    """This host's slice-internal address: what its backend said (``$TPUNB_PEER_ADDRESS``), else the
    server address of SSH_CONNECTION (where sshd was reached), else loopback (a host on this machine)."""
    given = os.environ.get(PEER_ADDRESS)
    if given:
        return given
    parts = os.environ.get("SSH_CONNECTION", "").split()
    return parts[2] if len(parts) == 4 else "127.0.0.1"


def _mac(secret: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, label + first + second, hashlib.sha256).digest()


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        if not piece:
            raise RelayError("the peer closed the connection")
        data += piece
    return data


def accept_auth(sock: socket.socket, secret: bytes) -> bool:
    """Listener side: the peer proves the secret over our nonce, then we prove it over theirs."""
    mine = secrets.token_bytes(NONCE)
    sock.sendall(mine)
    theirs = recv_exact(sock, NONCE)
    proof = recv_exact(sock, 32)
    if not hmac.compare_digest(proof, _mac(secret, b"connect", mine, theirs)):
        return False
    sock.sendall(_mac(secret, b"accept", theirs, mine))
    return True


def connect_auth(sock: socket.socket, secret: bytes) -> None:
    """Connecting side of ``accept_auth``; RelayError if the listener does not prove the secret."""
    theirs = recv_exact(sock, NONCE)
    mine = secrets.token_bytes(NONCE)
    sock.sendall(mine + _mac(secret, b"connect", theirs, mine))
    if not hmac.compare_digest(recv_exact(sock, 32), _mac(secret, b"accept", mine, theirs)):
        raise RelayError("the peer did not prove the slice's secret")


class Transfer:
    """One value arriving as ``stripes`` stripes, each from its parent: which began, how many
    arrived whole, and how it ended."""

    def __init__(self, size: int, stripes: int, data: bytearray | None = None) -> None:
        self.data = bytearray(size) if data is None else data
        self.stripes = stripes
        self.begun: set[int] = set()  # the stripes' first offsets
        self.arrived = 0
        self.error: str | None = None
        self.done = False

    def claim(self, lo: int, size: int, stripes: int) -> bool:
        """Whether stripe ``lo`` is new and fits this value (False: a duplicate or a stray peer)."""
        if lo in self.begun or size != len(self.data) or stripes != self.stripes:
            return False
        self.begun.add(lo)
        return True

    def arrive(self) -> None:
        self.arrived += 1
        self.done = self.arrived >= self.stripes


class Relay:
    """This host's side of the relay: a listener for its parent, streams to its children."""

    def __init__(self, secret_hex: str | None) -> None:
        self.secret = bytes.fromhex(secret_hex) if secret_hex else None
        self.server: socket.socket | None = None
        self.refused = 0  # peers that did not prove the secret
        self._cond = threading.Condition()
        self._transfers: dict[int, Transfer] = {}
        self._cancelled: set[int] = set()
        #: handlers of streams other than pushed values, by the header's ``kind``: (socket, header)
        self.kinds: dict = {}

    # -- side-thread ops ----------------------------------------------------------------
    def handle(self, message: dict) -> dict | None:
        """A relay_listen answer (to send as the request's done), or None for relay_cancel."""
        if message.get("op") == "relay_listen":
            return self.listen()
        self.cancel(message.get("rid"))
        return None

    def listen(self) -> dict:
        """Open the listener once (slice-internal address, ephemeral port) and say where it is."""
        if self.secret is None:
            return {"status": "error", "error": "this host got no relay secret: restart the slice"}
        if self.server is None:
            address = own_address()
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            try:
                self.server = socket.create_server((address, 0), family=family, backlog=64)
            except OSError as exc:
                return {"status": "error", "error": f"cannot listen on {address}: {exc}"}
            quiet_thread(self._accept, "tpunb-relay-listen")
        address, port = self.server.getsockname()[:2]
        return {"status": "ok", "address": address, "port": port}

    def cancel(self, rid) -> None:
        with self._cond:
            self._cancelled.add(rid)
            transfer = self._transfers.get(rid)
            if transfer is not None and not transfer.done:
                transfer.error = transfer.error or "cancelled by the kernel (the push failed elsewhere)"
            self._cond.notify_all()

    # -- receiving ------------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            quiet_thread(self._serve, "tpunb-relay-peer", conn)

    def _serve(self, conn: socket.socket) -> None:
        children: list = []
        transfer = None
        try:
            conn.settimeout(AUTH_TIMEOUT)
            if not accept_auth(conn, self.secret):
                self.refused += 1
                return
            header = json.loads(recv_exact(conn, _LENGTH.unpack(recv_exact(conn, _LENGTH.size))[0]))
            if header.get("kind") in self.kinds:  # a fetch's stream: its handler reads the rest
                self.kinds[header["kind"]](conn, header)
                return
            rid, size, parent = header["rid"], int(header["size"]), header["from"]
            lo, hi = header.get("stripe", [0, size])
            stripes = int(header.get("stripes", 1))
            with self._cond:
                if rid in self._cancelled:
                    return
                found = self._transfers.get(rid) or self._transfers.setdefault(rid, Transfer(size, stripes))
                if not found.claim(lo, size, stripes):
                    return
                transfer = found
            children = open_children(self.secret, header["tree"], rid, size, header["me"], [lo, hi], stripes)
            self._receive(conn, transfer, children, parent, lo, hi)
        except (OSError, RelayError, ValueError, KeyError) as exc:
            if transfer is None:
                self.refused += 1
            else:
                self._fail(transfer, f"{type(exc).__name__}: {exc}")
        finally:
            for child in children:
                child[1].close()
            conn.close()

    def _receive(self, conn: socket.socket, transfer: Transfer, children: list, parent: list, lo: int, hi: int) -> None:
        """Stripe [lo, hi) from the parent into place, each chunk passed on as it comes."""
        view, got = memoryview(transfer.data), lo
        conn.settimeout(1.0)
        heard = time.monotonic()
        while got < hi:
            if transfer.error:
                return
            try:
                n = conn.recv_into(view[got:min(hi, got + CHUNK)])
            except socket.timeout:
                if time.monotonic() - heard > IDLE_TIMEOUT:
                    self._fail(transfer, f"the relay from host {parent[0]} ({parent[1]}) sent nothing for "
                                         f"{IDLE_TIMEOUT:.0f} s")
                    return
                continue
            if not n:
                self._fail(transfer, f"the relay from host {parent[0]} ({parent[1]}) ended after "
                                     f"{got - lo:,} of {hi - lo:,} bytes (that host died or was cut off)")
                return
            heard = time.monotonic()
            forward(children, view[got:got + n])
            got += n
        with self._cond:
            transfer.arrive()
            self._cond.notify_all()

    def _fail(self, transfer: Transfer, why: str) -> None:
        with self._cond:
            transfer.error = transfer.error or why
            self._cond.notify_all()

    def wait(self, rid, timeout: float) -> bytearray:
        """The value of transfer ``rid`` once whole; RelayError if it failed, was cancelled or did
        not begin within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                transfer = self._transfers.get(rid)
                if rid in self._cancelled and (transfer is None or not transfer.done):
                    self._transfers.pop(rid, None)
                    raise RelayError(transfer.error if transfer and transfer.error else "cancelled by the kernel")
                if transfer is not None and (transfer.done or transfer.error):
                    del self._transfers[rid]
                    if transfer.error:
                        raise RelayError(transfer.error)
                    return transfer.data
                left = deadline - time.monotonic()
                if transfer is None and left <= 0:
                    self._cancelled.add(rid)
                    raise RelayError(f"no relay reached this host within {timeout:.0f} s")
                self._cond.wait(max(0.05, min(1.0, left)) if transfer is None else 1.0)

    # -- sending (the root) ---------------------------------------------------------------
    def send_tree(self, blob: bytearray, tree: list, rid, me: list, stripe: list | None = None,
                  stripes: int = 1) -> None:
        """A root: stripe [lo, hi) of ``blob`` (the whole value's layout; all of it by default)
        streamed to its children chunk by chunk, and kept toward this host's own copy (``wait``);
        RelayError naming a child that cannot be reached. A cancel (the push failed elsewhere)
        ends the streaming; this host's own copy still counts (``wait`` says whether it is whole)."""
        lo, hi = stripe or [0, len(blob)]
        with self._cond:
            transfer = self._transfers.get(rid) or self._transfers.setdefault(rid, Transfer(len(blob), stripes, blob))
            if not transfer.claim(lo, len(blob), stripes):
                raise RelayError(f"stripe at {lo} of this value came twice")
            if transfer.data is not blob:  # other stripes began arriving first: this one joins them
                transfer.data[lo:hi] = memoryview(blob)[lo:hi]
            transfer.arrive()
            self._cond.notify_all()
        children = open_children(self.secret, tree, rid, len(blob), me, [lo, hi], stripes)
        try:
            view = memoryview(transfer.data)
            for start in range(lo, hi, CHUNK):
                if rid in self._cancelled:
                    break
                forward(children, view[start:min(hi, start + CHUNK)])
        finally:
            for child in children:
                child[1].close()

    def forget(self, rid) -> None:
        """Drop a transfer this host gives up (its buffer with it)."""
        with self._cond:
            self._cancelled.add(rid)
            self._transfers.pop(rid, None)
            self._cond.notify_all()


def open_children(secret: bytes, tree: list, rid, size: int, me: list, stripe: list | None = None,
                  stripes: int = 1, kind: str | None = None) -> list:
    """Connect to each child ([index, address, port, subtree]), prove the secret, send its header
    (``kind``: a stream other than a pushed value, which the child's ``kinds`` handler takes)."""
    children = []
    try:
        for index, address, port, subtree in tree:
            try:
                sock = socket.create_connection((address, port), timeout=AUTH_TIMEOUT)
            except OSError as exc:
                raise RelayError(f"cannot reach host {index} ({address}:{port}) {UNREACHABLE}: {exc}") from None
            children.append([index, sock])
            connect_auth(sock, secret)
            sock.settimeout(IDLE_TIMEOUT)
            header = json.dumps({"rid": rid, "size": size, "tree": subtree, "from": me, "me": [index, address],
                                 "stripe": stripe or [0, size], "stripes": stripes,
                                 **({"kind": kind} if kind else {})}).encode()
            sock.sendall(_LENGTH.pack(len(header)) + header)
    except BaseException:
        for child in children:
            child[1].close()
        raise
    return children


def forward(children: list, chunk: memoryview) -> None:
    """Send a chunk to every child still reachable; a child that fails is dropped (its host, and
    the hosts below it, report the broken stream to the kernel themselves)."""
    for child in list(children):
        try:
            child[1].sendall(chunk)
        except OSError:
            child[1].close()
            children.remove(child)
