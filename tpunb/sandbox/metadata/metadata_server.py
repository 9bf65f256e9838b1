"""The GCE metadata server, as the emulated nodes' VMs see it.

A real VM asks ``http://metadata.google.internal/computeMetadata/v1/...`` (header
``Metadata-Flavor: Google``) for its service account's access token and its instance
attributes. Here each emulated host is a loopback address, so the stand-in listens on every
address of the pool at one port and answers for the node that holds the address it was reached
at: a host's processes find it through ``GCE_METADATA_HOST=<address>:<port>`` (the variable
google-auth honours), which the sshd and the emulator's boot set per host.

Served: ``instance/service-accounts/default/token`` (a token the emulator accepts on its API
for the node's project, for an hour), ``instance/attributes/`` and ``instance/attributes/KEY``
(the node's metadata plus what a TPU VM's has: ``accelerator-type``, ``agent-worker-number``,
``worker-network-endpoints`` and ``tpu-env``, see ``vms.tpu_attributes``), ``project/project-id``,
``instance/zone``. ``instance/preempted`` (TRUE from a preemption notice on) and
``instance/maintenance-event`` (TERMINATE_ON_HOST_MAINTENANCE then, else NONE), each also as a
hanging GET (``?wait_for_change=true`` with ``last_etag`` and ``timeout_sec``; every answer carries
an ``ETag``), as GCE serves them.
``PUT instance/guest-attributes/NAMESPACE/KEY`` stores a worker's guest attribute, which the API's
``nodes.getGuestAttributes`` returns (403 unless the node's metadata has ``enable-guest-attributes=TRUE``).
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpunb.sandbox.state import Emulator

PREFIX = "/computeMetadata/v1/"
GUEST = "instance/guest-attributes/"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        if self.headers.get("Metadata-Flavor") != "Google":
            self._send(403, "Missing required header Metadata-Flavor: Google", "text/html")
            return
        if not self.path.startswith(PREFIX):
            self._send(404, "not found")
            return
        address = self.connection.getsockname()[0]
        path, _, query = self.path[len(PREFIX):].partition("?")
        emu = self.server.emulator
        answer = emu.call(emu.metadata_answer, address, path)
        options = urllib.parse.parse_qs(query)
        if options.get("wait_for_change", [""])[0].lower() == "true" and answer is not None:
            answer = self._wait_for_change(address, path, answer, options)
        if answer is None:
            self._send(404, f"no metadata {path!r} for host {address}")
        elif isinstance(answer, dict):
            self._send(200, json.dumps(answer), "application/json")
        else:
            self._send(200, str(answer))

    def _wait_for_change(self, address: str, path: str, answer, options: dict):
        """A hanging GET, as the metadata server answers one: held until the value's ETag differs from
        ``last_etag`` (by default, the value now) or ``timeout_sec`` passes."""
        emu = self.server.emulator
        last = options.get("last_etag", [_etag(answer)])[0]
        deadline = time.monotonic() + min(float(options.get("timeout_sec", ["60"])[0]), 300.0)
        while _etag(answer) == last and time.monotonic() < deadline and not self.server.stopping.is_set():
            self.server.stopping.wait(0.05)  # the emulator's clock has no event per key to wake on
            answer = emu.call(emu.metadata_answer, address, path)
            if answer is None:
                return None
        return answer

    def do_PUT(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        value = self.rfile.read(length).decode() if length else ""
        path = self.path[len(PREFIX):].split("?", 1)[0] if self.path.startswith(PREFIX) else ""
        attribute = path[len(GUEST):] if path.startswith(GUEST) else ""
        if self.headers.get("Metadata-Flavor") != "Google":
            self._send(403, "Missing required header Metadata-Flavor: Google", "text/html")
        elif attribute.count("/") != 1 or not all(attribute.split("/")):
            self._send(404, f"cannot write {path!r}: only {GUEST}NAMESPACE/KEY")
        else:
            emu = self.server.emulator
            stored = emu.call(emu.put_guest_attribute, self.connection.getsockname()[0], attribute, value)
            if stored is None:
                self._send(404, "no node holds this host")
            elif not stored:
                self._send(403, "Guest attributes endpoint access is disabled.")
            else:
                self._send(200, "")

    def _send(self, code: int, text: str, kind: str = "application/text") -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("ETag", _etag(text))
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _etag(answer) -> str:
    text = json.dumps(answer) if isinstance(answer, dict) else str(answer)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], emulator: Emulator) -> None:
        super().__init__(address, _Handler)
        self.emulator = emulator
        self.stopping = threading.Event()  # ends hanging GETs when the server stops

    def handle_error(self, request, client_address) -> None:
        """A VM that died while its hanging GET waited (a preempted host) is no error of ours."""
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class MetadataServer:
    """One listener per host address, all answering from the same emulator."""

    def __init__(self, emulator: Emulator, addresses: list[str], port: int) -> None:
        self.port = port
        self._servers = [_Server((address, port), emulator) for address in addresses]
        self._threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                                          name=f"tpu-emulator-metadata-{s.server_address[0]}")
                         for s in self._servers]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        for server in self._servers:
            server.stopping.set()
            server.shutdown()
            server.server_close()
