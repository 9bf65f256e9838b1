"""Connecting to 4 SSH hosts far from the notebook: `%tpu_connect` until every agent is ready, at
0 and 100 ms round trip (bench/delay_proxy.py between the kernel and each host's sshd).

Two ways, alternating, same run: the hosts' own Python as it is (``--python``), and ``--setup``
on hosts whose environment tpunb already made (a reconnect: the check only). How many round trips
the connect path waits for one after the other is counted at a 1 s round trip (``--count-delay``),
where this machine's CPU time is small beside them: (time at 1 s RTT - time at 0) / 1 s.
Prints a markdown table.

    python bench/bench_connect.py [--repeat 5] [--delay 0.05] [--count-delay 0.5]
"""
from __future__ import annotations

import argparse
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

from tests.sshd import Sshd, _write_ed25519  # noqa: E402

from tpunb import manager  # noqa: E402


def proxy_ports(server: Sshd, delay: float) -> tuple[subprocess.Popen | None, list[str]]:
    """Host specs reaching the sshd's hosts through a delay proxy (none for delay 0)."""
    targets = [f"{a}:{server.port}" for a in server.addresses]
    if not delay:
        return None, targets
    proxy = subprocess.Popen([sys.executable, str(ROOT / "bench" / "delay_proxy.py"), "--delay", str(delay), *targets],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ports = json.loads(proxy.stdout.readline())["ports"]
    return proxy, [f"127.0.0.1:{p}" for p in ports]


def connect_seconds(specs: list[str], key: Path, setup: bool, python: str) -> float:
    started = time.perf_counter()
    sl = manager.connect(specs, key=str(key), name="bench", **({"setup": True} if setup else {"python": python}))
    elapsed = time.perf_counter() - started
    sl.delete()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--delay", type=float, default=0.05, help="seconds each way")
    parser.add_argument("--count-delay", type=float, default=0.5, help="seconds each way for counting round trips")
    parser.add_argument("--python-only", action="store_true", help="only the hosts' own Python (a tpunb without --setup)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tpunb-bench-connect-"))
    os.environ["TPUNB_HOME"] = str(work / "home")
    server = Sshd(hosts=4, directory=work / "sshd")
    key = work / "id_ed25519"
    server.authorize(_write_ed25519(key))
    try:
        direct = [f"{a}:{server.port}" for a in server.addresses]
        rows: dict[str, dict[float, list[float]]] = {"hosts' own Python (--python)": {}}
        if not args.python_only:
            connect_seconds(direct, key, True, server.python)  # the hosts' environments, made once (not timed)
            rows["--setup, environment made"] = {}
        for delay in (0.0, args.delay, args.count_delay):
            proxy, specs = proxy_ports(server, delay)
            try:
                for _ in range(args.repeat if delay != args.count_delay else 2):
                    for label, setup in zip(rows, (False, True)):
                        rows[label].setdefault(delay, []).append(connect_seconds(specs, key, setup, server.python))
            finally:
                if proxy is not None:
                    proxy.kill()
        rtt = 2 * args.delay
        print(f"\n### Connect 4 SSH hosts until every agent is ready (median of {args.repeat}, s)\n")
        counting = 2 * args.count_delay
        print(f"| way | no delay | {rtt * 1e3:.0f} ms RTT | {counting:g} s RTT (min of 2) | round trips waited in turn |")
        print("|---|---|---|---|---|")
        for label, times in rows.items():
            fast, slow = statistics.median(times[0.0]), statistics.median(times[args.delay])
            count = min(times[args.count_delay])
            print(f"| {label} | {fast:.2f} | {slow:.2f} | {count:.2f} | {(count - min(times[0.0])) / counting:.1f} |",
                  flush=True)
    finally:
        manager.detach_all()
        server.close()


if __name__ == "__main__":
    main()
