"""Push by relay (issue 22): the topology, where relay beats direct sends, and a delayed link.

    python bench/bench_relay.py [--hosts 16] [--mb 64] [--repeat 3] [--delay 0.05] [--mbit 0 1000 100] [--stripes 4,8,16] [--sections topology,threshold,relay,cells]

Hosts are real OpenSSH sshd hosts on loopback addresses (one sshd, up to 16 addresses), the
kernel is this process. Values are random bytes in a numpy array (incompressible).
1. topology: ``--mb`` MB to ``--hosts`` hosts, direct (the kernel sends it to every host) and by
   relay with trees of fanout 1 (a chain), 2, 4 and hosts-1 (one relay fanning out), and striped
   over one root per host (fanout 4), as across a slow link.
2. threshold: ``--threshold-mb`` to ``--threshold-hosts`` hosts, direct and by relay (fanout 4).
3. relay (``relay_section``): the same hosts behind bench/delay_proxy.py, which holds every chunk
   ``--delay`` s each way (on one shared link of ``--mbit`` Mbit/s, each value in turn) and counts
   its bytes (hosts still reach each other directly): ``--mb`` MB direct, by relay from one root
   and striped over each of ``--stripes`` roots, bytes over the delayed link, the trivial cell's p50.
4. cells (not in the default run): ``--cell-hosts`` SSH hosts, the kernel's CPU per host for a
   trivial cell and for sending it one small frame (what sending cells through the tree could save).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import numpy as np  # noqa: E402

from tpunb import manager  # noqa: E402
from tpunb.sandbox.hosts.sshd import Sshd, write_ed25519  # noqa: E402
from tpunb.engine import relay  # noqa: E402

STRIPES, FAST_LINK = relay.STRIPES, relay.FAST_LINK  # the shipped choices


def value(mb: float) -> np.ndarray:
    return np.frombuffer(os.urandom(int(mb * 1_000_000)), dtype=np.uint8)


def timed_push(sl, x, how: str, fanout: int | None = None, repeat: int = 1, hosts: list[int] | None = None,
               stripes: int | None = None) -> float:
    """Median seconds of ``repeat`` pushes, ``how`` in (direct, relay), by relay over at most
    ``stripes`` roots (the shipped STRIPES by default)."""
    os.environ["TPUNB_RELAY"] = "never" if how == "direct" else "always"
    relay.FANOUT = fanout or relay.FANOUT
    relay.STRIPES = stripes or STRIPES
    relay.FAST_LINK = 0.0 if stripes and stripes > 1 else FAST_LINK  # asked for stripes: even on loopback
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        sl.push({"x": x}, hosts)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def connect(specs: list[str], key: Path, python: str, name: str):
    with contextlib.redirect_stdout(io.StringIO()):
        return manager.connect(specs, key=str(key), python=python, name=name)


def topology(sl, hosts: int, mb: float, repeat: int) -> None:
    x = value(mb)
    print(f"\n### Topology: {mb:g} MB to {hosts} SSH hosts on loopback (median of {repeat}; direct once)\n")
    print("| route | s | value MB / s |")
    print("|---|---|---|")
    rows = [("direct (kernel to every host)", "direct", None, 1)]
    only_root = timed_push(sl, x, "direct", None, repeat, [0])
    print(f"| direct to host 0 only (what any relay costs the kernel) | {only_root:.2f} | {mb / only_root:.1f} |")
    rows += [(f"relay, fanout {k}" + (" (chain)" if k == 1 else " (one relay fans out)" if k == hosts - 1 else ""),
              "relay", k, repeat) for k in sorted({1, 2, 4, hosts - 1})]
    for label, how, k, n in rows:
        s = timed_push(sl, x, how, k, n)
        print(f"| {label} | {s:.2f} | {mb / s:.1f} |", flush=True)
    s = timed_push(sl, x, "relay", 4, repeat, stripes=hosts)
    print(f"| relay, fanout 4, {min(hosts, x.nbytes // relay.STRIPE_BYTES)} stripes (what a slow link picks) "
          f"| {s:.2f} | {mb / s:.1f} |", flush=True)


def threshold(sl, counts: list[int], sizes: list[float], repeat: int) -> None:
    print(f"\n### Direct or relay (fanout 4), by size and hosts (median of {repeat})\n")
    print("| MB | hosts | direct s | relay s |")
    print("|---|---|---|---|")
    for n in counts:
        for mb in sizes:
            x = value(mb)
            times = {how: timed_push(sl, x, how, 4, repeat, list(range(n))) for how in ("direct", "relay")}
            print(f"| {mb:g} | {n} | {times['direct']:.3f} | {times['relay']:.3f} |", flush=True)


def relay_section(server: Sshd, key: Path, hosts: int, mb: float, delay: float, repeat: int, mbit: float = 0.0,
                  stripes: tuple[int, ...] = (4, 8, 16)) -> None:
    """The delayed link: bytes across it and seconds, direct, by relay from one root and striped
    over ``stripes`` roots, and a trivial cell."""
    targets = [f"{a}:{server.port}" for a in server.addresses[:hosts]]
    proxy = subprocess.Popen([sys.executable, str(ROOT / "bench" / "delay_proxy.py"), "--delay", str(delay),
                              "--mbit", str(mbit), *targets],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ports = json.loads(proxy.stdout.readline())["ports"]

        def counted() -> int:
            proxy.stdin.write("\n")
            proxy.stdin.flush()
            return json.loads(proxy.stdout.readline())["up"]

        sl = connect([f"127.0.0.1:{p}" for p in ports], key, server.python, "delayed")
        x = value(mb)
        link = f", one shared {mbit:g} Mbit/s link each way" if mbit else ", no rate limit"
        print(f"\n### Across a delayed link: {delay * 1e3:.0f} ms each way{link}, {hosts} SSH hosts, {mb:g} MB\n")
        print("| what | s | MB over the delayed link (kernel to hosts) |")
        print("|---|---|---|")
        rows = [("push, direct", "direct", 1, 1), ("push, relay, one root (fanout 4)", "relay", repeat, 1)]
        counts = {min(k, hosts, x.nbytes // relay.STRIPE_BYTES): k for k in stripes}  # what each cap gives
        rows += [(f"push, relay, {n} stripes (fanout 4)", "relay", repeat, k) for n, k in counts.items() if n > 1]
        for label, how, n, k in rows:
            before = counted()
            s = timed_push(sl, x, how, 4, n, stripes=k)
            print(f"| {label} | {s:.2f} | {(counted() - before) / n / 1e6:.1f} |", flush=True)
        cells = []
        for _ in range(20):
            started = time.perf_counter()
            sl.session.execute("pass", list(range(hosts)))
            cells.append(time.perf_counter() - started)
        print(f"| trivial cell, p50 of 20 | {statistics.median(cells):.3f} | |")
        trip = sl.session.relay.round_trip or 1.0
        print(f"\nThe hosts answered relay_listen in {trip * 1e3:.0f} ms: the shipped rule cuts {mb:g} MB "
              f"into {relay.stripes(int(mb * 1e6), hosts, trip)} stripes.")
        manager.down("delayed")
    finally:
        proxy.kill()


def cells_section(work: Path, hosts: int, rounds: int = 100) -> None:
    """What a relay could save a trivial cell: the kernel's CPU per host per cell, against its CPU
    to send one small frame to a host (the half a cell sent once through the tree would save)."""
    from tpunb.engine.wire import Broadcast

    servers = [Sshd(hosts=min(16, hosts - i), directory=work / f"cells-{i}") for i in range(0, hosts, 16)]
    key = work / "cells_key"
    line = write_ed25519(key)
    try:
        for server in servers:
            server.authorize(line)
        sl = connect([f"{a}:{s.port}" for s in servers for a in s.addresses], key, servers[0].python, "cells")
        session, every = sl.session, list(range(hosts))
        for _ in range(10):
            session.execute("pass", every)
        cell_cpu, send_cpu, walls = [], [], []
        block = max(1, rounds // 5)
        for _ in range(5):
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(block):
                session.execute("pass", every)
            cell_cpu.append((time.process_time() - cpu) / block / hosts)
            walls.append((time.perf_counter() - wall) / block)
            cpu = time.process_time()
            for _ in range(block):
                frames = Broadcast({"op": "heartbeat", "seconds": 1.0})  # no reply
                for host in session.hosts:
                    host.send_frame(frames.for_host(host))
            send_cpu.append((time.process_time() - cpu) / block / hosts)
        print(f"\n### Trivial cell on {hosts} SSH hosts (medians of 5 blocks of {block})\n")
        print("| cell p50 wall | kernel CPU per host per cell | of which sending the frame |")
        print("|---|---|---|")
        print(f"| {statistics.median(walls) * 1e3:.1f} ms | {statistics.median(cell_cpu) * 1e6:.0f} us "
              f"| {statistics.median(send_cpu) * 1e6:.0f} us |")
        manager.down("cells")
    finally:
        for server in servers:
            server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--mb", type=float, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--sections", default="topology,threshold,relay")
    parser.add_argument("--mbit", type=float, nargs="+", default=[0.0, 1000.0, 100.0],
                        help="the delayed link's shared rate each way, one run per value (0: none)")
    parser.add_argument("--stripes", default="4,8,16", help="stripe counts the relay section compares")
    parser.add_argument("--cell-hosts", type=int, default=64)
    parser.add_argument("--threshold-hosts", default="2,4,16")
    parser.add_argument("--threshold-mb", default="0.064,0.25,1,4,16")
    args = parser.parse_args()
    os.environ.setdefault("TPUNB_HOME", tempfile.mkdtemp(prefix="tpunb-bench-relay-home-"))
    work = Path(tempfile.mkdtemp(prefix="tpunb-bench-relay-"))
    server = Sshd(hosts=args.hosts, directory=work / "sshd")
    key = work / "id_ed25519"
    server.authorize(write_ed25519(key))
    sections = args.sections.split(",")
    try:
        if "topology" in sections or "threshold" in sections:
            sl = connect([f"{a}:{server.port}" for a in server.addresses], key, server.python, "loopback")
            if "topology" in sections:
                topology(sl, args.hosts, args.mb, args.repeat)
            if "threshold" in sections:
                threshold(sl, [int(n) for n in args.threshold_hosts.split(",")],
                          [float(mb) for mb in args.threshold_mb.split(",")], args.repeat)
            manager.down("loopback")
        if "relay" in sections:
            for mbit in args.mbit:
                relay_section(server, key, args.hosts, args.mb, args.delay, args.repeat, mbit,
                              tuple(int(k) for k in args.stripes.split(",")))
        if "cells" in sections:
            cells_section(work, args.cell_hosts)
    finally:
        server.close()


if __name__ == "__main__":
    main()
