"""Starting agents on SSH hosts: forked by each host's fork server (tpunb.transport.ssh_forks)
against fresh agents (``TPUNB_FORK_SERVER=0``, as before it), in one run, taking turns.

Run: python bench/bench_ssh_start.py [--repeat 5] [--hosts 4]

Hosts are a real OpenSSH sshd on loopback addresses (tests/sshd.py), the hosts' Python this
machine's (``--python``, a host tpunb does not prepare). For each way, after one untimed round
(the first also starts the hosts' fork servers):
- connect: ``manager.connect`` of N hosts until every agent is ready and a trivial cell ran;
- restart: ``%tpu_restart`` of that slice (every agent ended and started again), then a cell.
The slice is deleted after each round, untimed. CPU is the machine's busy time (/proc/stat):
the agents are not this process's children.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.bench_local_start import busy_seconds  # noqa: E402
from tests.sshd import Sshd, _write_ed25519  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--hosts", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("TPUNB_HOME", tempfile.mkdtemp(prefix="tpunb-bench-"))
    os.environ["TPUNB_STANDBY"] = "0"  # nothing starts behind a slice while the next is timed
    import time

    from tpunb import manager

    folder = Path(tempfile.mkdtemp(prefix="tpunb-bench-sshd-"))
    server = Sshd(hosts=args.hosts, directory=folder / "sshd")
    key = folder / "key"
    server.authorize(_write_ed25519(key))
    hosts = [f"{a}:{server.port}" for a in server.addresses]
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}

    def once(way: str, keep: bool) -> None:
        os.environ["TPUNB_FORK_SERVER"] = "1" if way == "fork server" else "0"
        cpu, wall = busy_seconds(), time.perf_counter()
        sl = manager.connect(hosts, key=str(key), python=server.python, name="bench", env={"JAX_PLATFORMS": "cpu"})
        assert sl.run("pass", output=None).ok
        connect = (time.perf_counter() - wall, busy_seconds() - cpu)
        cpu, wall = busy_seconds(), time.perf_counter()
        sl.restart()
        assert sl.run("pass", output=None).ok
        restart = (time.perf_counter() - wall, busy_seconds() - cpu)
        sl.delete()
        if keep:
            times.setdefault((way, "connect"), []).append(connect)
            times.setdefault((way, "restart"), []).append(restart)

    ways = ("fork server", "fresh agents")
    try:
        for way in ways:
            once(way, keep=False)
        for _ in range(args.repeat):
            for way in ways:
                once(way, keep=True)
    finally:
        server.close()
    print(f"{args.hosts} SSH hosts, median of {args.repeat}, wall (machine CPU):\n")
    print("| what | fork server | fresh agents | fresh / fork |")
    print("|---|---|---|---|")
    for what in ("connect", "restart"):
        fork, fresh = ([statistics.median(x) for x in zip(*times[(w, what)])] for w in ways)
        print(f"| {what} | {fork[0] * 1000:.0f} ms ({fork[1]:.2f} s) | {fresh[0] * 1000:.0f} ms ({fresh[1]:.2f} s) "
              f"| {fresh[0] / fork[0]:.1f}x |")


if __name__ == "__main__":
    main()
