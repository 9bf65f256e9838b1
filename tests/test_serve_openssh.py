"""OpenSSH carries SSH forwards (tpunb/forwards/openssh.py): its ControlMaster ends with the kernel
that started it, even a SIGKILLed one, and a forward without ssh on PATH says nothing and works."""
from __future__ import annotations

import pytest
import os
import urllib.request
import uuid

from tests.conftest import wait_for
from tests.test_idle_delete import cell_done, kernel_process, kill
from tests.test_serve import free_port, http_server, no_service_left  # noqa: F401 - autouse fixture
from tests.test_serve_forward import ssh_children
from tpunb import report, manager
from tpunb.forwards import openssh
from tpunb.machine import procs

pytestmark = pytest.mark.ends_services


def masters_of(pid: int, port: int) -> list[int]:
    """``ssh -M`` processes to the sshd at ``port`` whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        parent = int(stat[stat.rindex(b")") + 2:].split()[1])
        if argv[:1] == [b"ssh"] and b"-M" in argv and str(port).encode() in argv and parent == pid:
            found.append(int(entry))
    return found


@pytest.mark.fresh_slice
def test_the_master_ends_with_a_killed_kernel(sshd, ssh_key):
    name = f"fwd-{uuid.uuid4().hex[:6]}"
    connect = f"%tpu_connect {sshd.addresses[0]}:{sshd.port} --key {ssh_key} --python {sshd.python} --name {name}"
    kernel = kernel_process(sshd, [connect, "%tpu_forward 8000"])
    try:
        cell_done(kernel)
        wait_for(lambda: "".join(kernel.output).count("cell done None") == 2 or kernel.poll() is not None, 60,
                 "the forward")
        assert "".join(kernel.output).count("cell done None") == 2, "".join(kernel.output)
        masters = masters_of(kernel.pid, sshd.port)
        assert len(masters) == 1
        kill(kernel)
    finally:
        if kernel.poll() is None:
            kill(kernel)
    wait_for(lambda: not any(procs.alive(pid) for pid in masters), 10, "the ControlMaster to end with its kernel")
    manager.down(name)


def test_without_ssh_on_path_forwards_use_paramiko_quietly(make_slice, monkeypatch, capsys):
    sl = make_slice(1)
    port = free_port()
    sl.serve("web", http_server(port), hosts=[0], wait_port=port)
    monkeypatch.setenv("PATH", "/nonexistent")
    capsys.readouterr()
    url = sl.forward(port, local_port=None if sl.backend != "local" else free_port())
    with urllib.request.urlopen(url, timeout=30) as reply:
        assert reply.status == 200
    assert ssh_children() == [] and capsys.readouterr().err == ""


@pytest.mark.fresh_slice
def test_an_ssh_that_cannot_connect_is_said_once_and_forwards_still_work(sshd, ssh_key, tmp_path, monkeypatch, capsys):
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'ssh: Could not resolve hostname: made up' >&2\nexit 255\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(report, "_once", set())  # a new kernel: nothing said once yet
    sl = manager.connect([f"{sshd.addresses[0]}:{sshd.port}"], key=str(ssh_key), python=sshd.python,
                        name=f"fwd-{uuid.uuid4().hex[:6]}")
    port = free_port()
    sl.serve("web", http_server(port), hosts=[0], wait_port=port)
    capsys.readouterr()
    urls = [sl.forward(port), sl.forward(port)]
    for url in urls:
        with urllib.request.urlopen(url, timeout=30) as reply:
            assert reply.status == 200
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "OpenSSH cannot carry forwards" in said and "Could not resolve hostname" in said
