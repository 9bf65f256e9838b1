"""%%on_tpu through a real IPython shell against real host processes.

The ``make_slice`` fixture is parametrized by transport, so the same execution tests run on
every way tpunb reaches hosts.
"""
from __future__ import annotations

import pytest
import os
import signal
import time


import tpunb
from tpunb import manager
from tpunb.display import ANSI
from tpunb.errors import CellInterrupted, HostDiedError, RemoteError
from tests.conftest import interrupt_kernel_when, wait_for_files

def test_state_persists_across_cells(make_slice, cell):
    make_slice(2)
    first = cell("%%on_tpu\nimport os\nx = int(os.environ['TPUNB_HOST_INDEX']) * 10\nprint('set', x)")
    assert first.error is None
    assert "[0] set 0" in first.stdout and "[1] set 10" in first.stdout
    second = cell("%%on_tpu\nx + 1")
    assert second.error is None
    assert "Out[0]: 1" in second.shown and "Out[1]: 11" in second.shown


def test_identical_output_and_values_are_grouped(patient_grouping, make_slice, cell):
    make_slice(4)
    run = cell("%%on_tpu\nfor i in range(3):\n    print('step', i)\n21 * 2")
    assert run.error is None
    assert run.stdout.splitlines() == ["[0-3] step 0", "[0-3] step 1", "[0-3] step 2"]
    assert "Out[0-3]: 42" in run.shown


def test_error_on_one_host_fails_the_cell_with_that_hosts_traceback(make_slice, cell):
    make_slice(2)
    run = cell("%%on_tpu\nimport os\nh = int(os.environ['TPUNB_HOST_INDEX'])\n"
               "def boom(h):\n    return 1 / (h - 1)\nboom(h)")
    assert isinstance(run.error, RemoteError)
    assert "[host 1]" in run.stdout
    assert "ZeroDivisionError" in run.stdout and "boom" in run.stdout  # the host's own frames
    assert "Out[0]: -1.0" in run.shown  # the host that succeeded still shows its value
    assert run.error.results[0].ok and run.error.results[1].status == "error"
    assert "tpunb/" not in run.stdout  # no frames of ours


def test_same_error_on_all_hosts_is_shown_once(make_slice, cell):
    make_slice(4)
    run = cell("%%on_tpu\nraise ValueError('bad config')")
    assert isinstance(run.error, RemoteError)
    text = ANSI.sub("", run.stdout)
    assert text.count("[hosts 0-3]") == 1 and text.count("[host") == 1
    assert text.count("ValueError: bad config") == 1  # one traceback for four hosts


def test_same_error_is_shown_once_after_a_cell_on_a_subset_of_hosts(make_slice, cell):
    make_slice(2)
    cell("%%on_tpu --hosts 1\npass")  # host 1 has run one cell more than host 0
    run = cell("%%on_tpu\nraise ValueError('bad config')")
    text = ANSI.sub("", run.stdout)
    assert text.count("[hosts 0-1]") == 1 and text.count("ValueError: bad config") == 1


@pytest.mark.fresh_slice
def test_host_tracebacks_use_the_kernels_colour_scheme(make_slice, cell, ip):
    make_slice(1)
    scheme = ip.colors
    try:
        ip.colors = "NoColor"
        plain = cell("%%on_tpu\nraise ValueError('x')").error.groups[0][1]
        assert not any(ANSI.search(line) for line in plain)
        cell("%tpu_down")
        make_slice(1)
        ip.colors = "Linux"
        coloured = cell("%%on_tpu\nraise ValueError('x')").error.groups[0][1]
        assert any(ANSI.search(line) for line in coloured)
    finally:
        ip.colors = scheme


def test_interrupt_during_sleep_stops_every_host_and_keeps_state(make_slice, cell, flags):
    make_slice(4)
    cell("%%on_tpu\nkept = 'still here'")
    sent = interrupt_kernel_when(lambda: len(list(flags.iterdir())) == 4)
    run = cell(f"%%on_tpu\nimport os, time\nopen('{flags}/' + os.environ['TPUNB_HOST_INDEX'], 'w').close()\n"
               "time.sleep(60)\nkept = 'overwritten'")
    stopped = time.perf_counter()
    assert isinstance(run.error, CellInterrupted)
    assert "interrupted on hosts 0-3" in str(run.error)
    # the interrupt ended the 60 s sleep (slack for a loaded machine); escalation (interrupt_grace) did
    # not: every host says interrupted, none killed
    assert stopped - sent["at"] < 15
    assert [r.status for r in run.error.results.values()] == ["interrupted"] * 4
    after = cell("%%on_tpu\nkept")
    assert "Out[0-3]: 'still here'" in after.shown


def test_timeout_interrupts_all_hosts(make_slice, cell):
    make_slice(2)
    run = cell("%%on_tpu --timeout 0.5\nimport time\nstate = 1\ntime.sleep(60)")
    assert isinstance(run.error, CellInterrupted)
    assert "timed out after 0.5 s" in str(run.error)
    assert run.seconds < 5
    assert "Out[0-1]: 1" in cell("%%on_tpu\nstate").shown


@pytest.mark.fresh_slice
def test_killed_host_fails_cell_fast_and_restarts_with_lost_state(make_slice, cell, flags):
    sl = make_slice(2)
    cell("%%on_tpu\nkept = 'state'")
    victim = sl.session.hosts[1].info["pid"]

    def kill_when_ready():
        wait_for_files(flags, ["0", "1"])
        os.kill(victim, signal.SIGKILL)
        return time.perf_counter()

    import threading
    killed = {}
    threading.Thread(target=lambda: killed.setdefault("at", kill_when_ready()), daemon=True).start()
    run = cell(f"%%on_tpu\nimport os, time\nopen('{flags}/' + os.environ['TPUNB_HOST_INDEX'], 'w').close()\ntime.sleep(60)")
    assert isinstance(run.error, HostDiedError)
    assert time.perf_counter() - killed["at"] < 10  # its stream's end, not the 60 s sleep or a heartbeat limit
    assert "host 1 died" in str(run.error) and "SIGKILL" in str(run.error)
    assert run.error.results[0].status == "interrupted"  # the other host was interrupted, not killed
    after = cell("%%on_tpu\n'kept' in globals()")
    assert "host 1 had died and was restarted: its state was lost" in after.stderr
    assert "Out[0]: True" in after.shown and "Out[1]: False" in after.shown
    assert sl.session.hosts[1].info["pid"] != victim


@pytest.mark.fresh_slice
def test_host_ignoring_interrupt_is_escalated_and_reported(make_slice, cell, flags):
    sl = make_slice(2)
    sl.session.interrupt_grace = 2.0  # room for host 0's interrupt round trip on a loaded machine
    cell("%%on_tpu\nkept = 1")
    interrupt_kernel_when(lambda: len(list(flags.iterdir())) == 2)
    run = cell(f"%%on_tpu\nimport os, signal, time\nh = os.environ['TPUNB_HOST_INDEX']\n"
               "if h == '1':\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
               f"open('{flags}/' + h, 'w').close()\ntime.sleep(60)")
    assert isinstance(run.error, CellInterrupted)
    assert "host 1 did not stop when interrupted and was killed" in str(run.error)
    assert run.error.results[0].status == "interrupted" and run.error.results[1].status == "killed"
    after = cell("%%on_tpu\n'kept' in globals()")
    assert "Out[0]: True" in after.shown and "Out[1]: False" in after.shown


def test_hosts_subsets(make_slice, cell):
    make_slice(4)
    assert "Out[0,2]: 'ran'" in cell("%%on_tpu --hosts 0,2\nran = 'ran'\nran").shown
    assert "Out[1-2]: 'x'" in cell("%%on_tpu --hosts 1:3\n'x'").shown
    assert "Out[0]: 'y'" in cell("%%on_tpu --hosts 0\n'y'").shown
    shown = cell("%%on_tpu\n'ran' in globals()").shown
    assert "Out[0,2]: True" in shown and "Out[1,3]: False" in shown


def test_output_modes(make_slice, cell):
    make_slice(2)
    code = "import os\nprint('host', os.environ['TPUNB_HOST_INDEX'])\nprint('same')"
    assert cell("%%on_tpu --output all\n" + code).stdout.count("same") == 2
    first = cell("%%on_tpu --output first\n" + code).stdout
    assert "[0] host 0" in first and "host 1" not in first


@pytest.mark.fresh_slice
def test_long_output_is_capped_and_logged(patient_grouping, make_slice, cell, isolated_home):
    sl = make_slice(2)
    run = cell("%%on_tpu\nimport os\nfor i in range(5000):\n    print(os.environ['TPUNB_HOST_INDEX'], i)")
    assert run.error is None
    assert "output capped at 2,000 lines" in run.stdout
    assert len(run.stdout.splitlines()) == 2002  # 2,000 lines, the cap and how much was left out
    assert "8,000 lines not shown here (host 0: 4,000" in run.stdout.splitlines()[-1]
    log = (isolated_home / "logs" / sl.name / "host-1.log").read_text()
    assert "1 4999" in log
    assert tpunb.last_result()[1].stdout.count("\n") == 5000


def test_rich_display_from_host_zero(make_slice, cell):
    make_slice(2)
    run = cell("%%on_tpu\nfrom IPython.display import HTML, display\nimport os\n"
               "display(HTML('<b>host ' + os.environ['TPUNB_HOST_INDEX'] + '</b>'))")
    html = [o.data["text/html"] for o in run.outputs if "text/html" in o.data]
    assert html == ["<b>host 0</b>"]
    assert "rich output from hosts 1 not shown" in run.stdout
    every = cell("%%on_tpu --output all\nfrom IPython.display import HTML\nimport os\n"
                 "HTML('<i>' + os.environ['TPUNB_HOST_INDEX'] + '</i>')")
    assert [o.data["text/html"] for o in every.outputs if "text/html" in o.data] == ["<i>0</i>", "<i>1</i>"]


def test_shell_escapes_magics_and_stderr_on_hosts(patient_grouping, make_slice, cell):
    make_slice(2)
    run = cell("%%on_tpu\n!echo from-shell $TPUNB_HOST_INDEX\nimport sys\nprint('warn', file=sys.stderr)\n"
               "%timeit -n 1 -r 1 pass")
    assert "[0] from-shell 0" in run.stdout and "[1] from-shell 1" in run.stdout
    assert "[0-1] warn" in run.stderr
    timed = sorted(line.split("]")[0] + "]" for line in run.stdout.splitlines() if "per loop" in line)
    assert timed in (["[0]", "[1]"], ["[0-1]"]), run.stdout  # one line each, or one for both if they timed alike


def test_matplotlib_figure_from_host_zero_renders_inline(make_slice, cell):
    make_slice(2)
    run = cell("%%on_tpu\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.title('host plot')")
    assert run.error is None, run.shown
    images = [o.data for o in run.outputs if "image/png" in o.data]
    assert len(images) == 1 and images[0]["image/png"][:4] == "iVBO"  # one PNG, from host 0


def test_a_figure_that_cannot_be_shown_is_said_once_in_the_cells_output(patient_grouping, make_slice, cell):
    make_slice(2)
    run = cell("%%on_tpu\nimport matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\nfigure = plt.figure()\nplt.plot([1, 2, 3])\n"
               "def savefig(*args, **kwargs):\n    raise OSError('No space left on device')\n"
               "figure.savefig = savefig\n'drawn'")
    assert run.error is None and "Out[0-1]: 'drawn'" in run.shown, run.shown
    assert run.stderr == ("[0-1] tpunb: the cell ran, but its figures could not be shown: "
                          "OSError: No space left on device\n"), run.stderr
    assert not [o for o in run.outputs if "image/png" in o.data]
    after = cell("%%on_tpu\n1")
    assert after.error is None and after.stderr == "", after.stderr  # the failed figure is not tried again


def test_push_and_pull(make_slice, cell, ip):
    sl = make_slice(2)
    ip.user_ns["weights"] = {"w": [1, 2, 3]}
    assert cell("%tpu_push weights").error is None
    cell("%%on_tpu\nimport os\nweights['host'] = int(os.environ['TPUNB_HOST_INDEX'])")
    run = cell("%tpu_pull weights --host 1")
    assert run.error is None and ip.user_ns["weights"] == {"w": [1, 2, 3], "host": 1}
    assert cell("%tpu_pull weights --host -1").error is None and ip.user_ns["weights"]["host"] == 1
    cell("%tpu_pull weights")
    assert ip.user_ns["weights"] == {0: {"w": [1, 2, 3], "host": 0}, 1: {"w": [1, 2, 3], "host": 1}}
    sl.push({"square": lambda v: v * v})  # functions travel too (cloudpickle)
    assert sl.pull("square") and "Out[0-1]: 49" in cell("%%on_tpu\nsquare(7)").shown
    missing = cell("%tpu_pull nothing_here")
    assert isinstance(missing.error, RemoteError) and "nothing_here" in str(missing.error)


@pytest.mark.fresh_slice
def test_host_environment_and_secret_env(make_slice, cell, isolated_home, request):
    run = cell(make_slice.line(2, name="envslice") + " --env API_TOKEN=s3cr3t-value")
    assert run.error is None, run.shown
    assert manager.registry().get_slice("envslice").backend == request.node.callspec.params["make_slice"]
    values = cell("%%on_tpu\nimport os\n(os.environ['TPUNB_HOST_INDEX'], os.environ['TPUNB_NUM_HOSTS'], "
                  "os.environ['TPUNB_SLICE'], os.environ['API_TOKEN'] == 's3cr3t-value')")
    assert "Out[0]: ('0', '2', 'envslice', True)" in values.shown
    assert "Out[1]: ('1', '2', 'envslice', True)" in values.shown
    for path in isolated_home.rglob("*"):
        if path.is_file():
            assert b"s3cr3t-value" not in path.read_bytes(), path
    assert "s3cr3t-value" not in run.shown + values.shown + cell("%tpu_status").shown


@pytest.mark.fresh_slice
def test_bad_magic_arguments_give_usage(make_slice, cell):
    make_slice(2)
    run = cell("%%on_tpu --bogus\npass")
    assert "Usage: %%on_tpu [--hosts HOSTS]" in run.shown and "Traceback" not in run.shown
    assert "--output: invalid choice" in cell("%%on_tpu --output loud\npass").shown
    assert "host 7 does not exist" in cell("%%on_tpu --hosts 7\npass").shown
    assert "use all, 0, 0,2 or 1:3" in cell("%%on_tpu --hosts x\npass").shown
    assert "Usage: %tpu_launch" in cell("%tpu_launch").shown
    unknown = cell("%tpu_launch v4-17")
    assert "did you mean" in unknown.shown and len(unknown.shown.strip().splitlines()) == 1


@pytest.mark.fresh_slice
def test_no_slice_yet_says_how_to_launch(cell):
    run = cell("%%on_tpu\nprint('hi')")
    assert "no slice yet: launch one with %tpu_launch" in run.shown
    assert "Traceback" not in run.shown


def test_input_on_a_host_explains_itself(make_slice, cell):
    make_slice(1)
    run = cell("%%on_tpu\ninput('name? ')")
    assert isinstance(run.error, RemoteError) and "no stdin" in run.stdout
    text = ANSI.sub("", run.stdout)
    assert "NoStdin" not in text and "tpunb" not in text.replace("tpunb hosts have no stdin", "")
    assert "Could not get source" not in text
