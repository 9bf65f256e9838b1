"""The fault suite: every way a slice has been seen to break, tried as a user would meet it.

Each case runs in a fresh Python process (a real IPython shell with tpunb loaded, like a
kernel), on the local simulated slice, over SSH (a real sshd on loopback addresses) or through
the Cloud TPU API emulator. The parent gives every case a hard bound, so a hang is a result
("hung"), not a stuck suite, and afterwards counts what outlived it: processes left in the
sessions of the case's host agents, and nodes left in the emulator.

    python bench/faults.py                 # every case; a markdown table (RELIABILITY.md)
    python bench/faults.py --fast          # the cases the test command runs (tests/test_faults.py); the
                                           # others have dedicated tests (test_liveness, test_idle_delete,
                                           # test_output) or take seconds by design
    python bench/faults.py --only frozen   # cases whose name contains "frozen"

Columns: survived (the cell returned within its bound, with a one-line error naming the host
where one was due, and no traceback from tpunb's or paramiko's code), seconds to the error, state
kept (hosts that were not at fault kept their variables), leaked (processes or nodes left).
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
CPU_AS_TPU_HOST = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
HARD_BOUND = 120.0  # seconds a case may take before the parent calls it hung


@dataclass
class Outcome:
    fault: str
    where: str
    survived: bool
    seconds: float | None = None
    state_kept: str = "n/a"
    leaked: int | None = None
    note: str = ""


@dataclass
class Case:
    name: str
    run: Callable
    where: tuple[str, ...]
    fast: bool


CASES: list[Case] = []


def case(name: str, where: tuple[str, ...] = ("local", "ssh"), fast: bool = True):
    def register(func):
        CASES.append(Case(name, func, where, fast))
        return func
    return register


# -- the harness inside a case's process ----------------------------------------------------------
class Harness:
    """A real IPython shell with tpunb, a way to make a slice of the case's kind, and the record
    of every agent started (so the parent can look for what outlived the case)."""

    def __init__(self, where: str, home: Path, sshd: dict) -> None:
        from IPython.testing.globalipapp import get_ipython

        self.where, self.home, self.sshd = where, home, sshd
        self.shell = get_ipython()  # the process's one test shell (start_ipython gives None after the first)
        self.shell.run_cell("%load_ext tpunb")
        self.name = "faulty"
        self.emulator = None
        self.record_failures: list[str] = []  # agent pids that could not be recorded for the leak count

    def cell(self, code: str):
        """(error, text shown, seconds), as a notebook would show them."""
        from IPython.utils.capture import capture_output

        started = time.perf_counter()
        with capture_output() as captured:
            result = self.shell.run_cell(code)
        texts = [o.data.get("text/plain", "") for o in captured.outputs]
        shown = "\n".join([captured.stdout, captured.stderr, *texts])
        return result.error_in_exec or result.error_before_exec, shown, time.perf_counter() - started

    def launch(self, hosts: int = 2, extra: str = "") -> None:
        env = " ".join(f"{k}={v}" for k, v in CPU_AS_TPU_HOST.items())
        accel = {1: "v4-8", 2: "v4-16", 4: "v4-32"}[hosts]
        if self.where == "local":
            line = f"%tpu_launch {accel} --name {self.name} {extra}"
        elif self.where == "ssh":
            specs = ",".join(f"{a}:{self.sshd['port']}" for a in self.sshd["addresses"][:hosts])
            line = (f"%tpu_connect {specs} --key {self.sshd['key']} --name {self.name} --accelerator {accel} "
                    f"--python {sys.executable} --env {env} {extra}")
        else:
            # the bare image's own Python runs the agent (no fault case needs JAX): --no-setup
            line = f"%tpu_launch {accel} --name {self.name} --no-setup {extra}"
        error, shown, _ = self.cell(line)
        if error is not None:
            raise RuntimeError(f"launch failed: {shown}")
        self.record()

    def start_emulator(self, **faults) -> None:
        from tpunb.sandbox import start_emulator

        url, self.emulator = start_emulator(create_seconds=0.1, delete_seconds=0.05, queue_seconds=0.05,
                                            faults=faults or None, **self.sshd["emulator"])
        os.environ.update(TPUNB_TPU_API_ENDPOINT=url, GOOGLE_CLOUD_PROJECT="proj",
                          CLOUDSDK_COMPUTE_ZONE="us-central2-b", TPUNB_WATCH_INTERVAL="0.2")

    @property
    def slice(self):
        from tpunb import manager

        return manager.current(self.name)

    def agent_pid(self, host: int) -> int:
        return int(self.slice.session.hosts[host].info["pid"])

    def record(self) -> None:
        """Append the agents' session ids (each agent leads its own session) for the leak count.
        A record that fails, or finds a host without a pid, is kept as a failure of the case:
        otherwise "0 leaked" would be said of agents nobody looked for."""
        path = self.home / "sessions.json"
        known = set(json.loads(path.read_text())) if path.exists() else set()
        try:
            hosts = self.slice.session.hosts
            pids = {int(h.info["pid"]) for h in hosts}
        except Exception as exc:
            self.record_failures.append(f"{type(exc).__name__}: {exc}")
            return
        known |= pids
        path.write_text(json.dumps(sorted(known)))

    def freeze(self, pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        self.frozen = getattr(self, "frozen", []) + [pid]

    def thaw(self) -> None:
        for pid in getattr(self, "frozen", []):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def nodes(self) -> int:
        return len(self.emulator.state()["nodes"]) if self.emulator else 0

    def down(self) -> None:
        self.thaw()
        self.cell(f"%tpu_down {self.name}")


def pid_line(kernel: subprocess.Popen) -> list[str]:
    """The agents' pids a kernel script prints once its launch is done (the launch's own lines
    come first; reading only the first line raced the launch). Empty if the script ended."""
    for line in kernel.stdout:
        words = line.split()
        if words and all(w.isdigit() for w in words):
            return words
    return []


def ours_in(shown: str) -> bool:
    """A traceback frame from tpunb's or paramiko's own code in what the user reads."""
    return any(marker in shown for marker in ("/tpunb/", "site-packages/paramiko", "Traceback (most recent"))


def one_line_error(error, shown: str, names: str = "") -> bool:
    from tpunb.errors import TpunbError

    return isinstance(error, TpunbError) and not ours_in(shown) and (names in str(error))


def frames_of(error: BaseException) -> list[str]:
    """file:function of each frame the error passed through, outermost first."""
    tb, frames = error.__traceback__, []
    while tb is not None:
        frames.append(f"{tb.tb_frame.f_code.co_filename}:{tb.tb_frame.f_code.co_name}")
        tb = tb.tb_next
    return frames


def raised_in_tpunb(error: BaseException) -> bool:
    """A frame of tpunb's own code was running when it was raised (else IPython's, before the magic)."""
    return any(f"{os.sep}tpunb{os.sep}" in frame for frame in frames_of(error))


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def sshd_session_of(pid: int) -> int:
    """The sshd process serving the connection an agent runs under (its nearest sshd ancestor)."""
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        pid = int(fields[1])
        if Path(f"/proc/{pid}/comm").read_text().strip().startswith("sshd"):
            return pid
    raise RuntimeError("no sshd ancestor")


# -- liveness ---------------------------------------------------------------------------------
@case("agent killed (SIGKILL) between cells")
def killed_agent(h: Harness) -> Outcome:
    h.launch()
    h.cell("%%on_tpu\nx = 1")
    os.kill(h.agent_pid(1), signal.SIGKILL)
    error, shown, seconds = h.cell("%%on_tpu\n1")
    h.record()
    kept_error, kept, _ = h.cell("%%on_tpu --hosts 0\nx")
    said = (error is None and "host 1 had died" in shown) or one_line_error(error, shown, "host 1")
    return Outcome("", "", said and not ours_in(shown), seconds,
                   "yes" if kept_error is None and "1" in kept else "no")


@case("agent frozen (SIGSTOP) between cells", fast=False)
def frozen_between(h: Harness) -> Outcome:
    h.launch()
    h.cell("%%on_tpu\nx = 1")
    h.freeze(h.agent_pid(1))
    error, shown, seconds = h.cell("%%on_tpu\nx")
    h.record()
    kept_error, kept, _ = h.cell("%%on_tpu --hosts 0\nx")
    return Outcome("", "", one_line_error(error, shown, "host 1") and seconds < 15, seconds,
                   "yes" if kept_error is None and "1" in kept else "no", note=str(error)[:80])


@case("agent frozen (SIGSTOP) during a cell", fast=False)
def frozen_during(h: Harness) -> Outcome:
    h.launch()
    h.cell("%%on_tpu\nx = 1")
    pid = h.agent_pid(1)
    threading.Timer(1.0, h.freeze, (pid,)).start()
    error, shown, seconds = h.cell("%%on_tpu\nimport time\nfor _ in range(300):\n    time.sleep(0.1)")
    h.record()
    kept_error, kept, _ = h.cell("%%on_tpu --hosts 0\nx")
    return Outcome("", "", one_line_error(error, shown, "host 1") and seconds < 16, seconds,
                   "yes" if kept_error is None and "1" in kept else "no", note=str(error)[:80])


@case("sshd session frozen (SIGSTOP) during a cell", where=("ssh",), fast=False)
def frozen_sshd(h: Harness) -> Outcome:
    h.launch()
    h.cell("%%on_tpu\nx = 1")
    session = sshd_session_of(h.agent_pid(1))
    threading.Timer(1.0, h.freeze, (session,)).start()
    error, shown, seconds = h.cell("%%on_tpu\nimport time\nfor _ in range(300):\n    time.sleep(0.1)")
    h.record()
    return Outcome("", "", one_line_error(error, shown, "host 1") and seconds < 16, seconds, note=str(error)[:80])


@case("Ctrl-C pressed 3 times on a frozen host")
def ctrl_c_frozen(h: Harness) -> Outcome:
    h.launch()
    h.freeze(h.agent_pid(1))

    def press():
        for _ in range(3):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.3)  # a user pressing again and again

    threading.Timer(0.5, press).start()
    error, shown, seconds = h.cell("%%on_tpu\nimport time\ntime.sleep(60)")
    h.record()
    return Outcome("", "", error is not None and not ours_in(shown) and seconds < 12, seconds, note=str(error)[:80])


@case("--timeout 3 with a frozen host", fast=False)
def timeout_frozen(h: Harness) -> Outcome:
    h.launch()
    h.freeze(h.agent_pid(1))
    error, shown, seconds = h.cell("%%on_tpu --timeout 3\nimport time\ntime.sleep(60)")
    h.record()
    return Outcome("", "", one_line_error(error, shown, "host 1") and seconds < 12, seconds, note=str(error)[:80])


@case("interrupt (SIGINT) of a running cell")
def interrupt(h: Harness) -> Outcome:
    h.launch()
    h.cell("%%on_tpu\nx = 1")
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    error, shown, seconds = h.cell("%%on_tpu\nimport time\ntime.sleep(60)")
    kept_error, kept, _ = h.cell("%%on_tpu\nx")
    return Outcome("", "", one_line_error(error, shown) and seconds < 3, seconds,
                   "yes" if kept_error is None and "1" in kept else "no")


@case("cell ignoring SIGINT is escalated (SIGTERM, SIGKILL)", fast=False)
def escalation(h: Harness) -> Outcome:
    h.launch()
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    error, shown, seconds = h.cell("%%on_tpu\nimport signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                   "time.sleep(60)")
    h.record()
    after, _, _ = h.cell("%%on_tpu\n1")
    h.record()
    return Outcome("", "", one_line_error(error, shown, "killed") and seconds < 12 and after is None, seconds)


# -- cleanup ----------------------------------------------------------------------------------
@case("process a cell started, after its agent is killed")
def orphan_after_kill(h: Harness) -> Outcome:
    h.launch()
    error, shown, _ = h.cell("%%on_tpu\nimport subprocess\nchild = subprocess.Popen(['sleep', '1000'])\nchild.pid")
    pids = [int(x) for x in __import__("re").findall(r"Out\[\d\]: (\d+)", shown)]
    os.kill(h.agent_pid(1), signal.SIGKILL)
    started = time.perf_counter()
    gone = wait_until(lambda: not pid_alive(pids[1]), 10)
    return Outcome("", "", gone, time.perf_counter() - started, note=f"child pids {pids}")


@case("process a cell started, after %tpu_down")
def orphan_after_down(h: Harness) -> Outcome:
    h.launch()
    h.cell("%%on_tpu\nimport subprocess, os\nchild = subprocess.Popen(['sleep', '1000'], start_new_session=False)")
    started = time.perf_counter()
    h.down()
    return Outcome("", "", True, time.perf_counter() - started)  # the leak count decides


@case("kernel killed while a host is frozen", where=("local",))
def kernel_dies_frozen(h: Harness) -> Outcome:
    script = (f"import os, sys, signal\nfrom IPython.testing.globalipapp import start_ipython\nip = start_ipython()\n"
              f"ip.run_cell('%load_ext tpunb')\nip.run_cell('%tpu_launch v4-16 --name orphaned')\n"
              f"from tpunb import manager\nsl = manager.current()\n"
              f"print(' '.join(str(h.info['pid']) for h in sl.session.hosts), flush=True)\nsys.stdin.read()")
    kernel = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in pid_line(kernel)]
    path = h.home / "sessions.json"
    path.write_text(json.dumps(pids))
    os.kill(pids[1], signal.SIGSTOP)
    kernel.kill()
    kernel.wait()
    started = time.perf_counter()
    gone = wait_until(lambda: not any(pid_alive(p) for p in pids), 15)
    return Outcome("", "", gone, time.perf_counter() - started)


@case("owner pid reused by another process", where=("local",))
def owner_pid_reused(h: Harness) -> Outcome:
    from tpunb import manager
    from tpunb.registry import Registry

    h.launch()
    manager.detach_all()  # this kernel lets go of the slice, as a restarted kernel would have
    reg = Registry()
    record = reg.get_slice(h.name)
    record.owner_pid = os.getppid()  # alive, but a different process from the kernel that launched it
    reg.save_slice(record)
    error, shown, seconds = h.cell(f"%tpu_use {h.name}")
    h.record()
    return Outcome("", "", error is None and not ours_in(shown), seconds, note=str(error or "")[:80])


@case("a dead host revived from two threads at once")
def revive_race(h: Harness) -> Outcome:
    h.launch()
    sl = h.slice
    os.kill(h.agent_pid(1), signal.SIGKILL)
    wait_until(lambda: sl.session.dead_hosts() == [1], 10)
    errors: list[Exception] = []

    def revive() -> None:
        try:
            sl.revive()
        except Exception as exc:  # reported in the note
            errors.append(exc)

    started = time.perf_counter()
    threads = [threading.Thread(target=revive) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    seconds = time.perf_counter() - started
    h.record()
    error, shown, _ = h.cell("%%on_tpu\n1")
    ok = not errors and error is None and all(host.alive for host in sl.session.hosts)
    return Outcome("", "", ok and seconds < 10, seconds, note="; ".join(str(e) for e in errors)[:120])


@case("%tpu_down --all with a slice another kernel owns", where=("local",))
def down_all_other_owner(h: Harness) -> Outcome:
    script = ("import sys\nfrom IPython.testing.globalipapp import start_ipython\nip = start_ipython()\n"
              "ip.run_cell('%load_ext tpunb')\nip.run_cell('%tpu_launch v4-8 --name theirs')\n"
              "from tpunb import manager\n"
              "print(' '.join(str(h.info['pid']) for h in manager.current().session.hosts), flush=True)\n"
              "sys.stdin.read()")
    other = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if not pid_line(other):
        return Outcome("", "", False, note="the other kernel's launch failed")
    h.launch(1)
    h.name = "mine2"
    h.launch(1)
    error, shown, seconds = h.cell("%tpu_down --all")
    from tpunb.registry import Registry

    left = sorted(r.name for r in Registry().list_slices())
    other.stdin.close()
    other.wait(30)
    h.cell("%tpu_down --all")
    return Outcome("", "", left == ["theirs"] and "theirs" in str(error) and not ours_in(shown), seconds,
                   note=f"left {left}")


# -- output -----------------------------------------------------------------------------------
@case("a value whose repr is 200 MB", where=("local",))
def huge_repr(h: Harness) -> Outcome:
    h.launch()
    h.cell("%%on_tpu\nx = 1")
    error, shown, seconds = h.cell("%%on_tpu\nbytes(200_000_000)")
    after, kept, _ = h.cell("%%on_tpu\nx")
    return Outcome("", "", after is None and len(shown) < 2_000_000, seconds,
                   "yes" if after is None and "1" in kept else "no", note=f"{len(shown):,} characters shown")


@case("one 20 MB line", where=("local",))
def long_line(h: Harness) -> Outcome:
    h.launch(1)
    error, shown, seconds = h.cell("%%on_tpu\nprint('x' * 20_000_000)")
    return Outcome("", "", error is None and len(shown) < 2_000_000 and seconds < 5, seconds,
                   note=f"{len(shown):,} characters shown")


@case("a \\r progress bar of 20,000 updates", where=("local",))
def carriage_returns(h: Harness) -> Outcome:
    h.launch(1)
    error, shown, seconds = h.cell("%%on_tpu\nimport sys\nfor i in range(20_000):\n"
                                   "    sys.stdout.write(f'\\rstep {i}')\nprint()")
    return Outcome("", "", error is None and "step 19999" in shown and len(shown) < 2_000_000, seconds,
                   note=f"{len(shown):,} characters shown")


@case("2 hosts x 1,000,000 differing lines", where=("local",), fast=False)
def output_volume(h: Harness) -> Outcome:
    import resource

    h.launch()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    error, shown, seconds = h.cell("%%on_tpu\nfor i in range(1_000_000):\n    print(i, 'x' * 20)")
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    return Outcome("", "", error is None and seconds < 5 and grown < 200, seconds,
                   note=f"kernel peak RSS +{grown:.0f} MB")


# -- bad input, secrets, keys -----------------------------------------------------------------
BAD_INPUTS = ["%tpu_launch v4-17", "%tpu_launch", "%tpu_connect host:abc", "%tpu_use nowhere",
              "%%on_tpu --timeout nan\n1", "%%on_tpu --hosts 7\n1", "%%on_tpu --bogus\n1", "%tpu_sync /nonexistent",
              "import threading\nlock = threading.Lock()\n%tpu_push lock", "%tpu_push undefined_name",
              "%tpu_pull nothing_there", "%tpu_profile sideways", "%tpu_metrics --interval x", "%tpu_status extra"]


@case("bad input to every magic", where=("local",))
def bad_inputs(h: Harness) -> Outcome:
    h.launch()
    raw = []
    started = time.perf_counter()
    for line in BAD_INPUTS:
        error, shown, _ = h.cell(line)
        if error is None or ours_in(shown) or "\n" in str(error).strip():
            raw.append(line.splitlines()[-1])
    return Outcome("", "", not raw, time.perf_counter() - started,
                   note=f"{len(BAD_INPUTS) - len(raw)}/{len(BAD_INPUTS)} one-line" + (f"; raw: {raw}" if raw else ""))


@case("a secret passed with --env", where=("local", "ssh"))
def secrets(h: Harness) -> Outcome:
    secret = "s3cr3t-" + os.urandom(6).hex()
    h.launch(extra=f"--env API_TOKEN={secret}")
    error, shown, _ = h.cell("%%on_tpu\nimport os\nprint(len(os.environ['API_TOKEN']))")
    places = [p for p in h.home.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    cmdlines = [p for p in Path("/proc").glob("[0-9]*/cmdline") if _reads(p, secret)]
    return Outcome("", "", error is None and secret not in shown and not places and not cmdlines,
                   note=f"found in {len(places)} files, {len(cmdlines)} command lines")


def _reads(path: Path, text: str) -> bool:
    try:
        return text.encode() in path.read_bytes()
    except OSError:
        return False


@case("the host key changed", where=("ssh",))
def host_key_changed(h: Harness) -> Outcome:
    from tpunb.registry import Registry

    h.launch()
    h.down()
    reg = Registry()
    address, port = h.sshd["addresses"][0], h.sshd["port"]
    reg.set_host_key(address, port, "ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIOtherKeyOtherKeyOtherKeyOtherKeyOtherKe")
    h.name = "again"
    specs = ",".join(f"{a}:{port}" for a in h.sshd["addresses"][:2])
    error, shown, seconds = h.cell(f"%tpu_connect {specs} --key {h.sshd['key']} --name again "
                                   f"--python {sys.executable}")
    return Outcome("", "", one_line_error(error, shown, "host key") and "accept-new-host-key" in str(error), seconds)


# -- the cloud (emulator) ---------------------------------------------------------------------
@case("quota, stockout and permission errors", where=("cloud",))
def cloud_errors(h: Harness) -> Outcome:
    raw = []
    started = time.perf_counter()
    for faults in ({"quota": "operation"}, {"no_capacity": ["us-central2-b"]}, {"permission_denied": True}):
        h.start_emulator(**faults)
        error, shown, _ = h.cell(f"%tpu_launch v4-16 --name {h.name} --no-setup")
        if not one_line_error(error, shown) or h.nodes():
            raw.append(next(iter(faults)))
        h.emulator.stop()
        h.emulator = None
    return Outcome("", "", not raw, time.perf_counter() - started, leaked=0, note=f"failed: {raw}" if raw else "")


@case("Ctrl-C during a cloud launch", where=("cloud",))
def cloud_interrupt(h: Harness) -> Outcome:
    h.start_emulator(slow_create=60)

    def press_once_the_node_exists() -> None:  # Ctrl-C while the node is being created
        if wait_until(lambda: h.nodes() == 1, 60):
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press_once_the_node_exists, daemon=True).start()
    error, shown, seconds = h.cell(f"%tpu_launch v4-16 --name {h.name} --no-setup")
    gone = wait_until(lambda: h.nodes() == 0, 10)
    return Outcome("", "", one_line_error(error, shown, "nothing is left running") and gone, seconds,
                   leaked=h.nodes(), note=f"{type(error).__name__}: {error}"[:120])


@case("Ctrl-C at any moment of a launch", where=("local", "cloud"))
def launch_interrupted_anywhere(h: Harness) -> Outcome:
    from tpunb.registry import Registry

    if h.where == "cloud":
        h.start_emulator()
    raw, started = [], time.perf_counter()
    for delay in (0.05, 0.15, 0.3, 0.6):  # before the cloud call, during it, while hosts start
        name = f"cut{int(delay * 100)}"
        launching, pressing = threading.Event(), threading.Lock()
        launching.set()

        def press() -> None:  # only while the launch runs: a press after it ended is another case
            with pressing:
                if launching.is_set():
                    os.kill(os.getpid(), signal.SIGINT)

        timer = threading.Timer(delay, press)
        timer.start()
        python = " --no-setup" if h.where == "cloud" else ""
        try:
            try:
                error, shown, _ = h.cell(f"%tpu_launch v4-16 --name {name}{python}")
            finally:
                with pressing:  # after this, no press is on its way
                    launching.clear()
                timer.cancel()
        except KeyboardInterrupt:  # pressed as the launch returned: it won the race
            error = None
        if error is None:  # the launch won the race: end it, the case is about interrupted ones
            h.cell(f"%tpu_down {name}")
        elif isinstance(error, KeyboardInterrupt) and not raised_in_tpunb(error):
            pass  # pressed in IPython's own code before the magic ran (a loaded machine): leaks still checked
        elif not one_line_error(error, shown, "interrupted"):
            where = frames_of(error)[-1:] if isinstance(error, KeyboardInterrupt) else []
            raw.append(f"{delay} s: {type(error).__name__}: {error} {' '.join(where)}".rstrip())
            if os.environ.get("TPUNB_FAULT_DEBUG"):
                print(shown, file=sys.stderr)
        wait_until(lambda: h.nodes() == 0, 10)
    records = [r.name for r in Registry().list_slices()]
    return Outcome("", "", not raw and not records, time.perf_counter() - started, leaked=h.nodes(),
                   note=("; ".join(raw) + (f" records left: {records}" if records else ""))[:120])


@case("spot slice preempted", where=("cloud",))
def cloud_preempted(h: Harness) -> Outcome:
    h.start_emulator()
    h.launch(extra="--spot")
    h.emulator.preempt(h.name)
    started = time.perf_counter()
    error, shown, _ = h.cell("%%on_tpu\n1")
    while error is None and time.perf_counter() - started < 10:
        error, shown, _ = h.cell("%%on_tpu\n1")
    seconds = time.perf_counter() - started
    h.down()
    return Outcome("", "", one_line_error(error, shown, "PREEMPTED"), seconds, leaked=h.nodes())


def kernel_process(lines: list[str]) -> subprocess.Popen:
    """A kernel in a process of its own running these cells; it prints 'cell done' after each."""
    code = ("import sys\nfrom IPython.testing.globalipapp import start_ipython\nip = start_ipython()\n"
            "ip.run_cell('%load_ext tpunb')\nfor line in sys.argv[1:]:\n    r = ip.run_cell(line)\n"
            "    print('cell done', r.error_in_exec, flush=True)\nsys.stdin.read()")
    return subprocess.Popen([sys.executable, "-c", code, *lines], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def node_gone_after_kill(h: Harness, kernel: subprocess.Popen, bound: float) -> tuple[bool, float]:
    kernel.kill()
    kernel.wait()
    killed = time.perf_counter()
    gone = wait_until(lambda: h.nodes() == 0, bound)
    return gone, time.perf_counter() - killed


@case("kernel killed after a cloud launch (--idle-delete 3s)", where=("cloud",), fast=False)
def cloud_kernel_killed(h: Harness) -> Outcome:
    h.start_emulator()
    kernel = kernel_process(["%tpu_launch v4-16 --name idle --idle-delete 3s --no-setup"])
    line = kernel.stdout.readline()
    while line and not line.startswith("cell done"):
        line = kernel.stdout.readline()
    if "cell done None" not in line:
        return Outcome("", "", False, note=f"launch failed: {line.strip()}")
    gone, seconds = node_gone_after_kill(h, kernel, 30)
    return Outcome("", "", gone and seconds < 15, seconds, leaked=h.nodes(), note="seconds: kill to node deleted")


@case("kernel killed mid-launch (--idle-delete 2s)", where=("cloud",), fast=False)
def cloud_kernel_killed_mid_launch(h: Harness) -> Outcome:
    h.start_emulator(slow_create=1.0)
    kernel = kernel_process([f"import tpunb; tpunb.launch('v4-16', name='halfway', idle_delete='2s', connect_wait=4, "
                             "no_setup=True)"])
    wait_until(lambda: h.nodes() == 1, 30)
    gone, seconds = node_gone_after_kill(h, kernel, 40)
    return Outcome("", "", gone and seconds < 20, seconds, leaked=h.nodes(),
                   note="seconds: kill to node deleted (boot grace 4 s + idle 2 s)")


# -- running cases ----------------------------------------------------------------------------
def run_in_child(args) -> None:
    """``--run NAME --where W``: one case in this process; prints its Outcome as JSON."""
    chosen = next(c for c in CASES if c.run.__name__ == args.run)
    faulthandler.dump_traceback_later(HARD_BOUND - 5, exit=False)  # a hang shows where every thread stood
    home = Path(args.home)
    os.environ["TPUNB_HOME"] = str(home)
    os.environ["CLOUDSDK_CONFIG"] = str(home / "gcloud")
    for key in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "TPUNB_TPU_API_ENDPOINT"):
        os.environ.pop(key, None)
    harness = Harness(args.where, home, json.loads(os.environ.get("TPUNB_FAULT_SSHD", "{}")))
    try:
        outcome = chosen.run(harness)
    except BaseException as exc:  # the case itself broke (a stray Ctrl-C too): a failure, with what broke it
        outcome = Outcome("", "", False, note=f"{type(exc).__name__}: {exc}"[:160])
    finally:
        harness.thaw()
    try:
        from tpunb import manager

        manager.down(all=True)
    except Exception:
        pass
    account(outcome, harness)
    print("OUTCOME " + json.dumps(asdict(outcome)), flush=True)
    os._exit(0)


def account(outcome: Outcome, harness: Harness) -> Outcome:
    """What the case left that the harness can see: nodes still in the emulator, and agents whose
    pids were not recorded (then nobody can say none leaked: the case fails)."""
    if harness.emulator is not None:
        outcome.leaked = (outcome.leaked or 0) + harness.nodes()
    if harness.record_failures:
        outcome.survived = False
        outcome.note = f"agent pids not recorded ({harness.record_failures[0]}); {outcome.note}"[:160]
    return outcome


def sessions_left(home: Path) -> int:
    """Processes still alive in the session of any agent the case started."""
    path = home / "sessions.json"
    sids = set(json.loads(path.read_text())) if path.exists() else set()
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) in sids and fields[0] != "Z":
            count += 1
    return count


def run_case(chosen: Case, where: str, sshd_info: dict) -> Outcome:
    home = Path(tempfile.mkdtemp(prefix="tpunb-fault-"))
    env = {**os.environ, "TPUNB_FAULT_SSHD": json.dumps(sshd_info), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, __file__, "--run", chosen.run.__name__, "--where", where, "--home", str(home)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
    try:
        out, err = child.communicate(timeout=HARD_BOUND)
        line = next((l for l in out.splitlines() if l.startswith("OUTCOME ")), None)
        outcome = Outcome(**json.loads(line[8:])) if line else Outcome("", "", False, note=(err or out)[-160:])
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        _, err = child.communicate()
        print(f"{chosen.name} ({where}) hung; where its threads stood:\n{err[-20000:]}", file=sys.stderr)
        outcome = Outcome("", "", False, note=f"hung: no answer within {HARD_BOUND:.0f} s")
    deadline = time.monotonic() + 5
    while sessions_left(home) and time.monotonic() < deadline:
        time.sleep(0.1)
    outcome.leaked = (outcome.leaked or 0) + sessions_left(home)
    outcome.fault, outcome.where = chosen.name, where
    outcome.survived = outcome.survived and outcome.leaked == 0
    return outcome


def table(outcomes: list[Outcome]) -> str:
    rows = ["| fault | where | survived | seconds to error | state kept | leaked | note |", "|---|---|---|---|---|---|---|"]
    for o in outcomes:
        seconds = "" if o.seconds is None else f"{o.seconds:.2f}"
        rows.append(f"| {o.fault} | {o.where} | {'yes' if o.survived else 'NO'} | {seconds} | {o.state_kept} | "
                    f"{o.leaked} | {o.note.replace('|', '/')} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="only the cases the test command runs")
    parser.add_argument("--only", default=None, help="cases whose name contains this")
    parser.add_argument("--where", default=None, help="local, ssh or cloud only")
    parser.add_argument("--json", default=None, help="also write the outcomes here")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--home", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_in_child(args)
        return 0
    from tpunb.sandbox.hosts.sshd import Sshd, write_ed25519

    chosen = [(c, w) for c in CASES for w in c.where
              if (not args.fast or c.fast) and (not args.only or args.only in c.name or args.only in c.run.__name__)
              and (not args.where or w == args.where)]
    work = Path(tempfile.mkdtemp(prefix="tpunb-faults-"))
    sshd = Sshd(hosts=4, directory=work / "sshd")
    key = work / "id_ed25519"
    sshd.authorize(write_ed25519(key))
    info = {"addresses": sshd.addresses, "port": sshd.port, "key": str(key), "emulator": sshd.emulator_options()}
    outcomes = []
    try:
        for c, where in chosen:
            outcome = run_case(c, where, info)
            print(f"{'ok  ' if outcome.survived else 'FAIL'} {c.name} [{where}] "
                  f"{'' if outcome.seconds is None else f'{outcome.seconds:.2f} s'} {outcome.note}", flush=True)
            outcomes.append(outcome)
    finally:
        sshd.close()
    print()
    print(table(outcomes))
    survived = sum(o.survived for o in outcomes)
    print(f"\n{survived} of {len(outcomes)} survived; leaked {sum(o.leaked or 0 for o in outcomes)}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return 0 if survived == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
