"""Cloud Storage on this machine, for snapshots of emulated cloud slices: gcp-storage-emulator (PyPI),
a real HTTP server of the JSON API (uploads, downloads, listings, deletes), kept in memory.

tpunb's own client (``tpunb.host.gcs``), gcsfs and google-cloud-storage find it through
``STORAGE_EMULATOR_HOST``; tensorstore (orbax's storage layer) through ``TENSORSTORE_GCS_HTTP_URL``,
which hosts set from the former (``tpunb_host.snapshot.storage_env``). Where it differs from Cloud
Storage: no authentication, no IAM, no generations or retention, one process's memory.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


class StorageEmulator:
    """``gcp-storage-emulator start`` on a free loopback port, with ``buckets`` created."""

    def __init__(self, buckets: tuple[str, ...] = ("sandbox-bucket",), host: str = "127.0.0.1") -> None:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        self.url = f"http://{host}:{port}"
        command = shutil.which("gcp-storage-emulator") or str(Path(sys.executable).parent / "gcp-storage-emulator")
        if not Path(command).exists():
            raise RuntimeError("gcp-storage-emulator is not installed: pip install gcp-storage-emulator")
        self.process = subprocess.Popen([command, "start", f"--host={host}", f"--port={port}", "--in-memory"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready()
            for bucket in buckets:
                self.create_bucket(bucket)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b?project=sandbox", timeout=1):
                    return
            except urllib.error.HTTPError:
                return  # it answers
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gcp-storage-emulator did not start at {self.url}") from None
                time.sleep(0.05)  # a process starting up: nothing to wait on but its port

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(f"{self.url}/storage/v1/b?project=sandbox", method="POST",
                                         data=json.dumps({"name": name}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10):
            pass

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> "StorageEmulator":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class StorageGate:
    """Cloud Storage's authentication and IAM in front of a ``StorageEmulator`` (which has neither),
    for tests of who may read a bucket: every request needs a bearer token, ``principal_of(token)``
    names its account (None: a token Google never issued), and a bucket named in ``grants`` is read
    only by the principals listed (as ``roles/storage.objectViewer``). Answers as the JSON API does
    (cloud.google.com/storage/docs/json_api/v1/status-codes): 401 without a valid token, 403 for a
    valid one without the permission. Everything else goes to the emulator unchanged."""

    def __init__(self, upstream: str, principal_of, grants: dict[str, set[str]] | None = None,
                 host: str = "127.0.0.1") -> None:
        import threading
        from http.server import ThreadingHTTPServer

        self.upstream = upstream.rstrip("/")
        self.principal_of = principal_of
        self.grants: dict[str, set[str]] = grants or {}
        #: (principal or None, token, method, path) of every request, in order
        self.log: list[tuple] = []
        self._server = ThreadingHTTPServer((host, 0), _gate_handler(self))
        self._server.daemon_threads = True
        self.url = "http://%s:%d" % self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True, name="tpunb-storage-gate")
        self._thread.start()

    def refusal(self, method: str, path: str, authorization: str) -> tuple[int, str] | None:
        """Why this request is refused ((status, message)), or None to pass it on."""
        import re

        token = authorization[len("Bearer "):].strip() if authorization.startswith("Bearer ") else ""
        principal = self.principal_of(token) if token else None
        self.log.append((principal, token, method, path))
        found = re.match(r"^/(?:download/|upload/)?storage/v1/b/([^/?]+)", path)
        bucket = found.group(1) if found else None
        permission = "storage.objects.list" if re.match(r"^/storage/v1/b/[^/]+/o/?(\?|$)", path) else \
            "storage.objects.get"
        if not token:
            return 401, (f"Anonymous caller does not have {permission} access to the Google Cloud Storage bucket. "
                         f"Permission '{permission}' denied on resource (or it may not exist).")
        if principal is None:
            return 401, "Invalid Credentials"
        if bucket in self.grants and principal not in self.grants[bucket]:
            return 403, (f"{principal} does not have {permission} access to the Google Cloud Storage object. "
                         f"Permission '{permission}' denied on resource (or it may not exist).")
        return None

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "StorageGate":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _gate_handler(gate: StorageGate):
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _any(self) -> None:
            refused = gate.refusal(self.command, self.path, self.headers.get("Authorization") or "")
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if refused is not None:
                status, message = refused
                data = json.dumps({"error": {"code": status, "message": message,
                                             "errors": [{"message": message, "domain": "global",
                                                         "reason": "required" if status == 401 else "forbidden"}]}}
                                  ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                if status == 401:
                    self.send_header("WWW-Authenticate", 'Bearer realm="https://accounts.google.com/"')
                self.end_headers()
                self.wfile.write(data)
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("authorization", "host")}
            request = urllib.request.Request(gate.upstream + self.path, data=body, method=self.command,
                                             headers=headers)
            try:
                answer = urllib.request.urlopen(request, timeout=60)
            except urllib.error.HTTPError as exc:
                answer = exc
            with answer:
                data = answer.read()
                self.send_response(answer.status if hasattr(answer, "status") else answer.code)
                for name, value in answer.headers.items():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _any

    return Handler
