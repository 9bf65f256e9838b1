"""The old names keep working for one release: tpunb.emulator (also ``python -m``) and tpunb.serve
are the new modules under their old paths, with one DeprecationWarning; the new names warn not."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAIRS = [("tpunb.emulator.compute", "tpunb.sandbox.compute.compute"),
         ("tpunb.emulator.resources", "tpunb.sandbox.tpu.resources"),
         ("tpunb.emulator.metadata", "tpunb.sandbox.metadata.metadata_server"),
         ("tpunb.emulator.sshd", "tpunb.sandbox.hosts.sshd"),
         ("tpunb.serve.forward", "tpunb.forwards.port_forward"),
         ("tpunb.serve.bench", "tpunb.bench"),
         ("tpunb.serve.seen", "tpunb.services.seen")]


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("old, new", PAIRS)
def test_an_old_path_is_the_new_module_and_warns_once(old, new):
    code = ("import importlib, warnings\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('always')\n"
            f"    old = importlib.import_module({old!r})\n"
            f"    importlib.import_module({old!r})\n"
            f"new = importlib.import_module({new!r})\n"
            "print(old is new, new.__spec__.name, sum(w.category is DeprecationWarning for w in seen))")
    done = run("-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", new, "1"]


def test_the_new_names_import_without_a_deprecation():
    done = run("-W", "error::DeprecationWarning", "-c", "import tpunb.sandbox, tpunb.services, tpunb.forwards, tpunb.bench")
    assert done.returncode == 0, done.stderr


def test_an_import_of_the_old_path_warns_where_python_shows_it():
    done = run("-c", "import tpunb.emulator.compute")
    assert done.returncode == 0 and done.stderr.count("DeprecationWarning") == 1, done.stderr
    assert "tpunb.sandbox" in done.stderr


def test_patching_through_the_old_path_patches_the_module_that_runs():
    code = ("import warnings\nwarnings.simplefilter('ignore')\n"
            "import tpunb.sandbox.tpu.resources as resources\n"
            "import tpunb.emulator.resources as old\n"
            "old.EMPTY_TYPE = 'planted'\n"
            "print(resources.EMPTY_TYPE)")
    done = run("-c", code)
    assert done.returncode == 0 and done.stdout.strip() == "planted", done.stderr


def test_python_m_of_the_old_name_runs_the_sandbox():
    old, new = run("-m", "tpunb.emulator", "--help"), run("-m", "tpunb.sandbox", "--help")
    assert old.returncode == 0 and new.returncode == 0, old.stderr + new.stderr
    assert "DeprecationWarning" in old.stderr and "DeprecationWarning" not in new.stderr
    assert old.stdout.split("\n", 1)[1] == new.stdout.split("\n", 1)[1]  # the same options (usage's prog aside)
