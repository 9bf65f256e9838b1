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
