"""The suite's markers, what gives a test each one, and the watch that keeps them true.

- ``sandbox``: the test starts or uses an emulator, a sandbox or the real sshd (given by the
  fixtures it uses, ``SANDBOX_FIXTURES``, its ``make_slice`` over ssh, or marked by hand);
- ``jax``: its hosts load JAX (marked by hand);
- ``browser``: it drives JupyterLab in chromium (marked by hand);
- ``notebook``: a tutorial's cell under nbval (given);
- ``fault``: a fault-injection case in a kernel of its own (marked by hand);
- ``fresh_slice``: it takes (or tries to take) a slice of its own, not a warm one (tests/warm.py):
  it launches, connects, kills, freezes, deletes or restarts hosts, or changes how JAX starts (marked by hand);
- ``ends_services``: it starts services or port forwards on a warm slice, which are ended after it
  (marked by hand); any other test that leaves one fails.

``./scripts/test --fast`` leaves out ``jax``, ``browser``, ``notebook``, ``fault`` and ``sandbox``.
A marker that is missing fails the test (``Watch``): a test whose hosts loaded JAX, that drove a
browser, that reached sshd or an emulator, or that started a slice, without saying so.
"""
from __future__ import annotations

import subprocess

import pytest

MARKERS = {
    "sandbox": "starts or uses an emulator, a sandbox or the real sshd",
    "jax": "its hosts load JAX",
    "browser": "drives JupyterLab in headless chromium",
    "notebook": "a tutorial notebook's cell (nbval)",
    "fault": "a fault-injection case, in a kernel process of its own",
    "fresh_slice": "takes (or tries to take) a slice of its own instead of a warm one (tests/warm.py)",
    "ends_services": "its services and port forwards (what it tests) are ended after it, before its warm slice is checked",
}
#: what the suite's processes inherit (kernels' and notebooks' too; conftest.py and scripts/test set
#: it): no standby agents (an SSH slice would start a second agent per host once quiet; tests of
#: standbys ask for them), and a heartbeat limit that suits a loaded 2-core machine. A test that
#: relies on a host being judged frozen sets the limit it relies on (``sl.heartbeat_timeout``, or
#: the variable): conftest.py fails one that was judged by this value without saying so.
SUITE_ENVIRONMENT = {"TPUNB_STANDBY": "off", "TPUNB_HEARTBEAT_TIMEOUT": "30"}
#: what ./scripts/test --fast leaves out
SLOW = ("jax", "browser", "notebook", "fault", "sandbox")
FAST_EXPRESSION = f"not ({' or '.join(SLOW)})"
#: fixtures that start or reach the real sshd or an emulator
SANDBOX_FIXTURES = frozenset({"sshd", "ssh_key", "hosts", "transports", "tpu_emulator", "box", "cloud", "sandbox_box"})
#: the heaviest tests, which pytest-xdist keeps on one worker, in order (notebooks on one of theirs)
HEAVY = ("jax", "browser")


#: every test the session collected, before -m deselected any: (its file, whether --fast selects it)
COLLECTED = pytest.StashKey[list]()


def collected(items) -> list[tuple[str, bool]]:
    """Each item's file (relative to the repository) and whether FAST_EXPRESSION selects it: its
    markers (given ones included) name none of SLOW."""
    return [(item.nodeid.split("::")[0], not any(item.get_closest_marker(m) for m in SLOW)) for item in items]


def given_markers(item) -> list[str]:
    """The markers an item gets from what it is: a notebook's cell, or a test using the sandbox."""
    given = []
    if item.path.suffix == ".ipynb":
        given.append("notebook")
    names = set(getattr(item, "fixturenames", ()))
    params = getattr(getattr(item, "callspec", None), "params", {})
    if names & SANDBOX_FIXTURES or params.get("make_slice") == "ssh":
        given.append("sandbox")
    return [m for m in given if item.get_closest_marker(m) is None]


def xdist_group(item) -> str:
    """Its pytest-xdist group (--dist loadgroup): the notebooks in one, the JAX and browser tests in
    another (each runs in order on one worker: two of them side by side starve hosts' heartbeats),
    each other file in its own."""
    if item.get_closest_marker("notebook") is not None:
        return "notebooks"
    if any(item.get_closest_marker(m) is not None for m in HEAVY):
        return "heavy"
    return f"light:{item.path.name}"


class Watch:
    """Records, while a test runs (its fixtures' set-up included), what needs a marker it may lack."""

    def __init__(self, item, monkeypatch: pytest.MonkeyPatch, pool) -> None:
        from tpunb import manager
        from tpunb.sandbox import server
        from tpunb.sandbox.hosts import sshd
        from tpunb.engine.session import Session
        from tpunb.transport import ssh_hosts as ssh

        self.seen: dict[str, str] = {}
        marked = {m: item.get_closest_marker(m) is not None for m in MARKERS}

        def saw(marker: str, what: str) -> None:
            if not marked[marker]:
                self.seen.setdefault(marker, what)

        route_one, popen_init = Session._route_one, subprocess.Popen.__init__

        def watched_route(session, index, message, blob):
            if message.get("op") == "event" and message.get("kind") == "jax_loading":
                saw("jax", f"host {index} loaded JAX")
            route_one(session, index, message, blob)

        def watched_popen(popen, args, *rest, **kwargs):
            if "chrom" in str(args):
                saw("browser", f"it started a browser ({args!r:.60})")
            popen_init(popen, args, *rest, **kwargs)

        monkeypatch.setattr(Session, "_route_one", watched_route)
        monkeypatch.setattr(subprocess.Popen, "__init__", watched_popen)
        for owner, name, what in ((ssh.SSHTransport, "__init__", "it connected to a host over SSH"),
                                  (sshd.Sshd, "__init__", "it started an sshd"),
                                  (server._Server, "__init__", "it started an emulator")):
            monkeypatch.setattr(owner, name, self._noting(getattr(owner, name), lambda what=what: saw("sandbox", what)))
        start = manager.SliceManager.start

        def watched_start(kernel, *args, **kwargs):
            if not pool.making:
                saw("fresh_slice", "it started a slice of its own")
            return start(kernel, *args, **kwargs)

        monkeypatch.setattr(manager.SliceManager, "start", watched_start)

    @staticmethod
    def _noting(original, note):
        def noted(*args, **kwargs):
            note()
            return original(*args, **kwargs)
        return noted

    def complaint(self, name: str) -> str | None:
        """What the test did without its marker, in one line; None if nothing."""
        if not self.seen:
            return None
        said = "; ".join(f"{what} (mark it {marker})" for marker, what in self.seen.items())
        return f"{name}: {said}: add @pytest.mark.<marker> (tests/markers.py says what each means)"
