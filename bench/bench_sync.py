"""tpunb's sync_tree vs `rsync -a` over ssh: 1,000 files (100 MB) to 4 hosts, same run.

Both push the same tree to the same 4 sshd hosts (tests/sshd.py) in parallel, into empty
directories; then one file changes and both sync again. Prints a markdown table.

    python bench/bench_sync.py [--hosts 4] [--files 1000] [--mb 100] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from tests.sshd import Sshd
from tpunb.transport.keys import default_key
from tpunb.transport.sync import sync_tree
from tpunb.transport.ssh_hosts import connect_all


def make_tree(root: Path, files: int, total_mb: int) -> None:
    size = total_mb * 1_000_000 // files
    for i in range(files):
        d = root / f"pkg{i % 25}" / f"sub{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"file{i}.bin").write_bytes(os.urandom(size))


def rsync_all(sshd: Sshd, key: Path, src: Path, dest: str) -> float:
    ssh = (f"ssh -i {key} -p {sshd.port} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
           "-o LogLevel=ERROR -o ControlMaster=no")
    started = time.perf_counter()
    procs = [subprocess.Popen(["rsync", "-a", "-e", ssh, f"{src}/", f"{addr}:{dest}/{addr}/"])
             for addr in sshd.addresses]
    if any(p.wait() for p in procs):
        raise SystemExit("rsync failed")
    return time.perf_counter() - started


def tpunb_all(transports, src: Path, dest: str) -> float:
    started = time.perf_counter()
    sync_tree(transports, src, [f"{dest}/{t.host}" for t in transports])
    return time.perf_counter() - started


def print_table(title: str, repeat: int, peer: str, rows: dict[str, tuple[list[float], list[float]]]) -> None:
    """Markdown: one row per step with the peer's and tpunb's median seconds, and peer / tpunb."""
    print(f"\n{title} (median of {repeat}; each host a distinct sshd address on this machine)\n")
    print(f"| step | {peer} (s) | tpunb (s) | ratio ({peer} / tpunb) |")
    print("|---|---|---|---|")
    for name, (theirs, ours) in rows.items():
        p, t = statistics.median(theirs), statistics.median(ours)
        print(f"| {name} | {p:.3f} | {t:.3f} | {p / t:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tpunb-bench-sync-"))
    os.environ["TPUNB_HOME"] = str(work / "home")
    sshd = Sshd(hosts=args.hosts, directory=work / "sshd")
    try:
        key, line = default_key()
        sshd.authorize(line)
        src = work / "src"
        make_tree(src, args.files, args.mb)
        transports = connect_all([f"{a}:{sshd.port}" for a in sshd.addresses], python=sshd.python)
        rows = {"full sync": ([], []), "re-sync, one file changed": ([], [])}
        for i in range(args.repeat):
            # each host is a separate tpunb/rsync destination dir, emptied before each full run
            for tool in ("rsync", "tpunb"):
                dest = work / f"dest-{tool}"
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir()
            subprocess.run(["sync"], check=True)
            rows["full sync"][0].append(rsync_all(sshd, key, src, str(work / "dest-rsync")))
            rows["full sync"][1].append(tpunb_all(transports, src, str(work / "dest-tpunb")))
            changed = src / "pkg0" / "sub0" / "file0.bin"
            changed.write_bytes(os.urandom(changed.stat().st_size))
            rows["re-sync, one file changed"][0].append(rsync_all(sshd, key, src, str(work / "dest-rsync")))
            rows["re-sync, one file changed"][1].append(tpunb_all(transports, src, str(work / "dest-tpunb")))
        for t in transports:
            t.close()
        total = sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
        print_table(f"{args.files} files, {total / 1e6:.0f} MB, to {args.hosts} hosts", args.repeat,
                    "rsync -a over ssh", rows)
    finally:
        sshd.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
