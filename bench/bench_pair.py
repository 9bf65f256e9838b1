"""Two trees of tpunb side by side, both alive at once: is a change a regression on the hot paths?

bench_trees.py runs whole benchmarks on each tree in turn; a benchmark's few samples per round
then meet whatever else the machine did in those seconds. Here each tree runs one long-lived
kernel process (a real IPython shell, its slice launched once), and the two take turns in short
batches (base first in even rounds, this tree first in odd ones), so load from elsewhere hits both
alike and every batch has a partner measured right beside it. A batch reports its median; the
table gives each tree's median of batch medians and the median of the paired ratios.

Operations (``--op``, repeatable):
- ``cell-local``: a trivial ``%%on_tpu pass`` on a local simulated slice of 4 hosts (v4-32);
- ``cell-ssh``: the same on 4 hosts reached over SSH (a real OpenSSH sshd on loopback addresses);
- ``cell-64``: the same on 64 local hosts (v4-512);
- ``push`` / ``pull``: a 64 MB numpy array to / from 4 local hosts;
- ``cell-bg``: ``%%on_tpu --bg pass`` on 4 local hosts, until its handle is done (``.wait()``);
- ``stacks-64`` / ``stacks-ssh``: ``Slice.stacks()`` of 64 local hosts / 4 SSH hosts, each read
  from outside its agent;
- ``restart-local``: ``%tpu_restart`` of a 4-host local slice (v4-16) after 3 s of quiet, so its
  standby agents are ready: bench_hangs' "first restart of a quiet slice".

    git worktree add /tmp/base a4e9954
    python bench/bench_pair.py --base /tmp/base --rounds 40 --op cell-local --op push
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
#: op -> (accelerator or "ssh", batch size, unit scale for the table)
OPS = {"cell-local": ("v4-32", 100), "cell-ssh": ("ssh", 100), "cell-64": ("v4-512", 20),
       "cell-bg": ("v4-32", 100), "push": ("v4-32", 3), "pull": ("v4-32", 3), "stacks-64": ("v4-512", 3),
       "stacks-ssh": ("ssh", 3), "restart-local": ("v4-16", 1)}

WORKER = r'''
import contextlib, io, os, statistics, sys, tempfile, time
from pathlib import Path
from IPython.testing.globalipapp import start_ipython
try:
    from tpunb import manager
except ImportError:  # trees before issue 38 call it slices
    from tpunb import slices as manager
import numpy as np

op, where = sys.argv[1], sys.argv[2]
shell = start_ipython()
shell.run_cell("%load_ext tpunb")
quiet = io.StringIO()
value = np.random.default_rng(0).integers(0, 255, 64 << 20, dtype=np.uint8)
with contextlib.redirect_stderr(quiet), contextlib.redirect_stdout(quiet):
    if where == "ssh":
        from tpunb.sandbox.hosts.sshd import Sshd, write_ed25519
        server = Sshd(hosts=4)
        os.makedirs(os.environ["TPUNB_HOME"], exist_ok=True)
        key = os.path.join(os.environ["TPUNB_HOME"], "pair_key")
        server.authorize(write_ed25519(Path(key)))
        sl = manager.connect([f"{a}:{server.port}" for a in server.addresses], key=key, python=server.python,
                             name="pair")
    else:
        sl = manager.launch(where, name="pair")
    run = {"push": lambda: sl.push({"a": value}), "pull": lambda: sl.pull("a"),
           "stacks-64": lambda: sl.stacks(), "stacks-ssh": lambda: sl.stacks(),
           "cell-bg": lambda: shell.run_cell_magic("on_tpu", "--bg", "pass").wait(),
           "restart-local": lambda: shell.run_line_magic("tpu_restart", "")}.get(
        op, lambda: shell.run_cell_magic("on_tpu", "", "pass"))
    if op == "pull":
        sl.push({"a": value})
    for _ in range(20 if op.startswith("cell") else 2):
        run()
print("ready", flush=True)
for line in sys.stdin:
    samples = []
    with contextlib.redirect_stderr(quiet), contextlib.redirect_stdout(quiet):
        for _ in range(int(line)):
            if op == "restart-local":  # the first restart of a quiet slice: its standbys are ready
                time.sleep(3)
            started = time.perf_counter()
            run()
            samples.append(time.perf_counter() - started)
    quiet.seek(0)
    quiet.truncate()
    print(statistics.median(samples), flush=True)
with contextlib.redirect_stderr(quiet), contextlib.redirect_stdout(quiet):
    manager.down("pair")
    if where == "ssh":
        server.close()
'''


def start(tree: Path, op: str, home: str) -> subprocess.Popen:
    where, _ = OPS[op]
    env = {**os.environ, "PYTHONPATH": str(tree), "TPUNB_HOME": home, "CLOUDSDK_CONFIG": f"{home}/gcloud"}
    process = subprocess.Popen([sys.executable, "-c", WORKER, op, where], cwd=tree, env=env, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    if process.stdout.readline().strip() != "ready":
        raise SystemExit(f"{tree}: the {op} worker did not start (exit {process.wait()})")
    return process


def pair(op: str, trees: dict[str, Path], rounds: int) -> dict[str, list[float]]:
    """Batch medians of ``op`` on each tree, the trees taking turns ``rounds`` times."""
    import tempfile

    _, batch = OPS[op]
    with tempfile.TemporaryDirectory(prefix="tpunb-pair-") as home:
        workers = {name: start(tree, op, f"{home}/{name}") for name, tree in trees.items()}
        medians: dict[str, list[float]] = {name: [] for name in trees}
        try:
            for r in range(rounds):
                for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                    workers[name].stdin.write(f"{batch}\n")
                    workers[name].stdin.flush()
                    medians[name].append(float(workers[name].stdout.readline()))
        finally:
            for worker in workers.values():
                worker.stdin.close()
                worker.wait(timeout=120)
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, type=Path, help="the tree to compare against (a worktree)")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--op", action="append", choices=sorted(OPS), help="default: every op")
    args = parser.parse_args()
    trees = {"base": args.base.resolve(), "this": HERE}
    print(f"\n{args.rounds} alternating rounds; base {trees['base']}, this tree {HERE}\n")
    print("| operation | base, median | this tree, median | ratio of medians | median paired ratio |")
    print("|---|---|---|---|---|")
    for op in args.op or list(OPS):
        medians = pair(op, trees, args.rounds)
        base, this = statistics.median(medians["base"]), statistics.median(medians["this"])
        paired = statistics.median(t / b for t, b in zip(medians["this"], medians["base"]))
        print(f"| {op} (batches of {OPS[op][1]}) | {base * 1e3:.2f} ms | {this * 1e3:.2f} ms | "
              f"{this / base:.3f} | {paired:.3f} |", flush=True)


if __name__ == "__main__":
    main()
