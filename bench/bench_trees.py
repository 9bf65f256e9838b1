"""The same benchmarks on two trees of tpunb, alternating, in one run: is a change a regression?

Each round runs every benchmark once on each tree, in alternating order (base first in odd rounds,
this tree first in even ones), so load from elsewhere on the machine hits both alike. A
benchmark runs as its own process with ``PYTHONPATH`` set to the tree, a fresh ``TPUNB_HOME`` and
that tree's copy of the script (a script only this tree has, such as ``bench_small_push.py``,
runs from here against both: it imports tpunb from ``PYTHONPATH``). Every number in every
Markdown table row the benchmarks print is collected, and one table shows each row's median on
both trees, their ratio (this tree / base: below 1 is faster for times, slower for rates) and
each side's spread (the rounds' lowest and highest).

    git worktree add /tmp/base e88b512
    python bench/bench_trees.py --base /tmp/base --rounds 3 \\
        --bench "bench_cells.py --runs 300" --bench "bench_data.py --section local --repeat 5" \\
        --bench "bench_podscale.py --runs 100 --sizes 64,256 --engines 0 --ssh-hosts 64 --connect-repeat 1" \\
        --bench "bench_small_push.py --pushes 3000"
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
DEFAULT_BENCHES = ["bench_small_push.py --pushes 1000", "bench_cells.py --runs 100"]


def run(tree: Path, command: str, timeout: float) -> str:
    """One benchmark on one tree: its stdout (a failure is said, and yields no rows)."""
    script, *args = shlex.split(command)
    own = tree / "bench" / script
    path = own if own.exists() else HERE / "bench" / script
    with tempfile.TemporaryDirectory(prefix="tpunb-bench-home-") as home:
        env = {**os.environ, "PYTHONPATH": str(tree), "TPUNB_HOME": home, "CLOUDSDK_CONFIG": f"{home}/gcloud"}
        started = time.perf_counter()
        done = subprocess.run([sys.executable, str(path), *args], cwd=tree, env=env, capture_output=True,
                              text=True, timeout=timeout)
    print(f"  {tree.name or tree}: {script} {' '.join(args)}: {time.perf_counter() - started:.0f} s, "
          f"exit {done.returncode}", file=sys.stderr, flush=True)
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
    return done.stdout


def rows(output: str) -> dict[tuple[str, str, str], float]:
    """{(table heading, row label, column): number} of every Markdown table row (a table's header
    is the row above its |---| line; the number is the first one in a cell)."""
    found: dict[tuple[str, str, str], float] = {}
    heading, header, previous = "", [], []
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if line.startswith("#"):
            heading = line.lstrip("# ").strip()
        elif cells and set(line) <= set("|-: "):
            header = previous
        elif cells and header and len(cells) == len(header):
            for column, cell in zip(header[1:], cells[1:]):
                number = NUMBER.search(cell)
                if number:
                    found[(heading, cells[0], column)] = float(number.group().replace(",", ""))
        elif not cells:
            header = []
        previous = cells
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, type=Path, help="the tree to compare against (a git worktree)")
    parser.add_argument("--tree", type=Path, default=HERE, help="the tree under test (default: this one)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bench", action="append", help="a script in bench/ and its arguments (repeatable)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one benchmark run may take")
    args = parser.parse_args()
    trees = {"base": args.base.resolve(), "this": args.tree.resolve()}
    seen: dict[str, dict[tuple, list[float]]] = {"base": {}, "this": {}}
    for number in range(args.rounds):
        order = ["base", "this"] if number % 2 == 0 else ["this", "base"]
        print(f"round {number + 1} of {args.rounds}", file=sys.stderr, flush=True)
        for command in args.bench or DEFAULT_BENCHES:
            for side in order:
                for key, value in rows(run(trees[side], command, args.timeout)).items():
                    seen[side].setdefault((command.split()[0], *key), []).append(value)
    print(f"\n### {trees['this']} against {trees['base']}: medians of {args.rounds} alternating rounds\n")
    print("| benchmark | table | row | column | base | this tree | this / base | base's spread | this tree's spread |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(set(seen["base"]) & set(seen["this"])):
        base, this = statistics.median(seen["base"][key]), statistics.median(seen["this"][key])
        ratio = f"{this / base:.2f}" if base else "-"
        print(f"| {' | '.join(key)} | {base:g} | {this:g} | {ratio} | {_spread(seen['base'][key])} | "
              f"{_spread(seen['this'][key])} |")


def _spread(values: list[float]) -> str:
    """The rounds' lowest and highest, so a ratio can be read against the noise."""
    return f"{min(values):g}-{max(values):g}"


if __name__ == "__main__":
    main()
