"""tpunb's own time in the cloud magics: a whole %tpu_launch, and %tpu_status with 50 slices.

    python bench/bench_cloud_magics.py [--runs 10] [--slices 50]

Runs against the sandbox (tpunb.sandbox.box: the Cloud TPU API emulator whose nodes'
hosts are a real sshd here). A launch's wall time is split into: waiting on the API (every HTTP
request and every poll wait, timed), waiting on the hosts (SSH connect and the agents' start,
timed), and the rest, which is tpunb's own overhead (target < 200 ms). %tpu_status is timed with
50 cloud slices in the registry, all listed from the API (target < 200 ms).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_provision_overhead import Meter  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--slices", type=int, default=50)
    args = parser.parse_args()
    os.environ["TPUNB_HOME"] = tempfile.mkdtemp(prefix="tpunb-bench-")

    from tpunb import manager as api
    from tpunb.provision import ssh as ssh_backend
    from tpunb import slice as slice_module
    from tpunb.sandbox.box import start_sandbox
    from tpunb.provision.gcp.tpu import api as gcp
    from tpunb.provision import warm
    from tpunb.registry import SliceRecord

    sandbox = start_sandbox(hosts=2, create_seconds=0.3)
    meter = Meter()
    meter.install()
    hosts = {"seconds": 0.0}
    connect_hosts, start_agents = ssh_backend.connect_hosts, slice_module.Slice.connect

    def timed(function):
        def wrapper(*a, **kw):
            started = time.perf_counter()
            try:
                return function(*a, **kw)
            finally:
                hosts["seconds"] += time.perf_counter() - started
        return wrapper

    ssh_backend.connect_hosts = timed(connect_hosts)
    slice_module.Slice.connect = timed(start_agents)
    warm.ready()  # importing google-cloud-tpu happens once per kernel, in the background
    rows = []
    sink = io.StringIO()
    for run in range(args.runs + 1):
        meter.reset()
        hosts["seconds"] = 0.0
        with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
            started = time.perf_counter()
            api.launch("v4-16", name=f"bench-{run}")
            wall = time.perf_counter() - started
        if run:  # the first launch also creates the kernel's API client: reported apart
            rows.append((wall, meter.http + meter.waits, hosts["seconds"]))
        else:
            first = (wall, meter.http + meter.waits, hosts["seconds"])
        with contextlib.redirect_stdout(sink):
            api.down(f"bench-{run}")

    sandbox.stop()
    # %tpu_status with N cloud slices: nodes in an emulator (no SSH hosts needed), records in the registry
    from tpunb.sandbox import start_emulator

    url, emulator = start_emulator(create_seconds=0.01, delete_seconds=0.01)
    project, zone = "bench", "us-central2-b"
    os.environ.update({"TPUNB_TPU_API_ENDPOINT": url, "GOOGLE_CLOUD_PROJECT": project, "CLOUDSDK_COMPUTE_ZONE": zone})
    reg = api.registry()
    for i in range(args.slices):
        name = f"status-{i}"
        gcp.create(gcp.NodeSpec(name=name, accelerator="v4-8", project=project, zone=zone))
        reg.save_slice(SliceRecord(name=name, accelerator="v4-8", backend="gcp", state="running",
                                   spec={"project": project, "zone": zone, "spot": False}))
    api.status()
    timings = []
    for _ in range(20):
        started = time.perf_counter()
        frame = api.status()
        timings.append(time.perf_counter() - started)
    assert len(frame) == args.slices and set(frame["cloud_state"]) == {"READY"}
    emulator.stop()

    own = [w - api_s - host_s for w, api_s, host_s in rows]
    print(f"\nPython {sys.version.split()[0]}, {os.cpu_count()} cores, sandbox emulator (0.3 s in CREATING), "
          f"{args.runs} launches of v4-16 (2 hosts)\n")
    print("| measurement | wall (median) | waiting on the API | waiting on hosts (SSH + agents) | tpunb's own (median / worst) | target |")
    print("|---|---|---|---|---|---|")
    print(f"| %tpu_launch v4-16, first in the kernel | {first[0] * 1e3:.0f} ms | {first[1] * 1e3:.0f} ms | "
          f"{first[2] * 1e3:.0f} ms | {(first[0] - first[1] - first[2]) * 1e3:.0f} ms | - |")
    print(f"| %tpu_launch v4-16 | {statistics.median(r[0] for r in rows) * 1e3:.0f} ms | "
          f"{statistics.median(r[1] for r in rows) * 1e3:.0f} ms | {statistics.median(r[2] for r in rows) * 1e3:.0f} ms | "
          f"{statistics.median(own) * 1e3:.0f} ms / {max(own) * 1e3:.0f} ms | < 200 ms |")
    print(f"| %tpu_status, {args.slices} cloud slices (one list call) | {statistics.median(timings) * 1e3:.0f} ms | "
          f"| | p50 {statistics.median(timings) * 1e3:.0f} ms / max {max(timings) * 1e3:.0f} ms | < 200 ms |")


if __name__ == "__main__":
    main()
