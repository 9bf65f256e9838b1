"""The suite's hang watchdog (pyproject.toml: pytest's faulthandler_timeout, exiting): a test whose main thread never handles pytest-timeout's
signal ends the run with every thread's stack, instead of silence until CI's 90 minutes run out."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: the main thread asleep in C while another thread takes pytest-timeout's SIGALRM: its C handler
#: sets Python's flag, and nothing wakes the main thread to run the Python handler for 60 s
STUCK = '''
import signal, threading

def test_stuck_where_no_signal_wakes_it():
    threading.Thread(target=threading.Event().wait, args=(90,), daemon=True).start()  # takes the signal
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    held = threading.Lock()
    held.acquire()
    held.acquire(timeout=60)
'''


def test_a_test_stuck_past_its_timeout_ends_the_run_with_every_threads_stack(tmp_path):
    (tmp_path / "test_stuck.py").write_text(STUCK)
    started = time.monotonic()
    # the suite's own ini, with its timeouts shortened: 1 s for pytest-timeout, 2 s past it for the watchdog
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
                          "-o", "timeout=1", "-o", "faulthandler_timeout=3", "-o", "addopts=", "--rootdir", str(tmp_path),
                          str(tmp_path / "test_stuck.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert run.returncode == 1, run.stdout + run.stderr
    assert took < 40, f"the stuck test ran its full 60 s ({took:.0f} s): the watchdog did not end it"
    assert "Timeout (0:00:03)!" in run.stderr
    assert "test_stuck_where_no_signal_wakes_it" in run.stderr  # the stuck thread's stack says where
