"""Services on hosts (tpunb.services): detached from cells, logged, restarted, ended with the slice.
Over local hosts and real sshd hosts; the services are real HTTP servers asked by a real client."""
from __future__ import annotations

import os
import shlex
import signal
import socket
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tpunb import manager
from tpunb.errors import ServiceError, UsageError
from tpunb.host.standalone.service import alive

pytestmark = pytest.mark.ends_services

PYTHON = shlex.quote(sys.executable)


@pytest.fixture(autouse=True)
def no_service_left(isolated_home):
    """Services outlive the kernel by design: a test's slices are deleted, so none keeps running."""
    yield
    manager.down(all=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_server(port: int) -> str:
    return f"{PYTHON} -u -m http.server {port} --bind 127.0.0.1"


def get(port: int, path: str = "/") -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
        return reply.status


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_a_service_answers_while_cells_run_and_logs_per_host(make_slice):
    sl = make_slice(2)
    port = free_port()
    states = sl.serve("web", http_server(port), hosts=[0], wait_http=f"{port}/")
    assert [(s.host, s.state) for s in states] == [(0, "running")]
    assert get(port) == 200
    result = sl.run("x = 6 * 7\nx")  # cells run beside the service
    assert result[0].value["text/plain"] == "42"
    sl.serve("hello", "echo hello from $TPUNB_HOST_INDEX")
    wait_for(lambda: {s.host: s.state for s in sl.services() if s.name == "hello"} == {0: "exited", 1: "exited"},
             what="hello to exit on both hosts")
    assert sl.logs("hello") == {0: "hello from 0\n[tpunb] exited with code 0\n",
                                1: "hello from 1\n[tpunb] exited with code 0\n"}
    assert sl.logs("hello", host=1, tail=1) == "[tpunb] exited with code 0\n"
    assert "GET / HTTP/1.1" in sl.logs("web", host=0)
    rows = {(s.name, s.host): s for s in sl.services()}
    assert set(rows) == {("web", 0), ("hello", 0), ("hello", 1)}
    assert rows["hello", 1].exit_code == 0 and rows["web", 0].exit_code is None


def test_an_exiting_service_shows_its_code_and_on_failure_restarts_a_bounded_number_of_times(make_slice):
    sl = make_slice(1)
    sl.serve("once", "echo bye; exit 3")
    wait_for(lambda: [s.state for s in sl.services() if s.name == "once"] == ["exited"], what="once to exit")
    (once,) = [s for s in sl.services() if s.name == "once"]
    assert (once.exit_code, once.restarts, once.message) == (3, 0, "exited with code 3")
    sl.serve("crashy", "echo crash; exit 5", restart="on-failure", max_restarts=2)
    wait_for(lambda: [s.state for s in sl.services() if s.name == "crashy"] == ["failed"], timeout=30,
             what="crashy to give up")
    (crashy,) = [s for s in sl.services() if s.name == "crashy"]
    assert (crashy.exit_code, crashy.restarts) == (5, 2)
    assert crashy.message == "gave up after 2 restarts (last exit code 5)"
    assert sl.logs("crashy", host=0).count("crash\n") == 3  # the first run and two restarts


def test_wait_http_that_never_answers_times_out_with_the_log_tail(make_slice):
    sl = make_slice(1)
    port = free_port()
    with pytest.raises(ServiceError) as caught:
        sl.serve("mute", f"echo loading weights; echo still loading; exec sleep 300", wait_http=f"{port}/health",
                 timeout=1.5)
    message = str(caught.value)
    assert message.startswith(f"service 'mute' is not ready (host 0: no answer to HTTP GET /health on port {port} "
                              "within 1.5 s)")
    assert "stop it with %tpu_serve --stop mute" in message
    assert caught.value.tail == "loading weights\nstill loading\n"
    assert caught.value._render_traceback_()[1:] == ["  | loading weights", "  | still loading"]
    with pytest.raises(ServiceError, match=r"host 0: it exited with code 4\); it has ended.*"):
        sl.serve("dies", "echo no model; exit 4", wait_port=port, timeout=60)
    assert sl.stop_service("mute") == [0]
    assert [s.state for s in sl.services() if s.name == "mute"] == ["stopped"]


@pytest.mark.fresh_slice
def test_down_leaves_no_service_process(make_slice):
    sl = make_slice(2)
    ports = [free_port(), free_port()]
    sl.serve("a", http_server(ports[0]), hosts=[0], wait_port=ports[0])
    sl.serve("b", f"sleep 300 & {http_server(ports[1])}", hosts=[1], wait_port=ports[1])  # a child of its own too
    sl.serve("r", "exit 1", restart="on-failure", max_restarts=50)
    running = sl.services()
    logs = [Path(s.log) for s in running]
    pids = [s.pid for s in running]
    assert all(alive(p) for p in pids[:2])
    manager.down(sl.name)
    assert not any(alive(p) for p in pids)
    for port in ports:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert not any(p.parent.parent.exists() for p in logs)  # the slice's service files went with it


def test_secrets_given_with_env_reach_the_command_but_no_file_or_output(make_slice, capsys):
    sl = make_slice(1)
    secret = "s3cr3t-" + uuid.uuid4().hex
    states = sl.serve("tok2", 'test "$HF_TOKEN" = "$EXPECTED" && echo token ok', env={"HF_TOKEN": secret, "EXPECTED": secret})
    assert secret not in repr(states)
    wait_for(lambda: [s.state for s in sl.services() if s.name == "tok2"] == ["exited"], what="tok2 to exit")
    (tok2,) = [s for s in sl.services() if s.name == "tok2"]
    assert tok2.exit_code == 0 and tok2.env_keys == ["EXPECTED", "HF_TOKEN"]
    assert sl.logs("tok2", host=0) == "token ok\n[tpunb] exited with code 0\n"
    folder = Path(tok2.log).parent.parent
    for path in folder.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(), path
    out = capsys.readouterr()
    assert secret not in out.out + out.err
    assert secret not in repr(sl.services())


def test_bad_arguments_are_one_line_usage_errors(make_slice):
    sl = make_slice(1)
    with pytest.raises(UsageError, match="a service name is letters"):
        sl.serve("no spaces", "true")
    with pytest.raises(UsageError, match="restart is one of no, on-failure"):
        sl.serve("x", "true", restart="always")
    with pytest.raises(UsageError, match=r"--wait-http takes PORT/PATH \(e.g. 8000/health\)"):
        sl.serve("x", "true", wait_http="/health")
    with pytest.raises(UsageError, match="give the service a shell command"):
        sl.serve("x", "  ")
    with pytest.raises(UsageError, match="no service named 'ghost'.*start one with %tpu_serve NAME -- COMMAND"):
        sl.logs("ghost")
    sl.serve("sleeper", "exec sleep 300")
    with pytest.raises(ServiceError, match=r"service 'sleeper' did not start \(host 0: service 'sleeper' already runs"):
        sl.serve("sleeper", "exec sleep 300")
    with pytest.raises(UsageError, match="no service named 'ghost'.*its services are sleeper"):
        sl.stop_service("ghost")


def test_a_start_that_fails_on_one_host_leaves_nothing_new_running(make_slice):
    sl = make_slice(2)
    sl.serve("job", "exec sleep 300", hosts=[1])
    with pytest.raises(ServiceError, match=r"service 'job' did not start \(host 1: service 'job' already runs"):
        sl.serve("job", "exec sleep 300")
    assert {s.host: s.state for s in sl.services()} == {0: "stopped", 1: "running"}


@pytest.mark.fresh_slice
def test_deleting_a_local_slice_without_services_asks_no_host(monkeypatch):
    from tpunb.transport.bundle import SERVICE_CONTROL
    from tpunb.transport.pipes import LocalTransport

    monkeypatch.setenv("TPUNB_STANDBY", "0")  # a quiet slice's standby agents would start mid-count

    sl = manager.launch("v4-32", name=unique("plain"))
    sl.serve("one", "exec sleep 300", hosts=[2])
    asked = []
    real = LocalTransport.spawn
    monkeypatch.setattr(LocalTransport, "spawn", lambda self, argv: asked.append(argv) or real(self, argv))
    (pid,) = [s.pid for s in sl.services()]
    asked.clear()
    manager.down(sl.name)
    assert [argv[-1] for argv in asked] == [SERVICE_CONTROL]  # host 2 only: the others have no service folder
    assert not alive(pid)


@pytest.mark.fresh_slice
def test_down_of_a_slice_this_kernel_has_not_attached_stops_its_services(make_slice):
    sl = make_slice(2)
    port = free_port()
    sl.serve("web", http_server(port), hosts=[1], wait_port=port)
    sl.serve("job", "exec sleep 300")
    pids = [s.pid for s in sl.services()]
    assert len(pids) == 3 and all(alive(p) for p in pids)
    manager.detach_all()  # as a kernel that ended: the record stays, nothing here holds the slice
    assert manager.down(sl.name) == [sl.name]
    assert not any(alive(p) for p in pids)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def readers(paths: dict[str, int]) -> dict[int, int]:
    """{pid: host} of processes here (local and loopback sshd hosts alike) that have one of these
    files ({path: host}) open for reading only: following it (its service writes it, append-only)."""
    found = {}
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            host = paths.get(os.readlink(fd))
            if host is not None and int((fd.parent.parent / "fdinfo" / fd.name).read_text().split()[3], 8) & 3 == 0:
                found[int(fd.parent.parent.name)] = host
        except (OSError, ValueError, IndexError):
            pass
    return {pid: host for pid, host in found.items() if alive(pid)}


def test_follow_streams_every_hosts_lines_masked_names_a_host_that_drops_and_ctrl_c_ends_it_all(make_slice, tmp_path):
    """%tpu_logs --follow's engine: each host's control process streams its log; lines written on
    two hosts after the follow began arrive, labelled, whole (a secret written in two parts is still
    masked); a host whose follow dies is named in one line while the other goes on; Ctrl-C returns at
    once with no follow left running on any host."""
    from tests.conftest import interrupt_kernel_when
    from tpunb import report
    from tpunb.engine.masking import MASK

    sl = make_slice(2)
    secret = "hush-" + uuid.uuid4().hex
    sl.serving.masker.add(secret)
    script = (f"for i in 1 2 3; do while [ ! -e {tmp_path}/go.$i ]; do sleep 0.02; done; "
              'printf "line $i on $TPUNB_HOST_INDEX key=%s" "${TOKEN%????????}"; sleep 0.3; '
              'printf "%s\\n" "${TOKEN#"${TOKEN%????????}"}"; done; exec sleep 300')
    sl.serve("talk", script, env={"TOKEN": secret})
    logs = {s.log: s.host for s in sl.services()}
    (tmp_path / "go.1").touch()  # line 1 comes in the tail or live, once either way
    seen: dict[int, list[str]] = {0: [], 1: []}
    dropped: list[int] = []
    with report.captured() as said:
        def stopped_and_went_on() -> bool:
            return any("dropped out of the follow" in m.text for m in said) and any(
                line.startswith("line 3") for lines in seen.values() for line in lines)

        sent = interrupt_kernel_when(stopped_and_went_on)
        with pytest.raises(KeyboardInterrupt):
            for host, text in sl.serving.follow("talk", tail=1):
                assert text.endswith("\n") and secret not in text
                seen[host] += text.splitlines()
                if not (tmp_path / "go.2").exists():
                    (tmp_path / "go.2").touch()
                if all(any(line.startswith("line 2") for line in seen[h]) for h in seen) and not dropped:
                    followers = readers(logs)
                    assert sorted(followers.values()) == [0, 1], followers  # one program per host
                    pid = min(followers)
                    dropped.append(followers[pid])
                    os.kill(pid, signal.SIGKILL)  # one host's follow dies
                    (tmp_path / "go.3").touch()
    assert time.perf_counter() - sent["at"] < 5  # Ctrl-C ends the follow at once
    assert readers(logs) == {}  # no follow left on any host
    assert all(seen[h][:2] == [f"line 1 on {h} key={MASK}", f"line 2 on {h} key={MASK}"] for h in seen), seen
    assert [h for h in seen if f"line 3 on {h} key={MASK}" in seen[h]] == [1 - dropped[0]]  # the other went on
    (line,) = [m.text for m in said if "dropped out" in m.text]
    assert line.startswith(f"[tpunb] host {dropped[0]} dropped out of the follow (") and "\n" not in line
