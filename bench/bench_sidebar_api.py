"""What the sidebar's refresh costs the Jupyter server: GET /tpunb/api/slices with 50 slices.

Run: python bench/bench_sidebar_api.py [--slices 50] [--runs 300]

A real Jupyter server (``python -m jupyter_server``, tpunb.server loaded) on loopback, its
registry under a temp TPUNB_HOME holding N local slices of 2 hosts each, owned by this live
process (so every slice and host reads as running, the costlier path). Each sample is one full
HTTP request from this process, token-authenticated, as the panel's Poll makes it; p50 and p99.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slices", type=int, default=50)
    ap.add_argument("--runs", type=int, default=300)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="tpunb-bench-"))
    os.environ["TPUNB_HOME"] = str(home)
    from tpunb.provision.local import free_port
    from tpunb.registry import HostInfo, HostRecord, Registry, SliceRecord

    reg = Registry()
    for i in range(args.slices):
        reg.save_slice(SliceRecord(name=f"s{i}", accelerator="v4-16", backend="local", state="running",
                                   owner_pid=os.getpid(),
                                   hosts=[HostRecord(h, "localhost", HostInfo(pid=os.getpid())) for h in range(2)]))
    port, token = free_port(), "bench"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "cfg"), "JUPYTER_RUNTIME_DIR": str(home / "rt")}
    server = subprocess.Popen([sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={port}",
                               "--ip=127.0.0.1", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={home}",
                               "--allow-root", "--ServerApp.jpserver_extensions={'tpunb.server': True}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=home,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}/tpunb/api/slices"
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                body = json.load(urllib.request.urlopen(request, timeout=5))
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the Jupyter server did not answer within 60 s")
                time.sleep(0.1)  # the server is starting: poll again
        assert len(body["slices"]) == args.slices and all(s["state"] == "running" for s in body["slices"])
        for _ in range(20):
            urllib.request.urlopen(request, timeout=5).read()
        samples = []
        for _ in range(args.runs):
            started = time.perf_counter()
            urllib.request.urlopen(request, timeout=5).read()
            samples.append(time.perf_counter() - started)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    ordered = sorted(samples)
    p50, p99 = statistics.median(ordered) * 1e3, ordered[int(len(ordered) * 0.99) - 1] * 1e3
    print(f"GET /tpunb/api/slices, {args.slices} slices x 2 hosts, {args.runs} requests: "
          f"p50 {p50:.1f} ms, p99 {p99:.1f} ms (target < 50 ms: {'met' if p50 < 50 else 'NOT met'})")


if __name__ == "__main__":
    main()
