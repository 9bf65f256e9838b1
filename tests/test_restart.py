"""%tpu_restart: fresh Python sessions on the same slice (the node, connections and services stay),
hosts that do not exit killed, unreachable hosts named and left needing a restart; and the way
there from a host stuck in a JAX collective: its stack before escalation, and from a second
process while the cell runs."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tpunb import manager
from tpunb.sandbox.hosts.sshd import Sshd
from tpunb.engine import standby
from tests.conftest import CPU_AS_TPU_HOST, wait_for

ROOT = Path(__file__).resolve().parent.parent
RESTARTED = re.compile(r"\[tpunb\] restarted hosts 0-1 of '([-a-z0-9]+)' in (\d+\.\d) s: fresh Python sessions, "
                       r"their variables are gone")

STUCK_IN_A_COLLECTIVE = """%%on_tpu --timeout 15
import jax
from jax.experimental import multihost_utils
kept = 'old state'
def wait_for_everyone():
    multihost_utils.sync_global_devices('only host 1 gets here')
print('devices', jax.device_count(), flush=True)
if jax.process_index() == 1:
    wait_for_everyone()
"""


@pytest.mark.jax
@pytest.mark.fresh_slice
def test_a_host_stuck_in_a_collective_is_found_then_restarted(make_slice, cell):
    """The issue's whole story: host 1 alone enters a collective; the cell's --timeout returns with
    where host 1 is (its function and line); a second process sees the same while it runs; then
    %tpu_restart gives fresh sessions with JAX over the whole slice."""
    sl = make_slice(2)
    # JAX up first: its start on a loaded machine must not eat the 15 s in which the terminal looks
    assert "Out[0-1]: 8" in cell("%%on_tpu\nimport jax\njax.device_count()").shown
    seen, last = {}, []

    def from_a_terminal() -> None:  # python -m tpunb stacks, while the notebook is busy
        def stuck() -> str | None:
            done = subprocess.run([sys.executable, "-m", "tpunb", "stacks", sl.name], capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
            out = done.stdout
            last[:] = [f"{out}{done.stderr}"]
            settled = "wait_for_everyone" in out and re.search(r"^\[0\] main thread: not in a cell", out, re.M)
            return out if settled else None
        seen["text"] = wait_for(stuck, 60, "host 1 inside the collective and host 0 done, seen from another process")

    terminal = threading.Thread(target=from_a_terminal, daemon=True)
    terminal.start()
    run = cell(STUCK_IN_A_COLLECTIVE)
    terminal.join(60)
    assert "text" in seen, f"the terminal never saw host 1 stuck; it last printed:\n{last}\nthe cell:\n{run.shown}"
    assert re.search(r"^\[1\] main thread: In\[\d+\]:8 <module> -> In\[\d+\]:5 wait_for_everyone -> "
                     r"sync_global_devices$", seen["text"], re.M), seen["text"]
    assert re.search(r"^\[0\] main thread: not in a cell", seen["text"], re.M), seen["text"]

    assert "[0-1] devices 8" in run.stdout
    before = run.stdout.index("[tpunb] host 1 did not stop within 3 s of the interrupt")
    assert re.search(r"^\[1\] main thread: In\[\d+\]:8 <module> -> In\[\d+\]:5 wait_for_everyone -> "
                     r"sync_global_devices$", run.stdout[before:], re.M), run.stdout
    assert re.search(r"jax/experimental/multihost_utils.py:\d+ in sync_global_devices", run.stdout[before:])
    error = str(run.error)
    assert "passed its 15 s timeout; host 1 did not stop when interrupted and was killed" in error, error
    assert re.search(r"host 1 was at In\[\d+\]:5 wait_for_everyone -> sync_global_devices\)", error), error
    assert "%tpu_restart restarts every host now" in error

    restart = cell("%tpu_restart")
    assert restart.error is None, restart.shown
    assert RESTARTED.search(restart.stdout) and "JAX is starting again over the whole slice" in restart.stdout
    fresh = cell("%%on_tpu\nimport jax\n'kept' in globals(), jax.device_count(), jax.process_count()")
    assert "Out[0-1]: (False, 8, 2)" in fresh.shown, fresh.shown


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_restart_keeps_the_slice_its_connections_and_services(make_slice, cell):
    sl = make_slice(2)
    cell("%%on_tpu\nkept = 1")
    transports = list(sl.session.transports)
    agents = [h.info["pid"] for h in sl.session.hosts]
    sl.serve("idle", "sleep 600")
    service_pids = {s.host: s.pid for s in sl.services()}

    run = cell("%tpu_restart --hosts all")
    found = RESTARTED.search(run.stdout)
    assert found and found.group(1) == sl.name, run.shown
    assert float(found.group(2)) < 10
    assert "Out[0-1]: False" in cell("%%on_tpu\n'kept' in globals()").shown
    assert sl.session.transports == transports and manager.current() is sl  # the same slice, same connections
    new = [h.info["pid"] for h in sl.session.hosts]
    assert all(n != a for n, a in zip(new, agents))
    assert [h.info.pid for h in manager.registry().get_slice(sl.name).hosts] == new  # others find the new ones
    assert {s.host: (s.pid, s.state) for s in sl.services()} == {h: (p, "running") for h, p in service_pids.items()}
    sl.stop_service("idle")


@pytest.mark.jax
@pytest.mark.fresh_slice
def test_restarting_some_hosts_keeps_the_others_state_until_jax_runs(make_slice, cell):
    sl = make_slice(2)
    cell("%%on_tpu\nkept = 1")
    run = cell("%tpu_restart --hosts 1")
    assert "[tpunb] restarted host 1 of" in run.stdout and "its variables are gone" in run.stdout
    assert "Out[0]: True" in cell("%%on_tpu\n'kept' in globals()").shown
    sl.session.jax_started = True  # as if a cell had imported jax: a peer cannot be restarted alone
    run = cell("%tpu_restart --hosts 1")
    assert "restarted hosts 0-1" in run.stdout and "every host, since JAX's distributed runtime" in run.stdout


@pytest.mark.jax
@pytest.mark.fresh_slice
def test_a_host_that_does_not_exit_is_killed(make_slice, cell, flags):
    """Host 1 holds the GIL in C (a regex that never ends) in a cell still running on another
    thread: it cannot even read that it should end, so the restart kills it."""
    sl = make_slice(2)
    spinning = sl.session.hosts[1].info["pid"]
    box: dict = {}
    running = threading.Thread(target=lambda: box.setdefault("result", sl.run(
        f"import re\nopen({str(flags / 'in')!r}, 'w').close()\nre.match(r'(a+)+$', 'a' * 64 + 'b')",
        hosts=[1], output=None)), daemon=True)
    running.start()
    wait_for(lambda: (flags / "in").exists(), 60, "host 1 in its regex")
    run = cell("%tpu_restart")
    assert "host 1 did not exit and was killed" in run.stdout, run.shown
    running.join(30)
    assert not running.is_alive() and not _running(spinning)
    assert box["result"].notes() == ["host 1 was restarted (%tpu_restart) while the cell ran: the cell's work there "
                                      "is lost"]
    assert "Out[0-1]: 2" in cell("%%on_tpu\n1 + 1").shown


@pytest.mark.fresh_slice
def test_an_unreachable_host_is_named_and_left_needing_a_restart(sshd, ssh_key, cell, tmp_path):
    """Host 1 behind an sshd of its own, which then goes away: the restart restarts host 0, names
    host 1, and leaves it marked; once its sshd is back, %tpu_restart restarts it too."""
    other = Sshd(hosts=1, directory=tmp_path / "other")
    try:
        other.authorize(sshd.authorized_keys.read_text())  # the same user key is let in
        sl = manager.connect([f"{sshd.addresses[0]}:{sshd.port}", f"{other.addresses[0]}:{other.port}"],
                            key=str(ssh_key), python=sshd.python, env=CPU_AS_TPU_HOST, name="far")
        cell("%%on_tpu\nkept = 1")
        other.stop(sessions=True)  # the host's sshd and everything it ran are gone
        run = cell("%tpu_restart")
        assert "[tpunb] restarted host 0 of 'far'" in run.stdout, run.shown
        assert re.search(r"host 1 could not be reached \(.*refused the connection.*\) and still needs a restart: "
                         r"%tpu_restart again once it answers", run.stdout), run.stdout
        assert manager.registry().get_slice("far").hosts[1].info.needs_restart
        assert list(manager.status()["state"]) == ["running", "needs restart"]
        assert "Out[0]: False" in cell("%%on_tpu --hosts 0\n'kept' in globals()").shown
        refused = cell("%%on_tpu\n1")
        assert "host 1 could not be reached by %tpu_restart and still needs a restart" in str(refused.error)
        other.start()
        run = cell("%tpu_restart")
        assert "[tpunb] restarted hosts 0-1 of 'far'" in run.stdout and "could not be reached" not in run.stdout
        assert not manager.registry().get_slice("far").hosts[1].info.needs_restart
        assert "Out[0-1]: 2" in cell("%%on_tpu\n1 + 1").shown
        manager.down("far")
    finally:
        other.close()


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.fresh_slice
@pytest.mark.usefixtures("user_defaults")
def test_a_prepared_restart_hands_the_hosts_to_standby_agents(make_slice, cell):
    """Standby agents (started ahead, past their imports) take the hosts' places: the restart starts
    no process of its own, and prepares the next restart's standbys after it."""
    sl = make_slice(2)
    cell("%%on_tpu\nkept = 1")
    sl.standbys.prepare(wait=True)
    assert sl.standbys.wait_ready(30) and all(s.greeted for s in sl.standbys.ready().values())  # hello waited on
    standbys = wait_for(lambda: (lambda pids: pids if all(pids) else None)(
        [sl.standbys.ready()[i].process.pid for i in range(2)]), 30, "the standbys' pids")
    run = cell("%tpu_restart")
    assert RESTARTED.search(run.stdout), run.shown
    assert [h.info["pid"] for h in sl.session.hosts] == standbys
    assert "Out[0-1]: False" in cell("%%on_tpu\n'kept' in globals()").shown
    wait_for(lambda: len(sl.standbys.ready()) == 2, 60, "the next restart's standbys")
    assert not set(standbys) & {s.process.pid for s in sl.standbys.ready().values()}


@pytest.mark.fresh_slice
@pytest.mark.usefixtures("user_defaults")
def test_a_quiet_slice_prepares_standbys_so_its_first_restart_starts_no_process(make_slice, cell):
    """By default a slice prepares its standby agents once no request has run for QUIET seconds,
    with nothing asking: its very first restart hands the hosts to them (no agent start)."""
    assert standby.policy() == "eager"
    sl = make_slice(2)
    cell("%%on_tpu\nkept = 1")
    def started() -> list[int] | None:  # each standby's pid (over SSH it is reported a moment after the spawn)
        ready = sl.standbys.ready()
        pids = [ready[i].process.pid for i in range(2) if i in ready and ready[i].greeted]
        return pids if len(pids) == 2 and all(pids) else None

    standbys = wait_for(started, 60, "the quiet slice's standbys")
    assert all(_running(pid) for pid in standbys)
    assert not set(standbys) & {h.info["pid"] for h in sl.session.hosts}
    run = cell("%tpu_restart")
    assert RESTARTED.search(run.stdout), run.shown
    assert [h.info["pid"] for h in sl.session.hosts] == standbys
    assert "Out[0-1]: False" in cell("%%on_tpu\n'kept' in globals()").shown


@pytest.mark.parametrize("value, policy", [(None, "eager"), ("1", "eager"), ("eager", "eager"), ("likely", "likely"),
                                           ("LIKELY ", "likely"), ("0", "off"), ("off", "off"), ("false", "off")])
def test_the_standby_policy_is_read_from_the_environment(monkeypatch, value, policy):
    if value is None:
        monkeypatch.delenv("TPUNB_STANDBY", raising=False)
    else:
        monkeypatch.setenv("TPUNB_STANDBY", value)
    assert standby.policy() == policy
