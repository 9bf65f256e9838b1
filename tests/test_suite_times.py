"""scripts/test_times.py, the end of every ./scripts/test: the slowest tests, each phase against its
budget (more than 20% over fails the run), and where the main run's time went."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "test_times.py"


def _run(tmp_path, times: str, *phases: str) -> subprocess.CompletedProcess:
    (tmp_path / "times").write_text(times)
    (tmp_path / "budget.json").write_text(json.dumps({"seconds": {"fast": 100, "main": 200}}))
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "times"), str(tmp_path / "budget.json"),
                           *phases], capture_output=True, text=True)


TIMES = ("fast\t1.5\ttests/test_a.py::test_one\n"
         "main\t30.0\tnotebooks/01.ipynb::Cell 3@notebooks\n"
         "main\t12.0\ttests/test_b.py::test_jax@heavy\n"
         "main\t2.0\ttests/test_c.py::test_light@light:test_c.py\n"
         "colab\t4.0\ttests/test_a.py::test_one\n")


def test_phases_within_their_budget_pass_and_the_main_runs_groups_are_told_apart(tmp_path):
    done = _run(tmp_path, TIMES, "fast=110", "main=240")
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert lines[2].split() == ["30.0", "s", "main", "notebooks/01.ipynb::Cell", "3@notebooks"]  # slowest first
    assert "fast         1 min 50 s   budget 100 s (110%)" in done.stdout
    assert ("tests' own time by part: main: notebooks 30 s, main: JAX and browser 12 s, colab 4 s, "
            "main: the rest 2 s, fast 2 s") in done.stdout


def test_a_phase_more_than_20_percent_over_fails_the_run_naming_it(tmp_path):
    done = _run(tmp_path, TIMES, "fast=121", "main=240")
    assert done.returncode == 1
    assert "fast         2 min 01 s   budget 100 s (121%)  OVER" in done.stdout
    assert "FAILED: fast took more than 120% of its budget" in done.stdout
