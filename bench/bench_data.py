"""Moving data (issue 22): tpunb's push and pull against their peers, side by side in one run.

Sections (``--section``, default all of them):
- ``local``: a local simulated slice of 4 hosts, a 64 MB numpy array pushed and pulled, against
  ipyparallel's DirectView and BroadcastView with 4 engines on this same machine.
- ``ssh``: 4 and 16 real sshd hosts on loopback (tpunb.sandbox.hosts.sshd), a 64 MB array pushed,
  against ``sync_tree`` (what %tpu_sync runs) of one 64 MB file to the same hosts over the same
  connections, each host into a directory of its own, in MB/s per host.
- ``relay``: 16 sshd hosts behind bench/delay_proxy.py (100 ms RTT; no rate limit, then a shared
  1 Gbit/s), a 64 MB array pushed directly, by relay from one root and striped over several
  (bench/bench_relay.py's relay section).

The two sides alternate within a run, so load from elsewhere on this machine hits both alike.
Prints one Markdown table per section, with ratios.

    python bench/bench_data.py [--section local|ssh|relay] [--mb 64] [--repeat 5] [--ssh-hosts 4,16]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]


def timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def alternate(sides: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """Each side's seconds, the sides taking turns ``repeat`` times (after one warm-up round)."""
    for run in sides.values():
        run()
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeat):
        for name, run in sides.items():
            seconds[name].append(timed(run))
    return seconds


def table(title: str, rows: list[tuple[str, str, str, str]]) -> None:
    print(f"\n{title}\n")
    print("| what | tpunb | peer, same run | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def section_local(args: argparse.Namespace) -> None:
    """4 local hosts: push and pull of one array, against ipyparallel's views."""
    import ipyparallel
    import numpy as np

    from tpunb import manager

    value = np.random.default_rng(0).integers(0, 255, args.mb << 20, dtype=np.uint8)
    sl = manager.launch("v4-32", name="bench-data")
    cluster = ipyparallel.Cluster(n=4, log_level=40)
    client = cluster.start_and_connect_sync()
    try:
        client.wait_for_engines(4, timeout=120)
        direct, broadcast = client[:], client.broadcast_view()
        seconds = alternate({
            "tpunb push": lambda: sl.push({"a": value}),
            "DirectView push": lambda: direct.push({"a": value}, block=True),
            "BroadcastView push": lambda: broadcast.push({"a": value}, block=True),
            "tpunb pull": lambda: sl.pull("a"),
            "DirectView pull": lambda: direct.pull("a", block=True),
        }, args.repeat)
    finally:
        client.close()
        cluster.stop_cluster_sync()
        sl.session.close()
    med = {name: statistics.median(s) for name, s in seconds.items()}
    best_push = min(med["DirectView push"], med["BroadcastView push"])
    table(f"Local simulated slice, 4 hosts, {args.mb} MB numpy array (median of {args.repeat}, seconds)", [
        (f"push {args.mb} MB", f"{med['tpunb push']:.3f} s",
         f"DirectView {med['DirectView push']:.3f} s, BroadcastView {med['BroadcastView push']:.3f} s",
         f"{best_push / med['tpunb push']:.1f}x faster than the best view"),
        (f"pull {args.mb} MB", f"{med['tpunb pull']:.3f} s", f"DirectView {med['DirectView pull']:.3f} s",
         f"{med['DirectView pull'] / med['tpunb pull']:.1f}x faster"),
    ])


def section_ssh(args: argparse.Namespace) -> None:
    """4 and 16 sshd hosts: push against Slice.sync of a file of the same size."""
    import numpy as np

    from tpunb import manager
    from tpunb.sandbox.hosts.sshd import Sshd, write_ed25519
    from tpunb.transport.sync import sync_tree

    counts = [int(n) for n in args.ssh_hosts.split(",")]
    work = Path(tempfile.mkdtemp(prefix="tpunb-bench-data-"))
    sshd = Sshd(hosts=max(counts), directory=work / "sshd")
    key = work / "id_ed25519"
    sshd.authorize(write_ed25519(key))
    source = work / "file"
    source.mkdir()
    (source / "data.bin").write_bytes(os.urandom(args.mb << 20))
    value = np.random.default_rng(0).integers(0, 255, args.mb << 20, dtype=np.uint8)
    rows = []

    def copies(run: int, count: int) -> list[str]:
        """A new directory per run and host: every host writes the whole file, as on its own disk
        (these hosts share this machine's; one shared path would let them skip each other's copy)."""
        return [f"{work}/synced-{run}/{host}" for host in range(count)]

    try:
        for count in counts:
            addresses = [f"{a}:{sshd.port}" for a in sshd.addresses[:count]]
            sl = manager.connect(addresses, key=str(key), python=sshd.python, name=f"bench-data-{count}")
            synced = iter(range(10_000))
            try:
                seconds = alternate({
                    "push": lambda: sl.push({"a": value}),
                    "sync": lambda: sync_tree(sl.session.transports, source, copies(next(synced), count)),
                }, args.repeat)
            finally:
                sl.session.close()
            push, sync = (args.mb / statistics.median(seconds[k]) for k in ("push", "sync"))
            rows.append((f"push {args.mb} MB to {count} SSH hosts", f"{push:.1f} MB/s per host",
                         f"%tpu_sync of a {args.mb} MB file: {sync:.1f} MB/s per host", f"{push / sync:.2f}x"))
    finally:
        sshd.close()
        shutil.rmtree(work, ignore_errors=True)  # a copy of the file per run and host: gigabytes
    table(f"SSH hosts on loopback (real sshd, median of {args.repeat}; MB/s per host = {args.mb} MB / seconds)", rows)


def section_relay(args: argparse.Namespace) -> None:
    """16 sshd hosts behind a 100 ms RTT proxy (no rate limit, then 1 Gbit/s): push direct, by
    relay from one root and striped (bench/bench_relay.py's relay section)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_relay import relay_section

    from tpunb.sandbox.hosts.sshd import Sshd, write_ed25519

    work = Path(tempfile.mkdtemp(prefix="tpunb-bench-data-relay-"))
    sshd = Sshd(hosts=16, directory=work / "sshd")
    key = work / "id_ed25519"
    sshd.authorize(write_ed25519(key))
    try:
        for mbit in (0.0, 1000.0):
            relay_section(sshd, key, 16, args.mb, 0.05, args.repeat, mbit)
    finally:
        sshd.close()
        shutil.rmtree(work, ignore_errors=True)


SECTIONS = {"local": section_local, "ssh": section_ssh, "relay": section_relay}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=sorted(SECTIONS), action="append",
                        help="run only this section (repeatable; default: all)")
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ssh-hosts", default="4,16")
    args = parser.parse_args()
    os.environ.setdefault("TPUNB_HOME", tempfile.mkdtemp(prefix="tpunb-bench-home-"))
    for name in args.section or list(SECTIONS):
        SECTIONS[name](args)


if __name__ == "__main__":
    main()
