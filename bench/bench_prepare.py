"""Preparing 4 fresh TPU VM hosts (tpunb.sandbox.hosts.image: a bare Python 3.10 each, its own home)
for their first cell, side by side with pip in the same run:

- cold: empty uv and pip caches, 4 hosts at once (`%tpu_connect --setup`, what a cloud launch does),
  against ONE `pip install` of the same packages into one fresh venv on this machine, with pip's
  cache off: the hosts should install in parallel at no more than 1.5x that one install;
- fresh hosts, warm caches (a new VM with a fast path to the index, the sandbox's everyday case):
  what preparation adds to a connect (and so to a launch), against a connect with no setup;
- warm: the environment is already there (a reconnect): the check only, at most 2 s for 4 hosts.

Prints markdown tables.

    python bench/bench_prepare.py [--repeat 1] [--skip-cold]
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

from tests.sshd import Sshd, _write_ed25519  # noqa: E402

from tpunb import manager  # noqa: E402
from tpunb.sandbox.hosts.image import Image, kernel_prefix  # noqa: E402
from tpunb.provision import hostenv  # noqa: E402


def fresh_hosts(work: Path, cache: Path, name: str) -> tuple[Sshd, Path]:
    image = Image(work / f"{name}-image", [kernel_prefix()], cache)
    server = Sshd(hosts=4, directory=work / f"{name}-sshd", image=image)
    key = work / f"{name}-key"
    server.authorize(_write_ed25519(key))
    return server, key


def connect(server: Sshd, key: Path, **how) -> tuple[float, list]:
    started = time.perf_counter()
    sl = manager.connect([f"{a}:{server.port}" for a in server.addresses], key=str(key), name="bench", **how)
    elapsed = time.perf_counter() - started
    steps = [h.info.get("env", {}).get("seconds") for h in sl.session.hosts]
    sl.delete()
    return elapsed, steps


def pip_once(work: Path) -> float:
    """One `pip install` of what tpunb installs on a host, into a fresh venv here, no pip cache."""
    venv = work / "pip-venv"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([str(kernel_prefix() / "bin" / "python3"), "-m", "venv", str(venv)], check=True)
    version, _ = hostenv.kernel_jax()
    packages = [f"jax=={version}" if version else "jax", "requests", *hostenv.HOST_PACKAGES[1:]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # PyPI, as the hosts' uv sees it (this machine's pip.conf adds local folders)
    started = time.perf_counter()
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-cache-dir",
                    "--disable-pip-version-check", "--only-binary", ":all:", *packages], check=True, env=env)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--skip-cold", action="store_true", help="no cold rows (they download about 1 GB)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tpunb-bench-prepare-"))
    os.environ["TPUNB_HOME"] = str(work / "home")
    rows = []
    try:
        if not args.skip_cold:
            cold, pip = [], []
            for i in range(args.repeat):
                pip.append(pip_once(work))
                server, key = fresh_hosts(work, work / f"cold-cache-{i}", f"cold{i}")
                seconds, steps = connect(server, key, setup=True)
                cold.append(seconds)
                print(f"cold run {i}: 4 hosts {seconds:.1f} s (steps {steps}), one pip install {pip[-1]:.1f} s",
                      flush=True)
                server.close()
                shutil.rmtree(work / f"cold-cache-{i}", ignore_errors=True)
            rows.append(("cold: 4 fresh hosts, empty caches (uv, in parallel) / one `pip install` on one host, "
                         "no cache", statistics.median(cold), statistics.median(pip)))
        cache = work / "warm-cache"
        warmed, key = fresh_hosts(work, cache, "warmup")
        connect(warmed, key, setup=True)  # fills the shared cache
        warmed.close()
        fresh, bare = [], []
        for i in range(args.repeat):
            server, key = fresh_hosts(work, cache, f"fresh{i}")
            bare.append(connect(server, key)[0])  # the image's own python3 runs the agent: no setup
            fresh.append(connect(server, key, setup=True)[0])
            checks = [connect(server, key, setup=True)[0] for _ in range(3)]
            plain = [connect(server, key, python=str(server.home(server.addresses[0]) / ".tpunb/env/bin/python"))[0]
                     for _ in range(3)]
            server.close()
        rows.append(("fresh hosts, warm caches: connect + setup / connect, no setup (what a launch adds)",
                     statistics.median(fresh), statistics.median(bare)))
        rows.append(("warm: connect + setup, environment there (the check) / connect on that environment's "
                     "Python, no setup", statistics.median(checks), statistics.median(plain)))
        print(f"\n### Preparing 4 TPU VM hosts (median of {args.repeat}; warm rows of 3)\n")
        print("| what | tpunb s | peer s | ratio | added s |")
        print("|---|---|---|---|---|")
        for label, ours, peer in rows:
            print(f"| {label} | {ours:.2f} | {peer:.2f} | {ours / peer:.2f}x | {ours - peer:+.2f} |", flush=True)
    finally:
        manager.detach_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
