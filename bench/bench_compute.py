"""Compute Engine against the Cloud TPU API on the sandbox: tpunb's own time in a launch beyond the
API's, teardown to nothing left, and the survey of every zone (issue 36).

    python bench/bench_compute.py [--rounds 3] [--tree PATH]

One sandbox (``start_sandbox``: both emulated APIs, real sshd hosts) serves every row, the APIs
alternating round by round. A launch (``manager.launch``, what ``%tpu_launch`` runs) is split into:
the API (every HTTP request, timed at google-auth's ``AuthorizedSession.request``, which both
google-cloud-tpu and google-cloud-compute use over REST, server-side waits included), tpunb's
deliberate poll waits (``shared.pause``), the hosts (SSH connections; reading each VM's worker id,
Compute Engine only; the agents' start, with host preparation), and the rest: tpunb's own time.
The emulated API's own delay is what the sandbox is told (``create_seconds``: a node CREATING, a
VM PROVISIONING to RUNNING); "beyond the API's delay" is the API time plus poll waits less that.
Teardown is ``manager.down`` until Google's own clients (google-cloud-compute, google-cloud-tpu)
list nothing of the slice. The survey is what a status view asks: Compute Engine's four
aggregatedList calls, the Cloud TPU API's ``locations/-`` list, and whole ``manager.status()``
views with no slice and with a few of each API.

``--tree PATH`` runs another tree's tpunb (main before a change) with this script.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_provision_overhead import Meter as ApiMeter  # noqa: E402

PROJECT = "sandbox-project"
CREATE, DELETE, QUEUE = 0.3, 0.1, 0.1
#: label, accelerator, --api, zone: the same type through both APIs, then TPU7x's MIG
LAUNCHES = [("v5p-8 --api tpu (one VM)", "v5p-8", "tpu", "us-east5-a"),
            ("v5p-8 --api compute (one instance)", "v5p-8", "compute", "us-east5-a"),
            ("v5p-16 --api tpu (2 VMs)", "v5p-16", "tpu", "us-east5-a"),
            ("v5p-16 --api compute (MIG of 2)", "v5p-16", "compute", "us-east5-a"),
            ("tpu7x-32 (MIG of 4, Compute Engine only)", "tpu7x-32", None, "us-central1-c")]


class Meter(ApiMeter):
    """bench_provision_overhead's (HTTP requests, poll waits), and the time in each host phase."""

    def __init__(self) -> None:
        super().__init__()
        #: "closing": %tpu_down ending the hosts' agents and services (before the cloud deletion)
        self.hosts = {"ssh": 0.0, "worker ids": 0.0, "agents": 0.0, "closing": 0.0}

    def install(self) -> None:
        from tpunb import slice as slice_module
        from tpunb.provision import ssh
        from tpunb.provision.gcp import compute

        super().install()

        def timed(phase: str, function):
            def wrapper(*a, **kw):
                started = time.perf_counter()
                try:
                    return function(*a, **kw)
                finally:
                    self.hosts[phase] += time.perf_counter() - started
            return wrapper

        ssh.connect_hosts = timed("ssh", ssh.connect_hosts)
        slice_module.Slice.connect = timed("agents", slice_module.Slice.connect)
        slice_module.Slice.close = timed("closing", slice_module.Slice.close)
        slice_module.Slice._end_services = timed("closing", slice_module.Slice._end_services)
        if hasattr(compute, "worker_order"):
            compute.worker_order = timed("worker ids", compute.worker_order)


class Google:
    """What Google's own clients see in the sandbox: anything left of a slice, by kind."""

    def __init__(self, url: str) -> None:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import compute_v1, tpu_v2

        kw = {"credentials": AnonymousCredentials(), "client_options": ClientOptions(api_endpoint=url)}
        self.instances = compute_v1.InstancesClient(**kw)
        self.migs = compute_v1.InstanceGroupManagersClient(**kw)
        self.templates = compute_v1.InstanceTemplatesClient(**kw)
        self.policies = compute_v1.ResourcePoliciesClient(**kw)
        self.tpu = tpu_v2.TpuClient(transport="rest", **kw)

    def left(self, name: str) -> list[str]:
        def mine(items) -> list[str]:
            return [n for n in items if n == name or n.startswith(f"{name}-")]

        req = {"project": PROJECT}
        found = mine(i.name for _, s in self.instances.aggregated_list(request=req) for i in s.instances)
        found += mine(m.name for _, s in self.migs.aggregated_list(request=req) for m in s.instance_group_managers)
        found += mine(t.name for _, s in self.templates.aggregated_list(request=req) for t in s.instance_templates)
        found += mine(p.name for _, s in self.policies.aggregated_list(request=req) for p in s.resource_policies)
        nodes = self.tpu.list_nodes(parent=f"projects/{PROJECT}/locations/-")
        return found + mine(n.name.rsplit("/", 1)[-1] for n in nodes)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def launch_rows(meter: Meter, google: Google, rounds: int) -> tuple[list[str], list[str]]:
    from tpunb import manager

    launches, downs = {label: [] for label, *_ in LAUNCHES}, {label: [] for label, *_ in LAUNCHES}
    sink = io.StringIO()
    for run in range(rounds + 1):  # round 0: each path's first launch (imports, clients, a fresh host image)
        for label, accel, which, zone in LAUNCHES:
            name = f"b{run}-{accel.replace('-', '')}-{which or 'default'}"
            meter.reset()
            options = {"zone": zone, "no_setup": True, **({"api": which} if which else {})}
            with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
                started = time.perf_counter()
                manager.launch(accel, name=name, **options)
                wall = time.perf_counter() - started
            launches[label].append((wall, meter.http, meter.requests, meter.waits, dict(meter.hosts)))
            meter.reset()
            with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
                started = time.perf_counter()
                manager.down(name)
                down = time.perf_counter() - started
                left = google.left(name)
                gone = time.perf_counter() - started
            assert not left, f"{name}: {left} left after %tpu_down"
            downs[label].append((down, gone, meter.http, meter.requests, meter.waits, meter.hosts["closing"]))
    out = ["| launch | rounds | wall | API (HTTP) | requests | poll waits | beyond the API's delay | SSH | worker ids "
           "| agents | **tpunb's own** (median / worst) | first launch, own |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, rows in launches.items():
        first, rest = rows[0], rows[1:]
        own = [w - h - p - sum(hosts.values()) for w, h, _, p, hosts in rest]
        med = lambda i: statistics.median(r[i] for r in rest)  # noqa: E731
        host = lambda k: statistics.median(r[4][k] for r in rest)  # noqa: E731
        first_own = first[0] - first[1] - first[3] - sum(first[4].values())
        out.append(f"| {label} | {len(rest)} | {ms(med(0))} | {ms(med(1))} | {med(2):.0f} | {ms(med(3))} | "
                   f"{ms(med(1) + med(3) - CREATE)} | {ms(host('ssh'))} | {ms(host('worker ids'))} | "
                   f"{ms(host('agents'))} | **{ms(statistics.median(own))}** / {ms(max(own))} | {ms(first_own)} |")
    down = ["| %tpu_down of | rounds | down returns | Google's clients list nothing | hosts' agents ended | "
            "the cloud's part | its requests | API's delete delay |", "|---|---|---|---|---|---|---|---|"]
    for label, rows in downs.items():
        rest = rows[1:]
        med = lambda i: statistics.median(r[i] for r in rest)  # noqa: E731
        cloud = statistics.median(d - c for d, _, _, _, _, c in rest)
        down.append(f"| {label} | {len(rest)} | {ms(med(0))} | {ms(med(1))} | {ms(med(5))} | {ms(cloud)} | "
                    f"{med(3):.0f} | {ms(DELETE)} |")
    return out, down


def survey_rows(meter: Meter, views: int) -> list[str]:
    """The survey parts alone, and whole status views with no slice and with three of each API."""
    from tpunb import manager
    from tpunb.provision.gcp.compute import found
    from tpunb.provision.gcp.tpu import adoption as adopt

    def timed(fn, n: int = views) -> tuple[float, float, float]:
        fn()  # once before: clients made
        times, requests = [], []
        for _ in range(n):
            meter.reset()
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
            requests.append(meter.requests)
        return statistics.median(times), max(times), statistics.median(requests)

    def row(label: str, figures: tuple[float, float, float]) -> str:
        return f"| {label} | {views} | {ms(figures[0])} | {ms(figures[1])} | {figures[2]:.0f} |"

    out = ["| survey | views | median ms | worst ms | requests |", "|---|---|---|---|---|"]
    sink = io.StringIO()
    with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
        out.append(row("Compute Engine: 4 aggregatedList at once (`found.everything`)", timed(lambda: found.everything(PROJECT))))
        out.append(row("Cloud TPU API: `locations/-` (`adopt.everywhere`)", timed(lambda: list(adopt.everywhere(PROJECT)))))
        out.append(row("`%tpu_status`, no slice", timed(manager.status)))
        names = []
        for i, (accel, which, zone) in enumerate([("v5p-8", "tpu", "us-east5-a"), ("v5p-8", "compute", "us-east5-a"),
                                                  ("v6e-8", "compute", "us-east5-b"), ("v5p-8", "tpu", "us-central1-a"),
                                                  ("v5p-8", "compute", "us-central1-a"), ("v6e-8", "tpu", "us-east5-b")]):
            names.append(f"s{i}-{which}")
            manager.launch(accel, name=names[-1], zone=zone, api=which, no_setup=True)
        out.append(row("`%tpu_status`, 3 slices of each API (this kernel's)", timed(manager.status)))
        manager.detach_all()
        out.append(row("`%tpu_status`, the same 6 slices, not attached here", timed(manager.status)))
        for name in names:
            manager.down(name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--views", type=int, default=10)
    parser.add_argument("--tree", default=str(ROOT), help="the tpunb tree to measure (default: this one)")
    args = parser.parse_args()
    sys.path.insert(0, args.tree)
    os.environ["TPUNB_HOME"] = tempfile.mkdtemp(prefix="tpunb-bench-")
    from tpunb.sandbox.box import start_sandbox

    started = time.perf_counter()
    box = start_sandbox(hosts=6, create_seconds=CREATE)
    box.emulator.timings(delete_seconds=DELETE, queue_seconds=QUEUE)
    meter = Meter()
    meter.install()
    try:
        import tpunb

        launches, downs = launch_rows(meter, Google(box.compute_url), args.rounds)
        print("\n".join(launches) + "\n\n" + "\n".join(downs), flush=True)
        survey = survey_rows(meter, args.views)
    finally:
        box.stop()
    imports = []
    for module in ("google.cloud.tpu_v2", "google.cloud.compute_v1"):  # what a kernel's first launch imports
        code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
        imports.append(f"{module} {float(subprocess.check_output([sys.executable, '-c', code])) * 1000:.0f} ms")
    print(f"\nimporting, in a fresh process: {', '.join(imports)}")
    print(f"\ntree {args.tree} ({Path(tpunb.__file__).parent}), Python {sys.version.split()[0]}, {os.cpu_count()} cores, "
          f"sandbox: {CREATE} s to create, {DELETE} s to delete; {args.rounds} rounds after a first launch of each; "
          f"{time.perf_counter() - started:.0f} s in all\n")
    print("\n".join(survey))


if __name__ == "__main__":
    main()
