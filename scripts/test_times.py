"""The end of ./scripts/test: the 25 slowest tests of the run, and each phase's time against its
budget (tests/budget.json): a phase more than 20% over its budget fails the run, so the suite's
time is kept, not just shown. A budget changes with the change that earns it, said in its commit.

    python3 scripts/test_times.py TIMES BUDGET phase=seconds ...
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

SLOWEST = 25
OVER = 1.2  # a phase may take its budget plus 20%


def main(argv: list[str]) -> int:
    times, budget_file, *phases = argv
    rows = []
    if Path(times).exists():
        for line in Path(times).read_text().splitlines():
            phase, seconds, test = line.split("\t", 2)
            rows.append((float(seconds), phase, test))
    rows.sort(reverse=True)
    print(f"\n{SLOWEST} slowest tests of the run (set-up, call and tear-down):")
    for seconds, phase, test in rows[:SLOWEST]:
        print(f"  {seconds:7.1f} s  {phase:<9} {test}")
    budget = json.loads(Path(budget_file).read_text())["seconds"]
    print(f"\nphase times (budget + 20% fails; {budget_file}):")
    over = []
    for item in phases:
        name, seconds = item.split("=")
        took, allowed = int(seconds), budget.get(name)
        mark = ""
        if allowed is not None:
            mark = f"budget {allowed} s ({took / allowed:.0%})"
            if took > allowed * OVER:
                over.append(name)
                mark += "  OVER"
        print(f"  {name:<10} {took // 60:3d} min {took % 60:02d} s   {mark}")
    print(parts(rows))
    if over:
        print(f"FAILED: {', '.join(over)} took more than {OVER:.0%} of {'its' if len(over) == 1 else 'their'} budget: "
              f"find what grew (the slowest tests above), or raise the budget in {budget_file} with the change that earns it")
        return 1
    return 0


def parts(rows: list[tuple[float, str, str]]) -> str:
    """Where each phase's time went, from its tests' own times: the profiles' parts, and the main
    run's groups (pytest-xdist's, named after the ``@``): the notebooks and the JAX and browser tests
    each keep one worker, the rest share both."""
    spent: dict[str, float] = {}
    for seconds, phase, test in rows:
        part = phase
        if phase == "main":
            group = test.rsplit("@", 1)[-1] if "@" in test else "light"
            part = {"notebooks": "main: notebooks", "heavy": "main: JAX and browser"}.get(group, "main: the rest")
        spent[part] = spent.get(part, 0.0) + seconds
    return "  tests' own time by part: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in spent.items())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
