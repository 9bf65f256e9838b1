"""The fault suite's fast cases (bench/faults.py), one test each: every fault is survived, with
nothing leaked. Each case runs in its own process under a hard bound, so a hang fails, not stalls."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.faults import CASES, Harness, Outcome, account, run_case

pytestmark = pytest.mark.fault

FAST = [(c, where) for c in CASES if c.fast for where in c.where]


@pytest.mark.parametrize("chosen, where", FAST, ids=[f"{c.run.__name__}-{w}" for c, w in FAST])
def test_fault_is_survived(chosen, where, sshd, ssh_key):
    info = {"addresses": sshd.addresses, "port": sshd.port, "key": str(ssh_key), "emulator": sshd.emulator_options()}
    outcome = run_case(chosen, where, info)
    assert outcome.survived, outcome
    assert outcome.leaked == 0, outcome


def test_a_failed_pid_record_fails_the_case(tmp_path):
    """With no slice to read pids from, the record fails: the case cannot claim that none leaked."""
    harness = Harness("local", tmp_path, {})
    harness.record()
    assert len(harness.record_failures) == 1 and "NoSliceError" in harness.record_failures[0]
    assert not (tmp_path / "sessions.json").exists()
    outcome = account(Outcome("f", "local", True, leaked=0), harness)
    assert not outcome.survived and outcome.note.startswith("agent pids not recorded (NoSliceError")


LAUNCH_WATCHING_IMPORTS = """
import json, os, sys, threading
from pathlib import Path
where, info, home = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
os.environ.update(TPUNB_HOME=str(home), CLOUDSDK_CONFIG=str(home / "gcloud"))
for key in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "TPUNB_TPU_API_ENDPOINT", "TPUNB_COMPUTE_API_ENDPOINT"):
    os.environ.pop(key, None)
from bench.faults import Harness
h = Harness(where, home, info)  # %load_ext tpunb: the warm-up thread starts now
if where == "cloud":
    h.start_emulator()
    os.environ["TPUNB_COMPUTE_API_ENDPOINT"] = os.environ["TPUNB_TPU_API_ENDPOINT"]  # its Compute Engine API too
first, watching = [], [True]
def watch(event, args):
    if (watching[0] and event == "import" and threading.current_thread() is threading.main_thread()
            and args[0] not in sys.modules):
        first.append(args[0])
sys.addaudithook(watch)
h.launch()
watching[0] = False
h.down()
if where == "cloud":  # then a v5p-16, through Compute Engine: google-cloud-compute is imported too
    watching[0] = True
    error, shown, _ = h.cell(f"%tpu_launch v5p-16 --zone us-east5-a --name {h.name} --no-setup")
    assert error is None, shown
    watching[0] = False
seen = list(first)
h.down()
print("FIRST IMPORTS " + json.dumps(seen), flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("where", ["local", "ssh", "cloud"])
def test_a_launch_imports_nothing_on_the_main_thread(where, sshd, ssh_key, tmp_path):
    """Ctrl-C lands on the main thread, and an import it cuts leaves broken modules behind (or the
    import lock held, so the next import on any other thread waits for ever): a launch's first
    imports are done on the warm-up thread that %load_ext starts, the launch only waits for it. In
    the cloud, a launch through the Cloud TPU API, then one through Compute Engine."""
    info = {"addresses": sshd.addresses, "port": sshd.port, "key": str(ssh_key), "emulator": sshd.emulator_options()}
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-c", LAUNCH_WATCHING_IMPORTS, where, json.dumps(info), str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)})
    line = next((l for l in run.stdout.splitlines() if l.startswith("FIRST IMPORTS ")), None)
    assert line is not None, run.stdout[-2000:] + run.stderr[-2000:]
    assert json.loads(line[len("FIRST IMPORTS "):]) == []
