"""Shared fixtures: an isolated $TPUNB_HOME, a real IPython shell with tpunb loaded, slices."""
from __future__ import annotations

import _thread
import dataclasses
import os
import platform
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest
from IPython.utils.capture import capture_output

from tpunb import manager
from tpunb.engine import connection
from tpunb.engine.masking import Masker
from tests import markers, warm
from tests.emulator_fixture import tpu_emulator, tpu_emulator_options  # noqa: F401 - fixtures
from tests.sshd import Sshd, alive, host_key_restored, hosts, ssh_key, sshd, transports  # noqa: F401 - fixtures

ACCELERATOR_FOR_HOSTS = {1: "v4-8", 2: "v4-16", 4: "v4-32"}
#: on SSH test hosts (this machine's CPUs), what makes JAX look like one v4 host: 4 devices
CPU_AS_TPU_HOST = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}


SUITE_ENVIRONMENT = markers.SUITE_ENVIRONMENT


def pytest_configure(config) -> None:
    """Ctrl-C as a kernel gets it. A shell without job control starts background commands with
    SIGINT ignored, and Python then installs no KeyboardInterrupt handler: every interrupt test
    would fail for the way the suite was started (it did, for a CI run started that way here)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for name, meaning in markers.MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")
    config.addinivalue_line("markers", "xdist_group(name): pytest-xdist's group (tests/markers.py), known where it is not installed")
    os.environ.update(SUITE_ENVIRONMENT)
    if "TPUNB_HOME" not in os.environ:  # what runs between tests (session fixtures' ends) stays off ~/.tpunb too
        home = tempfile.mkdtemp(prefix="tpunb-suite-")
        os.environ.update(TPUNB_HOME=home, CLOUDSDK_CONFIG=os.path.join(home, "gcloud"))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    """Markers given by what a test is, and pytest-xdist's groups (tests/markers.py).
    ``TPUNB_TEST_REVERSE=1`` runs the tests in reverse order (warm slices must not care)."""
    for item in items:
        for marker in markers.given_markers(item):
            item.add_marker(marker)
        item.add_marker(pytest.mark.xdist_group(markers.xdist_group(item)))
    config.stash[markers.COLLECTED] = markers.collected(items)  # before -m deselects any
    if os.environ.get("TPUNB_TEST_REVERSE") == "1":
        items.reverse()


@pytest.fixture(scope="session")
def warm_pool(tmp_path_factory):
    """The session's warm slices (tests/warm.py)."""
    pool = warm.Pool(tmp_path_factory.mktemp("warm"))
    yield pool
    pool.close()


@pytest.fixture(autouse=True)
def markers_are_true(request, warm_pool):
    """Fails a test that did what needs a marker it lacks (tests/markers.py): its hosts loaded
    JAX, it drove a browser, reached sshd or an emulator, or started a slice of its own; or a host
    of its was judged frozen by the suite's heartbeat limit, which it did not set."""
    with pytest.MonkeyPatch.context() as patch:
        watch = markers.Watch(request.node, patch, warm_pool)
        judged = _watch_heartbeats(patch)
        yield
    complaint = watch.complaint(request.node.name)
    if complaint:
        pytest.fail(complaint)
    if judged:
        pytest.fail(f"host(s) {judged} were judged frozen after the suite's {SUITE_ENVIRONMENT['TPUNB_HEARTBEAT_TIMEOUT']} s "
                    "heartbeat limit: set the limit this test relies on (sl.heartbeat_timeout = ...)")


def _watch_heartbeats(patch: pytest.MonkeyPatch) -> list[int]:
    """The hosts the liveness watch ended under the suite's own heartbeat limit (filled as it happens)."""
    from tpunb.engine.session import Session

    judged: list[int] = []
    check = Session.check_liveness

    def watched(session, now=None):
        ended = check(session, now)
        if ended and session.heartbeat_timeout == float(SUITE_ENVIRONMENT["TPUNB_HEARTBEAT_TIMEOUT"]):
            judged.extend(ended)
        return ended

    patch.setattr(Session, "check_liveness", watched)
    return judged


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory, monkeypatch):
    """Tests never read or write the user's ~/.tpunb, gcloud or ssh configuration."""
    home = tmp_path_factory.mktemp("tpunb-home")
    monkeypatch.setenv("TPUNB_HOME", str(home))
    for var in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "CLOUDSDK_COMPUTE_ZONE", "TPUNB_TPU_API_ENDPOINT",
                "TPUNB_COMPUTE_API_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(home / "gcloud"))
    yield home
    for sl in list(manager.MANAGER.attached.values()):  # services outlive kernels: not the next test
        if not sl.session.closed:
            sl.serving.stop_all()
    manager.detach_all()
    manager.MANAGER.secrets.clear()  # a kernel's secrets (%tpu_secret) are not the next test's
    manager.MANAGER.named.forget()
    manager.MANAGER.masker = Masker()


@pytest.fixture
def jp_asyncio_loop():
    """pytest-jupyter (loaded by test_server.py) makes its event loop and server clean-up autouse for
    every test; its clean-up destroys the process-wide zmq context that kernel tests use. These no-ops
    keep both to test_server.py, which imports the real ones."""
    yield None


@pytest.fixture
def jp_server_cleanup():
    yield


@pytest.fixture
def user_defaults(monkeypatch):
    """A user's own standby and heartbeat settings, for the tests that are about them (the suite
    turns standbys off and lengthens the heartbeat limit: tests/markers.py's SUITE_ENVIRONMENT)."""
    for name in SUITE_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=["local", "ssh"])
def make_slice(request, warm_pool):
    """make_slice(hosts) -> a current slice with that many hosts, on each transport in turn:
    local host processes, and real OpenSSH sshd hosts on loopback addresses. The SSH hosts speak
    JSON frames, as hosts on another Python do (tests of tpunb.connect cover marshal over SSH).

    A warm slice (tests/warm.py), shared with other tests and reset between them, unless the test
    is marked ``fresh_slice``: then a slice of its own each call, named ``name`` if given, and
    ``make_slice.line(hosts, name)`` is the magic that makes the same slice (tests of the magics)."""
    fresh = request.node.get_closest_marker("fresh_slice") is not None
    jax = request.node.get_closest_marker("jax") is not None
    if request.param == "ssh":
        request.getfixturevalue("monkeypatch").setattr(connection, "MARSHAL_FRAMES", False)
        server, key = request.getfixturevalue("sshd"), request.getfixturevalue("ssh_key")

    def launch(count: int, name: str | None):
        if request.param == "local":
            return manager.launch(ACCELERATOR_FOR_HOSTS[count], name=name)
        addresses = [f"{a}:{server.port}" for a in server.addresses[:count]]
        return manager.connect(addresses, key=str(key), python=server.python, name=name,
                               accelerator=ACCELERATOR_FOR_HOSTS[count], env=CPU_AS_TPU_HOST)

    lent: list[warm.Key] = []

    def make(count: int = 2, name: str | None = None):
        if fresh:
            return launch(count, name)
        if name is not None or lent:
            raise AssertionError("a warm slice has its own name and is one per test: mark the test "
                                 "@pytest.mark.fresh_slice to make slices of its own")
        if "user_defaults" in request.fixturenames:  # a warm slice was made under the suite's settings
            raise AssertionError("a test of a user's defaults needs a slice made under them: mark it "
                                 "@pytest.mark.fresh_slice")
        key = warm.Key(request.param, count, jax)
        sl = warm_pool.borrow(key, lambda: launch(count, f"warm-{key.folder}-{os.urandom(2).hex()}"))
        lent.append(key)
        return sl

    def line(count: int = 2, name: str | None = None) -> str:
        assert fresh, "make_slice.line makes a slice of the test's own: mark it @pytest.mark.fresh_slice"
        if request.param == "local":
            return f"%tpu_launch {ACCELERATOR_FOR_HOSTS[count]}" + (f" --name {name}" if name else "")
        addresses = ",".join(f"{a}:{server.port}" for a in server.addresses[:count])
        env = " ".join(f"{k}={v}" for k, v in CPU_AS_TPU_HOST.items())
        return (f"%tpu_connect {addresses} --key {key} --python {server.python} "
                f"--accelerator {ACCELERATOR_FOR_HOSTS[count]} --env {env}" + (f" --name {name}" if name else ""))

    make.line = line
    yield make
    ends = request.node.get_closest_marker("ends_services") is not None
    for key in lent:
        left = warm_pool.give_back(key, ends)
        if left:
            pytest.fail(f"{request.node.name} left state on the shared (warm) slice: {'; '.join(left)}; clean up, "
                        "or mark it @pytest.mark.fresh_slice (the slice was replaced)")


@pytest.fixture(scope="session")
def ip():
    """A real IPython InteractiveShell with %load_ext tpunb, as a notebook kernel has."""
    from IPython.testing.globalipapp import get_ipython

    shell = get_ipython()  # the process-wide test shell, whoever started it first
    shell.run_cell("%load_ext tpunb")
    return shell


@dataclasses.dataclass
class CellRun:
    """What a cell printed and displayed, and the exception it ended with (if any)."""

    result: object
    stdout: str
    stderr: str
    outputs: list
    seconds: float

    @property
    def error(self):
        return self.result.error_in_exec or self.result.error_before_exec

    @property
    def shown(self) -> str:
        """Everything a notebook user would read: streams, displays' text, and the traceback."""
        texts = [o.data.get("text/plain", "") for o in self.outputs]
        return "\n".join([self.stdout, self.stderr, *texts])


def run_cell(shell, code: str) -> CellRun:
    started = time.perf_counter()
    with capture_output() as captured:
        result = shell.run_cell(code)
    return CellRun(result, captured.stdout, captured.stderr, captured.outputs, time.perf_counter() - started)


@pytest.fixture
def cell(ip):
    return lambda code: run_cell(ip, code)


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    """Wait until predicate() is true: polls a condition, never sleeps a guessed amount."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        threading.Event().wait(0.01)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_for_files(directory: Path, names: list[str], timeout: float = 60.0) -> None:
    wait_for(lambda: all((directory / n).exists() for n in names), timeout, f"files {names} in {directory}")


@pytest.fixture
def patient_grouping(monkeypatch):
    """Grouped output waits for every running host's line (not 0.25 s), so a test that asserts
    exactly how lines group does not depend on how far apart a loaded machine ran the hosts.
    The 0.25 s bound itself is tested in test_display.py."""
    monkeypatch.setenv("TPUNB_GROUP_WAIT", "60")


@pytest.fixture
def flags(tmp_path):
    """A directory where host code drops marker files the test waits on."""
    d = tmp_path / "flags"
    d.mkdir()
    return d


#: the futex system call's number by machine: a thread asleep in a lock, a condition or a C-level
#: queue sits in it
FUTEX = {"x86_64": 202, "aarch64": 98}


def main_thread_asleep() -> bool:
    """Whether the main thread is asleep in a futex wait: the moment a Ctrl-C can come and wake no
    sleep. Read from /proc, never from the interpreter: CPython 3.11's ``sys._current_frames()``
    can deadlock the whole process with the GIL held (python/cpython#106883, unfixed in 3.11), and
    polling it froze a CI run until its 90 minutes ran out, pytest-timeout's signal never handled."""
    try:
        with open(f"/proc/self/task/{threading.main_thread().native_id}/syscall") as status:
            number = status.read().split()[0]
    except (OSError, IndexError):
        return False
    return number == str(FUTEX[platform.machine()])


def interrupt_main_unseen_when(condition, timeout: float = 60.0) -> dict:
    """Once condition holds, a Ctrl-C that wakes no sleep (``_thread.interrupt_main()``: the flag a
    SIGINT's C handler sets when it ran on another thread, or just before the main thread slept)."""
    sent: dict = {}

    def watch():
        wait_for(condition, timeout, "the main thread to wait")
        sent["at"] = time.perf_counter()
        _thread.interrupt_main()

    threading.Thread(target=watch, daemon=True).start()
    return sent


def interrupt_kernel_when(condition, timeout: float = 60.0) -> dict:
    """From another thread, send SIGINT to this process (what Jupyter's interrupt does) once condition holds."""
    sent: dict = {}

    def watch():
        wait_for(condition, timeout, "hosts to reach the interrupt point")
        sent["at"] = time.perf_counter()
        os.kill(os.getpid(), 2)

    threading.Thread(target=watch, daemon=True).start()
    return sent
