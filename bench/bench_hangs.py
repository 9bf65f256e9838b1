"""When a run hangs: %tpu_stacks, and %tpu_restart against %tpu_down + %tpu_launch, in one run.

Run: python bench/bench_hangs.py [--runs 20] [--restarts 5] [--jax-runs 3]

1. ``%tpu_stacks`` through the magic in a real IPython shell (every host's stacks read from its
   signal handler, grouped, printed): on 4 hosts over SSH (a real OpenSSH sshd on loopback
   addresses) and on a 64-host local slice (v4-512). Standby agents are off here (TPUNB_STANDBY=0),
   so nothing else runs while it is timed.
2. ``%tpu_restart`` of a local v4-16 and of 4 SSH hosts against ``%tpu_down`` + ``%tpu_launch v4-16``
   (``%tpu_connect`` of the same 4 hosts), same run:
   - first, as by default: a fresh slice runs a cell, then stays quiet while its user reads the
     output (untimed: the benchmark waits until the standby agents the quiet slice prepares have
     started), then its first restart is timed; then down, and again;
   - again: repeated restarts of one slice (each prepares the next one's standbys);
   - cold (``TPUNB_STANDBY=0``: no standby agent, every host starts Python and imports IPython).
3. The same, until JAX answers again: the restart (JAX starts again by itself in the background)
   then ``jax.device_count()`` in a cell, against down + launch then the same cell.
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
sys.path[:0] = [str(ROOT)]

from bench.bench_cells import time_cells  # noqa: E402


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def timed(run, count: int) -> list[float]:
    return time_cells(run, count, warmup=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20, help="%%tpu_stacks reads per slice")
    parser.add_argument("--restarts", type=int, default=5, help="restarts (and down + launch) per kind")
    parser.add_argument("--jax-runs", type=int, default=3, help="restarts (and down + launch) until JAX answers")
    args = parser.parse_args()
    os.environ.setdefault("TPUNB_HOME", tempfile.mkdtemp(prefix="tpunb-bench-"))

    from IPython.testing.globalipapp import start_ipython
    import tpunb
    from tpunb import manager
    from tpunb.sandbox.hosts.sshd import Sshd, write_ed25519

    shell = start_ipython()
    shell.run_cell("%load_ext tpunb")
    sink = io.StringIO()
    quiet = contextlib.ExitStack()
    quiet.enter_context(contextlib.redirect_stdout(sink))
    quiet.enter_context(contextlib.redirect_stderr(sink))
    magic = lambda line: shell.run_line_magic(*line.split(" ", 1)) if " " in line else shell.run_line_magic(line, "")  # noqa: E731
    cell = lambda code: shell.run_cell_magic("on_tpu", "", code)  # noqa: E731

    server = Sshd(hosts=4)
    key = os.path.join(os.environ["TPUNB_HOME"], "bench_key")
    server.authorize(write_ed25519(Path(key)))
    ssh_hosts = ",".join(f"{a}:{server.port}" for a in server.addresses)
    connect = f"tpu_connect {ssh_hosts} --key {key} --python {server.python} --name ssh4 --accelerator v4-32"

    with quiet:
        # 1. %tpu_stacks
        os.environ["TPUNB_STANDBY"] = "0"
        magic(connect)
        magic("tpu_stacks")  # warm: the SSH channels' first use
        stacks_ssh = timed(lambda: magic("tpu_stacks --slice ssh4"), args.runs)
        magic("tpu_down ssh4")
        started = time.perf_counter()
        magic("tpu_launch v4-512 --name wide")
        launch_64 = time.perf_counter() - started
        magic("tpu_stacks --slice wide")
        stacks_64 = timed(lambda: magic("tpu_stacks --slice wide"), args.runs)
        magic("tpu_down wide")

        # 2. restart vs down + launch (no JAX)
        def standbys_up(sl) -> None:
            """Untimed: a user reads the last output while the quiet slice prepares its standbys."""
            deadline = time.monotonic() + 60
            while not (len(sl.standbys.ready()) == sl.num_hosts and sl.standbys.wait_ready()):
                if time.monotonic() > deadline:
                    raise SystemExit(f"the standbys of {sl.name} did not start within 60 s")
                time.sleep(0.05)

        def timed_restart(name: str, into: list[float]) -> None:
            standbys_up(manager.current(name))
            started = time.perf_counter()
            magic(f"tpu_restart --slice {name}")
            into.append(time.perf_counter() - started)

        def restarts(make: str, name: str) -> tuple[list[float], list[float], list[float], list[float]]:
            os.environ["TPUNB_STANDBY"] = "eager"  # the default
            first: list[float] = []
            for _ in range(args.restarts):
                magic(make)
                cell("x = 1")
                timed_restart(name, first)
                magic(f"tpu_down {name}")
            magic(make)
            again: list[float] = []
            for _ in range(args.restarts):
                timed_restart(name, again)
            fresh = timed(lambda: (magic(f"tpu_down {name}"), magic(make)), args.restarts)
            magic(f"tpu_down {name}")
            os.environ["TPUNB_STANDBY"] = "0"
            magic(make)
            cell("x = 1")
            cold = timed(lambda: magic(f"tpu_restart --slice {name}"), args.restarts)
            magic(f"tpu_down {name}")
            return first, again, cold, fresh

        local = restarts("tpu_launch v4-16 --name pair", "pair")
        ssh = restarts(connect, "ssh4")

        # 3. until JAX answers again (local v4-16)
        os.environ["TPUNB_STANDBY"] = "eager"
        magic("tpu_launch v4-16 --name pair")
        cell("import jax\njax.device_count()")
        pair = manager.current("pair")
        jax_restart = []
        for _ in range(args.jax_runs):
            magic("tpu_restart --slice pair")
            cell("import jax\njax.device_count()")
            standbys_up(pair)
            started = time.perf_counter()
            magic("tpu_restart --slice pair")
            cell("import jax\njax.device_count()")
            jax_restart.append(time.perf_counter() - started)
        jax_fresh = timed(lambda: (magic("tpu_down pair"), magic("tpu_launch v4-16 --name pair"),
                                   cell("import jax\njax.device_count()")), args.jax_runs)
        magic("tpu_down pair")
    server.close()

    print(f"\nPython {sys.version.split()[0]}, {os.cpu_count()} cores, tpunb {tpunb.__version__}; "
          f"{args.runs} stacks reads, {args.restarts} restarts, {args.jax_runs} until JAX answers\n")
    print("| benchmark | tpunb median | peer median | ratio (peer / tpunb) | target |")
    print("|---|---|---|---|---|")
    print(f"| %tpu_stacks, 4 hosts over SSH | {median_ms(stacks_ssh):.0f} ms | - | - | - |")
    print(f"| %tpu_stacks, 64 local hosts (v4-512) | {median_ms(stacks_64):.0f} ms | - | - | - |")
    for label, (first, again, cold, fresh) in (("local v4-16", local), ("4 SSH hosts", ssh)):
        peer = "%tpu_down + %tpu_launch v4-16" if label == "local v4-16" else "%tpu_down + %tpu_connect"
        for kind, samples in (("first restart of a quiet slice (default)", first),
                              ("again (default)", again), ("cold, TPUNB_STANDBY=0", cold)):
            ratio = statistics.median(fresh) / statistics.median(samples)
            target = "<= 10 s, >= 3x" if label == "local v4-16" else ">= 3x"
            met = ratio >= 3 and (label != "local v4-16" or max(samples) <= 10)
            judged = f"{target}: {'met' if met else 'not met'}" if "default" in kind else "-"
            print(f"| %tpu_restart {label}, {kind} vs {peer} | {median_ms(samples):.0f} ms | "
                  f"{median_ms(fresh):.0f} ms | {ratio:.1f}x | {judged} |")
    ratio = statistics.median(jax_fresh) / statistics.median(jax_restart)
    print(f"| %tpu_restart local v4-16 until jax.device_count() answers vs down + launch + the same cell | "
          f"{median_ms(jax_restart):.0f} ms | {median_ms(jax_fresh):.0f} ms | {ratio:.1f}x | - |")
    print(f"\n(the 64-host slice's launch took {launch_64:.1f} s)")


if __name__ == "__main__":
    main()
