"""A slice whose hosts are reached only through an exec channel (tests/backends/exec_hosts.py: each
"pod" entered with ``setsid -w env -i ... sh -c``, as ``kubectl exec -i POD --`` enters a pod),
registered as another package's backend: cells, push and pull (by relay among the pods too), a fetch
whose bytes the pods relay, sync, a service with its logs and a forward, signals, a frozen host,
stacks (from this kernel and from outside it) and restart, each through the transport's capabilities
alone (tpunb/transport/exec.py, streams.py). One slice of 2 pods for the module; the backend
contract itself runs in tests/test_backends.py."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tpunb import catalog, provision
from tpunb.server.outside import recorded_stacks
from tpunb.sandbox.hub.hub_server import Hub, HubServer
from tpunb.host.fetch import CHUNK
from tpunb.manager import SliceManager
from tpunb.provision import LaunchRequest
from tpunb.registry import Registry
from tpunb.transport.exec import ExecTransport
from tests.conftest import CPU_AS_TPU_HOST, wait_for
from tests.test_backends import EXEC
from tests.test_sync import EXCLUDE, EXPECTED, remote_files, tree  # noqa: F401 (tree: the fixture)

pytestmark = pytest.mark.fresh_slice
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pods(tmp_path_factory):
    """(the slice, its registry, the exec backend) for the module: 2 pods, agents started."""
    home = tmp_path_factory.mktemp("exec-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TPUNB_HOME", str(home))
        module = provision.registered({provision.ENVIRONMENT: EXEC}, entry_points=[])["exec"]
        patch.setitem(provision._MODULES, "exec", module)
        reg = Registry()
        made = module.create(LaunchRequest("pods", catalog.lookup("v4-16"), reg, dict(CPU_AS_TPU_HOST),
                                           module.options(pods=str(home / "pods"))))
        manager = SliceManager()
        sl = manager.start(made, reg, dict(CPU_AS_TPU_HOST))
        try:
            yield sl, reg, module
        finally:
            sl.close()
            manager.forks.close()
            module.delete(made.record)


def homes(pods_) -> list[str]:
    sl, _, module = pods_
    return [str(module.pod_home(sl.record, i)) for i in range(2)]


def test_cells_run_in_each_pod_reached_through_its_exec_channel_alone(pods):
    sl = pods[0]
    transports = sl.session.transports
    assert all(isinstance(t, ExecTransport) and not t.same_machine and t.openssh_login() is None for t in transports)
    run = sl.run("import os\nf\"{os.environ['HOME']} {os.getcwd()} {'SSH_CONNECTION' in os.environ} "
                 "{'TPUNB_HOME' in os.environ}\"", output=None)
    assert run.reprs == {i: repr(f"{home} {home} False False") for i, home in enumerate(homes(pods))}
    shell = sl.run_shell("echo $HOME", output=None)
    assert shell.ok and shell.stdout == {i: home + "\n" for i, home in enumerate(homes(pods))}


def test_push_and_pull_directly_and_by_relay_among_the_pods(pods, monkeypatch):
    sl = pods[0]
    sl.push({"small": 41})
    assert sl.pull("small") == {0: 41, 1: 41}
    monkeypatch.setenv("TPUNB_RELAY", "always")
    big = np.arange(1 << 19, dtype=np.float64)  # 4 MB: striped, passed on between the pods
    sl.push({"big": big})
    assert sl.run("float(big.sum())", output=None).reprs == {0: repr(float(big.sum())), 1: repr(float(big.sum()))}
    assert np.array_equal(sl.pull("big")[1], big)
    relay = sl.session.relay
    assert not relay.unreachable and {i: address for i, (_, (address, _)) in relay.listeners.items()} == \
        {0: "127.0.0.10", 1: "127.0.0.11"}  # each pod listens where its backend says it is (TPUNB_PEER_ADDRESS)
    sl.run("del small, big", output=None)


@pytest.mark.sandbox  # the Hub stand-in serves the file
def test_a_fetch_takes_each_byte_from_the_source_once_and_the_pods_relay_it(pods):
    sl = pods[0]
    weights = os.urandom(2 * CHUNK + 777)
    with HubServer(Hub()) as server:
        server.hub.add_repo("org/files", {"big.bin": weights})
        done = sl.fetch(f"{server.url}/org/files/resolve/main/big.bin", to="~/m")
        assert server.hub.gets[("org/files", "big.bin")] == 2  # the listing's first byte, then the file once
    assert (done.route, done.downloader, done.through_kernel, done.received) == \
        ("relay", 0, 0, {0: len(weights), 1: len(weights)})
    for home in homes(pods):
        assert Path(home, "m", "big.bin").read_bytes() == weights
    sl.run_shell("rm -rf ~/m", output=None)


def test_sync_copies_a_tree_into_each_pod_through_tpunb_s_own_sftp_server(pods, tree):  # noqa: F811
    sl = pods[0]
    first = sl.sync(str(tree), "work", exclude=EXCLUDE)
    assert first.files_sent == 2 * len(EXPECTED)
    for home in homes(pods):
        dest = os.path.join(home, "work")
        assert remote_files(Path(dest)) == EXPECTED
        assert open(os.path.join(dest, "train.py")).read() == (tree / "train.py").read_text()
    (tree / "train.py").write_text("print('changed')\n")
    again = sl.sync(str(tree), "work", exclude=EXCLUDE)
    assert [h.sent for h in again.hosts] == [1, 1] and [h.unchanged for h in again.hosts] == [len(EXPECTED) - 1] * 2
    assert sl.run("open('work/train.py').read()", output=None).reprs == {0: repr("print('changed')\n"),
                                                                         1: repr("print('changed')\n")}
    sl.run_shell("rm -rf work", output=None)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_service_its_logs_and_a_forward_to_it(pods):
    sl = pods[0]
    port = _free_port()
    started = sl.serve("web", f"echo hello-from-the-pod > page.txt && exec python3 -m http.server {port} "
                              "--bind 127.0.0.1", hosts=[0], wait_http=f"{port}/")
    try:
        assert [(s.host, s.state) for s in started] == [(0, "running")]
        url = sl.forward(port, host=0)
        assert url != f"http://127.0.0.1:{port}/"  # carried: a pod's ports are not this machine's to the kernel
        assert urllib.request.urlopen(url + "page.txt", timeout=30).read() == b"hello-from-the-pod\n"
        wait_for(lambda: "GET /page.txt" in sl.logs("web", host=0), 30, "the request in the service's log")
        assert list(sl.logs("web")) == [0]

        closed = sl.forward(_free_port(), host=1)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(closed, timeout=30)
        assert refused.value.code == 502 and "nothing answers on port" in refused.value.read().decode()
    finally:
        assert sl.stop_service("web") == [0]
        for made in sl.forwards:
            made.close()
        sl.forwards.clear()
    assert [s for s in sl.services() if s.state == "running"] == []


def test_signals_reach_a_pod_s_programs_only_through_a_kill_run_in_the_pod(pods, monkeypatch):
    """A pod's programs are no processes of the exec command's (another pid, another session): a
    signal reaches them through ``kill`` run in the pod (``ExecTransport.kill_group``), a program
    that ignores its end of input is killed there by ``close``, and a host that ignores an interrupt
    is ended by the escalation and started again by the next cell."""
    sl = pods[0]
    transport = sl.session.transports[0]
    process = transport.spawn(["sh", "-c", "echo started; exec sleep 60"])
    assert process.recv_exact(8) == b"started\n"
    wait_for(lambda: process.remote_pid, 10, "the pod's pid of the program")
    assert process.remote_pid != process.pid and os.getsid(process.remote_pid) != os.getsid(process.pid)
    process.signal_group(process.remote_pid, signal.SIGTERM)
    wait_for(lambda: process.exit_status() is not None, 10, "the program's end")
    assert process.exit_status() == -signal.SIGTERM
    process.close()

    stubborn = transport.spawn(["sh", "-c", "trap '' HUP; echo started; exec sleep 60 < /dev/null"])
    assert stubborn.recv_exact(8) == b"started\n"
    wait_for(lambda: stubborn.remote_pid, 10, "the pod's pid of the program")
    remote = stubborn.remote_pid
    assert stubborn.close(grace=0.2) is True
    # ended in the pod, not only its exec command here (a SIGKILL is delivered, not waited for: the
    # program is gone, or a zombie, a moment after the kill returns)
    wait_for(lambda: _ended(remote), 10, "the stubborn program to be ended in its pod")

    monkeypatch.setattr(sl.session, "interrupt_grace", 0.5)
    pid = sl.session.hosts[1].info["pid"]
    code = ("import os, signal, time\n"
            "if os.environ['TPUNB_HOST_INDEX'] == '1':\n"
            "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "    time.sleep(60)\n")
    run = sl.run(code, timeout=1.0, output=None)
    assert (run[0].status, run[1].status) == ("ok", "killed"), run
    assert sl.run("1 + 1", output=None).reprs == {0: "2", 1: "2"}
    assert sl.session.hosts[1].info["pid"] != pid


def test_a_frozen_pod_host_is_given_up_and_started_again(pods, monkeypatch):
    """A host that stops answering (its agent stopped, as a frozen pod) fails its cell naming it; its
    agent is ended in the pod (the exec command here is not it) and the next cell starts a new one."""
    sl = pods[0]
    monkeypatch.setattr(sl.session, "heartbeat_timeout", 3.0)
    pid = sl.session.hosts[1].info["pid"]
    os.kill(pid, signal.SIGSTOP)
    run = sl.run("1", output=None)
    assert (run[0].status, run[1].status) == ("ok", "died") and "stopped answering" in run[1].detail, run[1].__dict__
    wait_for(lambda: _ended(pid), 20, "the frozen agent to be ended in its pod")
    assert sl.run("2", output=None).reprs == {0: "2", 1: "2"} and sl.session.hosts[1].info["pid"] != pid


def _ended(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_stacks_from_this_kernel_and_from_outside_then_a_restart_that_kills_a_host_in_c(pods, tmp_path):
    sl, reg, _ = pods
    cell = sl.run("import re, time\ndef training():\n    open('in-training', 'w').close()\n"
                  "    re.match(r'(a+)+$', 'a' * 64 + 'b') if __import__('os').environ['TPUNB_HOST_INDEX'] == '1' "
                  "else time.sleep(600)\ntraining()", output=None, background=True)
    sl.heartbeat_timeout = 0  # host 1 holds its GIL in C: it cannot beat
    homes_ = homes(pods)
    wait_for(lambda: all(os.path.exists(os.path.join(h, "in-training")) for h in homes_), 60, "both pods in training()")
    stacks = wait_for(lambda: (lambda s: s if all(s[i].main and "training" in s[i].where for i in (0, 1)) else None)(
        sl.stacks()), 30, "both hosts' stacks inside training()")
    assert re.search(r"training -> match$", stacks[1].where) and "training" in stacks[0].where
    native = sl.stacks(hosts=[0], native=True)  # py-spy run in the pod: C frames under the Python ones
    assert any(f.kind == "native" for f in native[0].main.frames) and not native[0].native_error, native.text()

    outside = recorded_stacks(reg.get_slice(sl.name), reg)  # the record and its backend's transports alone
    assert re.search(r"^\[1\] main thread: .*training -> match$", outside.text(), re.M), outside.text()
    terminal = subprocess.run(  # another process, which knows the backend through $TPUNB_BACKENDS alone
        [sys.executable, "-m", "tpunb", "stacks", sl.name], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TPUNB_HOME": str(reg.path.parent),
             provision.ENVIRONMENT: EXEC})
    assert terminal.returncode == 0, terminal.stderr
    assert re.search(r"^\[1\] main thread: .*training -> match$", terminal.stdout, re.M), terminal.stdout

    agents = [h.info["pid"] for h in sl.session.hosts]
    done = sl.restart()
    assert done.restarted == [0, 1] and done.killed == [1], done
    cell.wait(30)
    assert cell.done()
    new = [h.info["pid"] for h in sl.session.hosts]
    assert all(n != a for n, a in zip(new, agents))
    assert sl.run("'training' in globals()", output=None).reprs == {0: "False", 1: "False"}
    for home in homes_:
        os.remove(os.path.join(home, "in-training"))
