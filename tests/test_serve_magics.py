"""The serving magics, thin over Slice.serve/logs/forward: in a real IPython shell, over local
hosts and real sshd hosts."""
from __future__ import annotations

import threading
import urllib.request

import pytest

import tpunb.services
from tests.conftest import interrupt_kernel_when, wait_for
from tests.test_serve import PYTHON, free_port, http_server, no_service_left  # noqa: F401 - autouse fixture

pytestmark = pytest.mark.ends_services


def test_serve_forward_logs_and_stop_from_magics(make_slice, cell):
    sl = make_slice(2)
    port = free_port()
    run = cell(f"%tpu_serve web --hosts 0 --wait-http {port}/ --env TOKEN=hush-123 -- {http_server(port)}")
    assert run.error is None, run.shown
    assert f"[tpunb] 'web' ready on host 0 in" in run.stdout and "hush-123" not in run.shown
    run = cell(f"url = %tpu_forward {port}\nurl")
    assert run.error is None, run.shown
    url = cell("print(url)").stdout.strip()
    with urllib.request.urlopen(url, timeout=30) as reply:
        assert reply.status == 200
    run = cell("%tpu_serve hi -- echo hi from $TPUNB_HOST_INDEX")
    assert run.stdout == "[tpunb] started 'hi' on hosts 0-1\n"
    wait_for(lambda: {s.state for s in sl.services() if s.name == "hi"} == {"exited"}, what="hi to exit")
    run = cell("%tpu_logs hi")
    assert run.stdout == ("[0] hi from 0\n[0] [tpunb] exited with code 0\n"
                          "[1] hi from 1\n[1] [tpunb] exited with code 0\n")
    assert cell("%tpu_logs hi --host 1 --tail 1").stdout == "[tpunb] exited with code 0\n"
    listed = cell("%tpu_serve").stdout.splitlines()
    assert listed[0].split() == ["service", "host", "port", "state", "restarts", "command"]
    assert [line.split()[:4] for line in listed[1:]] == [["hi", "0", "exited", "with"], ["hi", "1", "exited", "with"],
                                                         ["web", "0", str(port), "ready"]]  # the port --wait-http gave
    run = cell("%tpu_serve --stop web")
    assert run.error is None and run.stdout == "[tpunb] stopped 'web' on host 0\n"


@pytest.mark.parametrize("line, says", [
    ("%tpu_serve web", "give a NAME and, after --, the command. Usage: %tpu_serve NAME"),
    ("%tpu_serve -- echo hi", "give a NAME and, after --, the command"),
    ("%tpu_serve web --restart always -- true", "argument --restart: invalid choice: 'always'"),
    ("%tpu_serve web --env NOEQUALS -- true", "--env takes KEY=VALUE, got 'NOEQUALS'"),
    ("%tpu_serve --stop", "give the service to stop: %tpu_serve --stop NAME"),
    ("%tpu_logs", "give a service NAME or --file PATH (one of them)"),
    ("%tpu_logs web --file train.log", "give a service NAME or --file PATH (one of them)"),
    ("%tpu_logs web --tail -2", "--tail takes a number of lines >= 0, not -2"),
    ("%tpu_forward eighty", "argument port: invalid int value: 'eighty'"),
    ("%tpu_forward 70000", "a port is a number from 1 to 65535, not 70000"),
])
@pytest.mark.parametrize("make_slice", ["local"], indirect=True)  # parsed in the kernel: one transport says it all
def test_bad_arguments_give_one_line_usage_errors(make_slice, cell, line, says):
    make_slice(1)
    run = cell(line)
    assert type(run.error).__name__ == "UsageError", run.shown
    assert says in str(run.error) and "\n" not in str(run.error)


def test_follow_prints_new_lines_and_ends_cleanly_on_interrupt(make_slice, cell, monkeypatch):
    sl = make_slice(1)
    script = "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.05; done"
    assert cell(f"%tpu_serve ticker -- {script}").error is None
    followed = threading.Event()
    real = tpunb.services.Serving.follow

    def watched(*args, **kwargs):  # the real follow; says when it has printed twice
        for count, chunk in enumerate(real(*args, **kwargs)):
            yield chunk
            if count == 1:
                followed.set()

    monkeypatch.setattr(tpunb.services.Serving, "follow", watched)
    interrupt_kernel_when(followed.is_set)
    run = cell("%tpu_logs ticker --follow --tail 2")
    assert run.error is None, run.shown
    assert run.stdout.startswith("tick ") and run.stdout.endswith("[tpunb] stopped following 'ticker'\n")
    ticks = [int(line.split()[1]) for line in run.stdout.splitlines()[:-1]]
    assert ticks == list(range(ticks[0], ticks[0] + len(ticks))) and len(ticks) >= 3  # in order, none lost
    assert [s.state for s in sl.services()] == ["running"]  # following it did not touch it


def test_logs_tail_and_follow_a_file_on_every_host(make_slice, cell, monkeypatch, tmp_path):
    """%tpu_logs --file PATH: the same file on every host (each host's own), labelled, --tail and
    --follow as for a service; a host without it is named in one line."""
    sl = make_slice(2)
    path = tmp_path / "train.log"  # local hosts share this machine: each writes its own file
    run = cell(f"%%on_tpu\nimport os\nopen('{path}.' + os.environ['TPUNB_HOST_INDEX'], 'w')"
               ".write('step 1\\nstep 2 on ' + os.environ['TPUNB_HOST_INDEX'] + '\\n')")
    assert run.error is None, run.shown
    assert cell(f"%tpu_logs --file {path}.0 --host 0 --tail 1").stdout == "step 2 on 0\n"
    missing = cell(f"%tpu_logs --file {path}.9")  # no host has it: said, host by host, in one line
    assert type(missing.error).__name__ == "UsageError", missing.shown
    assert f"host 0: no file {path}.9 on this host; host 1: no file" in str(missing.error)
    missing = cell(f"%tpu_logs --file {path}.9 --follow")  # followed: the same one line
    assert type(missing.error).__name__ == "UsageError" and "\n" not in str(missing.error), missing.shown
    assert f"host 0: no file {path}.9 on this host; host 1: no file" in str(missing.error)
    both = tmp_path / "both.log"
    both.write_text("one\ntwo\n")
    assert cell(f"%tpu_logs --file {both} --tail 1").stdout == "[0] two\n[1] two\n"
    followed = threading.Event()
    real = tpunb.services.Serving.follow

    def watched(*args, **kwargs):
        for count, chunk in enumerate(real(*args, **kwargs)):
            yield chunk
            if count == 0:
                with both.open("a") as f:
                    f.write("three\n")
            if count >= 3:
                followed.set()

    monkeypatch.setattr(tpunb.services.Serving, "follow", watched)
    interrupt_kernel_when(followed.is_set)
    run = cell(f"%tpu_logs --file {both} --follow --tail 1")
    assert run.error is None, run.shown
    lines = run.stdout.splitlines()
    assert lines[:2] == ["[0] two", "[1] two"] and sorted(lines[2:4]) == ["[0] three", "[1] three"], run.stdout
    assert lines[-1] == f"[tpunb] stopped following '{both}'"
    assert sl.services() == []  # reading files starts no service
