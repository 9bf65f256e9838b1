"""Fan-out at pod scale (issue 15): the trivial cell on 64, 128 and 256 local hosts, the kernel's
memory per attached host, ipyparallel side by side, and connecting 64 SSH hosts; one run.

    python bench/bench_podscale.py [--runs 200] [--sizes 64,128,256] [--engines 64] [--ssh-hosts 64]

1. Local simulated slices of 64, 128 and 256 hosts (v4-512, v4-1024, v4-2048), all up at once,
   whose hosts run cells with plain ``exec`` (no IPython: 256 IPython hosts need about 10 GB here,
   plain ones 4.5 GB) and never import JAX. ``%%on_tpu --slice S pass`` in a real IPython shell,
   the slices taking turns in blocks of 10 cells so load on this shared machine hits each alike.
   The kernel's RSS and thread count are read before and after each launch.
2. ipyparallel on ``--engines`` local engines, in the same shell after the slices are down:
   ``%%px --block pass`` and an empty ``view.apply_sync``, alternating in blocks of 10.
3. OpenSSH sshd on ``--ssh-hosts`` loopback addresses (one sshd per 16, its limit of listening
   sockets): ``connect_all`` from an empty registry (TCP, key exchange, host keys recorded,
   auth), then the whole ``%tpu_connect`` (connections and agents started, IPython on each), then
   the trivial cell on those hosts.
Also measured: the kernel's CPU time per cell (every thread) and the host processes' CPU time per
cell, so what grows with the slice can be told apart from this 2-core machine's load.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

BLOCK = 10


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3


def rss_mb() -> float:
    gc.collect()
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def os_threads() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


#: the kernel's CPU time (every thread) spent in each contender's cells, seconds
CPU: dict[str, float] = {}


def timed(run, n: int, name: str | None = None) -> list[float]:
    samples = []
    cpu = time.process_time()
    for _ in range(n):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    if name is not None:
        CPU[name] = CPU.get(name, 0.0) + time.process_time() - cpu
    return samples


#: CPU seconds the host processes (agents and watchdogs) of each contender spent in its cells
HOST_CPU: dict[str, float] = {}


def processes_cpu(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def interleave(contenders: dict[str, callable], runs: int, warmup: int = 10,
               hosts: dict[str, list[int]] | None = None) -> dict[str, list[float]]:
    """Each contender ``runs`` times, in blocks of BLOCK, taking turns; the first ``warmup`` dropped.
    ``hosts``: the pids whose CPU time counts towards each contender's cells."""
    for run in contenders.values():
        timed(run, warmup)
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(0, runs, BLOCK):
        for name, run in contenders.items():
            pids = (hosts or {}).get(name, [])
            before = processes_cpu(pids)
            samples[name] += timed(run, BLOCK, name)
            HOST_CPU[name] = HOST_CPU.get(name, 0.0) + processes_cpu(pids) - before
    return samples


def plain_hosts() -> None:
    """Local hosts run cells with plain exec: the agent's ``ipython: False`` setting."""
    from tpunb.provision import local

    attach = local.attach

    def attach_plain(record, reg, env):
        sl = attach(record, reg, env)
        host_init = sl._host_init
        sl._host_init = lambda index, port: {**host_init(index, port), "ipython": False}
        return sl

    local.attach = attach_plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--sizes", default="64,128,256")
    parser.add_argument("--engines", type=int, default=64, help="ipyparallel engines (0: skip)")
    parser.add_argument("--ssh-hosts", type=int, default=64, help="0: skip")
    parser.add_argument("--connect-repeat", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("TPUNB_HOME", tempfile.mkdtemp(prefix="tpunb-bench-pod-"))
    sizes = [int(s) for s in args.sizes.split(",") if s]

    from IPython.testing.globalipapp import start_ipython
    import tpunb
    from tpunb import manager

    shell = start_ipython()
    shell.run_cell("%load_ext tpunb")
    sink = io.StringIO()
    plain_hosts()
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, tpunb {tpunb.__version__}; load {load()}",
          flush=True)

    # 1. local slices, all up at once, taking turns
    launched: dict[int, dict] = {}
    for n in sizes:
        before, threads = rss_mb(), os_threads()
        started = time.perf_counter()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            manager.launch(f"v4-{8 * n}", name=f"pod{n}")  # v4: 8 TensorCores a host
        launched[n] = {"launch_s": time.perf_counter() - started, "rss_mb": rss_mb() - before,
                       "threads": os_threads() - threads}
        print(f"launched {n} hosts in {launched[n]['launch_s']:.1f} s; load {load()}", flush=True)
    cell_load = load()
    pids = {n: [p for h in manager.current(f"pod{n}").session.hosts
                for p in (h.info["pid"], h.info.get("watchdog")) if p] for n in sizes}
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        cells = interleave({n: (lambda n=n: shell.run_cell_magic("on_tpu", f"--slice pod{n}", "pass"))
                            for n in sizes}, args.runs, hosts=pids)
    cell_load += " -> " + load()
    for n in sizes:
        manager.down(f"pod{n}")
    print(f"\n### Trivial cell on local hosts ({args.runs} cells each, taking turns; load {cell_load})\n")
    print("| hosts | p50 | p99 | per host (p50 / hosts) | kernel CPU per cell | per host | hosts' CPU per cell | "
          "per host | launch | kernel RSS per host | kernel threads per host |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        p50, p99 = percentiles(cells[n])
        row = launched[n]
        cpu = CPU[n] / len(cells[n]) * 1e3
        host_cpu = HOST_CPU[n] / len(cells[n]) * 1e3
        print(f"| {n} | {p50:.2f} ms | {p99:.2f} ms | {p50 / n * 1e3:.0f} us | {cpu:.2f} ms | {cpu / n * 1e3:.0f} us | "
              f"{host_cpu:.1f} ms | {host_cpu / n * 1e3:.0f} us | "
              f"{row['launch_s']:.1f} s | {row['rss_mb'] / n * 1024:.0f} kB | {row['threads'] / n:.2f} |", flush=True)

    # 2. ipyparallel on as many engines as asked, same shell
    ipp_rows = {}
    if args.engines:
        import ipyparallel as ipp

        started = time.perf_counter()
        # patient heartbeats: on 2 busy cores the controller otherwise purges engines still registering
        cluster = ipp.Cluster(n=args.engines, log_level=40, controller_args=[
            "--HeartMonitor.period=10000", "--HeartMonitor.max_heartmonitor_misses=100",
            "--IPController.registration_timeout=600"])
        cluster.start_cluster_sync()  # engines start slowly here (64 imports of ipykernel on 2 cores)
        client = cluster.connect_client_sync()
        client.wait_for_engines(args.engines, timeout=900)
        ipp_launch = time.perf_counter() - started
        client.activate()
        view = client[:]
        ipp_load = load()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            ipp_rows = interleave({"px": lambda: shell.run_cell_magic("px", "--block", "pass"),
                                   "apply": lambda: view.apply_sync(lambda: None)}, max(50, args.runs // 2))
        ipp_load += " -> " + load()
        client.close()
        cluster.stop_cluster_sync()
        if ipp_rows:
            print(f"\n### ipyparallel, {args.engines} engines (launch {ipp_launch:.1f} s; load {ipp_load})\n")
            print("| call | p50 | p99 |")
            print("|---|---|---|")
            for name, label in (("px", "%%px --block pass"), ("apply", "view.apply_sync(lambda: None)")):
                p50, p99 = percentiles(ipp_rows[name])
                print(f"| {label} | {p50:.2f} ms | {p99:.2f} ms |")
            if args.engines in cells:
                tp50 = percentiles(cells[args.engines])[0]
                print(f"\nratio ipyparallel %%px p50 / tpunb p50 at {args.engines}: "
                      f"{percentiles(ipp_rows['px'])[0] / tp50:.1f}x")

    # 3. SSH: connecting N hosts of one sshd on loopback addresses
    ssh = {}
    if args.ssh_hosts:
        from tpunb.sandbox.hosts.sshd import Sshd, write_ed25519
        from tpunb.transport.ssh_hosts import connect_all

        work = Path(tempfile.mkdtemp(prefix="tpunb-bench-pod-ssh-"))
        # OpenSSH listens on at most 16 sockets (MAX_LISTEN_SOCKS): one sshd per 16 addresses
        servers = [Sshd(hosts=min(16, args.ssh_hosts - i), directory=work / f"sshd-{i}")
                   for i in range(0, args.ssh_hosts, 16)]
        key = work / "id_ed25519"
        public = write_ed25519(key)
        for server in servers:
            server.authorize(public)
        specs = [f"{a}:{server.port}" for server in servers for a in server.addresses]
        home = os.environ["TPUNB_HOME"]
        ssh_load = load()
        connects, whole = [], []
        rss_before = rss_mb()
        for i in range(args.connect_repeat):
            os.environ["TPUNB_HOME"] = str(work / f"home-{i}")  # an empty registry: host keys recorded anew
            started, cpu = time.perf_counter(), time.process_time()
            transports = connect_all(specs, key_path=key)
            connects.append(time.perf_counter() - started)
            CPU["connect"] = CPU.get("connect", 0.0) + time.process_time() - cpu
            for t in transports:
                t.close()
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                started = time.perf_counter()
                manager.connect(specs, key=str(key), python=servers[0].python, name=f"ssh{i}")
                whole.append(time.perf_counter() - started)
                if i < args.connect_repeat - 1:
                    manager.down(f"ssh{i}")
        last = f"ssh{args.connect_repeat - 1}"
        ssh_rss = rss_mb() - rss_before
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            ssh_cells = interleave({"ssh": lambda: shell.run_cell_magic("on_tpu", f"--slice {last}", "pass")},
                                   max(50, args.runs // 2))["ssh"]
            manager.down(last)
        ssh_load += " -> " + load()
        os.environ["TPUNB_HOME"] = home
        for server in servers:
            server.close()
        shutil.rmtree(work, ignore_errors=True)
        ssh = {"connect": statistics.median(connects), "connect_max": max(connects),
               "connect_cpu": CPU["connect"] / len(connects) / args.ssh_hosts, "rss": ssh_rss / args.ssh_hosts,
               "cell_cpu": CPU["ssh"] / len(ssh_cells) / args.ssh_hosts,
               "whole": statistics.median(whole), "whole_max": max(whole), "cells": percentiles(ssh_cells)}

    if ssh:
        print(f"\n### SSH, {args.ssh_hosts} hosts on {-(-args.ssh_hosts // 16)} sshd of up to 16 loopback addresses "
              f"each ({args.connect_repeat} times; load {ssh_load})\n")
        print(f"| connect_all (median / max) | {ssh['connect']:.2f} s / {ssh['connect_max']:.2f} s |")
        print(f"| manager.connect, agents up (median / max) | {ssh['whole']:.2f} s / {ssh['whole_max']:.2f} s |")
        print(f"| trivial cell p50 / p99 | {ssh['cells'][0]:.2f} ms / {ssh['cells'][1]:.2f} ms |")
        print(f"| kernel CPU per host: connect_all / trivial cell | {ssh['connect_cpu'] * 1e3:.2f} ms / "
              f"{ssh['cell_cpu'] * 1e6:.0f} us |")
        print(f"| kernel RSS per attached SSH host | {ssh['rss'] * 1024:.0f} kB |")


if __name__ == "__main__":
    main()
