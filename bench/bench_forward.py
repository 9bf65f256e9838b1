"""A port forward over SSH: tpunb's Slice.forward against OpenSSH's ``ssh -L``, side by side.

Run: python bench/bench_forward.py [--megabytes 256] [--requests 400] [--repeat 3]

One real sshd host on loopback (tpunb.sandbox.hosts.sshd), one HTTP server on it started as a tpunb
service (``/big``: the download, from memory; ``/small``: 16 bytes). Three ways to reach it from
here: ``Slice.forward`` as it is by default with ``ssh`` on PATH (each connection handed to an
OpenSSH ControlMaster), ``Slice.forward`` with ``TPUNB_FORWARD=paramiko`` (direct-tcpip channels
on the slice's paramiko connection) and ``ssh -N -L`` (OpenSSH's client, its own connection to
the same sshd). Measured, alternating between them so load from elsewhere hits all alike: the download's throughput, and HTTP request latency
(a new connection per request, as browsers and urllib do) with 1 and with 32 concurrent clients,
from a client process of its own (as a browser is).
Prints a Markdown table and the ratios against the goal (throughput >= 0.8x, p50 <= 1.2x).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SERVER = r'''
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
SIZE = int(sys.argv[2]) << 20
BLOCK = b"x" * (1 << 20)
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def do_GET(self):
        size = SIZE if self.path == "/big" else 16
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        left = size
        while left:
            chunk = BLOCK[:min(left, len(BLOCK))]
            self.wfile.write(chunk)
            left -= len(chunk)
    def log_message(self, *args):
        pass
ThreadingHTTPServer.request_queue_size = 256
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str) -> int:
    """One GET on a new connection; the body's size (read in 1 MiB chunks)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        size = 0
        while chunk := reply.read(1 << 20):
            size += len(chunk)
        return size
    finally:
        conn.close()


def throughput(port: int, megabytes: int) -> float:
    started = time.perf_counter()
    size = get(port, "/big")
    assert size == megabytes << 20, size
    return size / (time.perf_counter() - started) / 1e6


def latencies(port: int, requests: int, clients: int) -> list[float]:
    def one(_: int) -> float:
        started = time.perf_counter()
        assert get(port, "/small") == 16
        return (time.perf_counter() - started) * 1000

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(one, range(requests)))


def measure(port: int, what: str, amount: int, clients: int) -> list[float]:
    """Run a measurement in a process of its own, as a browser would be: the clients' threads
    must not share the kernel's interpreter (and its lock) with the forward they measure."""
    out = subprocess.run([sys.executable, __file__, "--client", str(port), what, str(amount), str(clients)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def client(port: int, what: str, amount: int, clients: int) -> None:
    values = [throughput(port, amount)] if what == "download" else latencies(port, amount, clients)
    print(json.dumps(values))


def wait_listening(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=256)
    parser.add_argument("--requests", type=int, default=400, help="HTTP requests per latency run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--client", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        port, what, amount, clients = args.client
        return client(int(port), what, int(amount), int(clients))

    home = Path(tempfile.mkdtemp(prefix="bench-forward-"))
    os.environ["TPUNB_HOME"] = str(home)
    os.environ["CLOUDSDK_CONFIG"] = str(home / "gcloud")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tpunb import report, manager
    from tpunb.sandbox.hosts.sshd import Sshd, write_ed25519

    sshd = Sshd(hosts=1, directory=home / "sshd")
    key = home / "id_ed25519"
    sshd.authorize(write_ed25519(key))
    address = sshd.addresses[0]
    script = home / "server.py"
    script.write_text(SERVER)
    port = free_port()
    with report.captured():
        sl = manager.connect([f"{address}:{sshd.port}"], key=str(key), python=sshd.python, name="bench-forward")
        sl.serve("files", f"exec {shlex.quote(sshd.python)} {script} {port} {args.megabytes}", wait_port=port)
    ours = int(sl.forward(port).rsplit(":", 1)[1].strip("/"))
    os.environ["TPUNB_FORWARD"] = "paramiko"
    paramiko_port = int(sl.forward(port, local_port=free_port()).rsplit(":", 1)[1].strip("/"))
    del os.environ["TPUNB_FORWARD"]
    theirs = free_port()
    ssh = subprocess.Popen(["ssh", "-N", "-L", f"{theirs}:127.0.0.1:{port}", "-i", str(key), "-p", str(sshd.port),
                            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                            "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", f"{sshd.user}@{address}"])
    try:
        wait_listening(theirs)
        contenders = {"tpunb forward": ours, "tpunb forward (paramiko)": paramiko_port, "ssh -L": theirs}
        results: dict[str, dict[str, list]] = {name: {"mbps": [], "lat1": [], "lat32": []} for name in contenders}
        for _ in range(args.repeat):
            for name, local in contenders.items():
                results[name]["mbps"] += measure(local, "download", args.megabytes, 1)
                results[name]["lat1"] += measure(local, "latency", args.requests // 4, 1)
                results[name]["lat32"] += measure(local, "latency", args.requests, 32)
    finally:
        ssh.terminate()
        ssh.wait()
        with report.captured():
            manager.down("bench-forward")
        sshd.close()

    def pct(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=100)[q - 1]

    rows = {}
    print(f"\n{args.megabytes} MB download (median of {args.repeat}) and HTTP latency, a new connection per request\n")
    print("| | MB/s | p50 ms (1 client) | p99 ms (1 client) | p50 ms (32 clients) | p99 ms (32 clients) |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        rows[name] = (statistics.median(r["mbps"]), pct(r["lat1"], 50), pct(r["lat1"], 99),
                      pct(r["lat32"], 50), pct(r["lat32"], 99))
        print(f"| {name} | " + " | ".join(f"{v:.1f}" if i == 0 else f"{v:.2f}" for i, v in enumerate(rows[name])) + " |")
    b = rows["ssh -L"]
    for name in ("tpunb forward", "tpunb forward (paramiko)"):
        a = rows[name]
        print(f"\n{name}: throughput {a[0] / b[0]:.2f}x ssh -L (goal >= 0.8x); p50 {a[1] / b[1]:.2f}x (1 client), "
              f"{a[3] / b[3]:.2f}x (32 clients) (goal <= 1.2x)")


if __name__ == "__main__":
    main()
