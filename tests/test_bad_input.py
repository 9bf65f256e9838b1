"""Bad input and odd cells get a one-line error that says what to do, never a traceback from
tpunb's own code, and never break the slice (real IPython shell, real host processes)."""
from __future__ import annotations

import pytest
import logging
import subprocess
import sys

from tpunb.display import ANSI
from tpunb.errors import HostDiedError, ProvisionError, RemoteError, UsageError
from tpunb.registry import Registry, SliceRecord


def no_tpunb_frames(run) -> None:
    assert "tpunb/" not in run.shown and "Traceback (most recent call last)" not in run.shown, run.shown


@pytest.mark.parametrize("make_slice", ["local"], indirect=True)  # pickled in the kernel: one transport says it all
def test_pushing_an_unpicklable_value_names_the_variable(make_slice, cell):
    make_slice(2)
    run = cell("import threading\nlock, n = threading.Lock(), 3\n%tpu_push n lock")
    assert isinstance(run.error, UsageError)
    assert "cannot send lock to the hosts" in str(run.error) and "_thread.lock" in str(run.error)
    no_tpunb_frames(run)
    assert cell("%tpu_push n").error is None
    after = cell("%%on_tpu\nn + 1")
    assert after.error is None and "Out[0-1]: 4" in after.shown  # the slice is unharmed


@pytest.mark.fresh_slice
def test_a_bad_port_in_tpu_connect_is_a_usage_error(cell):
    for spec in ("host:abc", "host:0", "host:70000", "me@:22"):
        run = cell(f"%tpu_connect {spec}")
        assert isinstance(run.error, UsageError), (spec, run.shown)
        assert "[user@]host[:port]" in str(run.error)
        no_tpunb_frames(run)


@pytest.mark.fresh_slice
def test_a_repeated_env_flag_keeps_every_value(cell):
    run = cell("%tpu_launch v4-16 --name envs --env A=1 --env B=2 C=3")
    assert run.error is None, run.shown
    shown = cell("%%on_tpu --hosts 0\nimport os\nprint(os.environ['A'], os.environ['B'], os.environ['C'])")
    assert shown.error is None and "1 2 3" in shown.stdout
    cell("%tpu_down envs")


def test_a_failing_repr_fails_the_cell_with_the_users_frame(make_slice, cell):
    make_slice(2)
    run = cell("%%on_tpu\nclass R:\n    def __repr__(self):\n        raise ValueError('bad repr')\nR()")
    assert isinstance(run.error, RemoteError)
    text = ANSI.sub("", run.stdout)
    assert "ValueError: bad repr" in text and "__repr__" in text
    assert "IPython/core/formatters.py" not in text and "pretty.py" not in text  # IPython's frames dropped


def test_exit_on_a_host_ends_its_session_and_the_next_cell_starts_a_fresh_one(make_slice, cell):
    make_slice(2)
    cell("%%on_tpu\nkept = 1")
    run = cell("%%on_tpu --hosts 1\nexit()")
    assert run.error is None, run.shown
    assert "AttributeError" not in run.shown and "session ends after this cell" in run.stderr
    after = cell("%%on_tpu\n'kept' in globals()")
    assert after.error is None, after.shown
    assert "Out[0]: True" in after.shown and "Out[1]: False" in after.shown  # host 1 is fresh, host 0 kept
    assert "host 1 had died and was restarted: its state was lost" in after.shown


@pytest.mark.fresh_slice
def test_nan_and_infinite_timeouts_are_refused(make_slice, cell):
    make_slice(1)
    for value in ("nan", "inf", "-1", "0"):
        run = cell(f"%%on_tpu --timeout {value}\n1")
        assert isinstance(run.error, UsageError), (value, run.shown)
        assert "positive number of seconds" in str(run.error)


@pytest.mark.fresh_slice
def test_a_timeout_that_kills_a_host_says_the_timeout(make_slice, cell):
    make_slice(2)
    run = cell("%%on_tpu --timeout 1\nimport signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
               "time.sleep(60)")
    assert isinstance(run.error, HostDiedError)
    message = str(run.error)
    assert "passed its 1 s timeout" in message and "hosts 0-1 did not stop when interrupted and were killed" in message
    assert run.seconds < 30


@pytest.mark.fresh_slice
def test_syncing_a_missing_directory_fails_on_a_local_slice_too(cell, tmp_path):
    assert cell("%tpu_launch v4-8 --name lone").error is None
    run = cell(f"%tpu_sync {tmp_path / 'missing'}")
    assert isinstance(run.error, UsageError) and "no such directory" in str(run.error)
    cell("%tpu_down lone")


@pytest.mark.fresh_slice
def test_use_of_a_cloud_slice_whose_launch_was_cut_off(cell, isolated_home):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    reg = Registry(isolated_home / "registry.db")
    reg.save_slice(SliceRecord(name="cut", accelerator="v4-16", backend="gcp", state="creating",
                               owner_pid=int(ended.stdout), spec={"project": "p", "zone": "us-central2-b"}))
    run = cell("%tpu_use cut")
    assert isinstance(run.error, ProvisionError), run.shown
    assert "stopped before it was ready" in str(run.error) and "%tpu_down cut" in str(run.error)
    no_tpunb_frames(run)


def test_paramiko_unrequested_channel_noise_is_not_shown(caplog):
    import tpunb.transport.ssh_hosts  # noqa: F401 - installs the filter

    logger = logging.getLogger("paramiko.transport")
    logger.error("Success for unrequested channel! [??]")
    logger.error("a real paramiko error")
    assert [r.getMessage() for r in caplog.records] == ["a real paramiko error"]
