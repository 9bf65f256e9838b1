"""Which test files are light: their hosts never load JAX and they start no browser, so
scripts/test runs them on a second pytest-xdist worker beside the heavy ones. Every other test
and every notebook is heavy and runs on one worker, in order, as a serial run would: two heavy
files side by side on 2 cores (a first `import jax` on fresh hosts, an orbax write) starved hosts'
heartbeats. (scripts/test uses this with TPUNB_TEST_WORKERS=2; by default it runs serially.)
A file not named here is heavy, so a new file is safe until someone measures it; so
is one whose assertions time a few milliseconds (test_bench_serving.py: a TTFT within 10 ms).

conftest.py keeps the list honest at run time, in serial runs too: a light test whose hosts load
JAX or that starts a browser (in its call or any fixture set up for it) fails and says to move
its file out of here."""
from __future__ import annotations

from pathlib import Path

import pytest

LIGHT_FILES = frozenset({
    "test_agent.py",
    "test_backends.py",
    "test_background.py",
    "test_bad_input.py",
    "test_catalog.py",
    "test_catalog_compute.py",
    "test_cleanup.py",
    "test_compute_capacity.py",
    "test_compute_emulator.py",
    "test_compute_survey.py",
    "test_connect.py",
    "test_display.py",
    "test_doctor.py",
    "test_emulator.py",
    "test_fanin.py",
    "test_fanout.py",
    "test_faults.py",
    "test_fetch.py",
    "test_fetch_download.py",
    "test_fetch_hub.py",
    "test_fetch_manifest.py",
    "test_gcp_provision.py",
    "test_host_env_rules.py",
    "test_idle_delete.py",
    "test_kernel.py",
    "test_layout.py",
    "test_manager.py",
    "test_node_states.py",
    "test_on_tpu.py",
    "test_output.py",
    "test_plan.py",
    "test_programs.py",
    "test_proto_strict.py",
    "test_relay.py",
    "test_request.py",
    "test_secrets.py",
    "test_serve.py",
    "test_serve_forward.py",
    "test_serve_idle.py",
    "test_serve_kernel.py",
    "test_serve_links.py",
    "test_serve_magics.py",
    "test_serve_openssh.py",
    "test_serve_server.py",
    "test_serve_status.py",
    "test_snapshot_plan.py",
    "test_ssh_transport.py",
    "test_stacks.py",
    "test_stragglers.py",
    "test_sync.py",
    "test_units.py",
    "test_zones.py",
})

HEAVY_GROUP = "heavy"
#: where conftest.py keeps a light test's HeavyWatch
WATCH = pytest.StashKey["HeavyWatch"]()


def is_light(path: Path) -> bool:
    return path.parent.name == "tests" and path.name in LIGHT_FILES


def group_of(path: Path) -> str:
    """The pytest-xdist group (--dist loadgroup): every heavy test in one, each light file its own."""
    return f"light:{path.name}" if is_light(path) else HEAVY_GROUP


class HeavyWatch:
    """Records, while active, what makes a test heavy: a host that loads JAX (its ``jax_loading``
    event, from any transport) and a browser started: how conftest.py proves a light test did neither."""

    def __init__(self, monkeypatch) -> None:
        import subprocess

        from tpunb.session import Session

        self.seen: list[str] = []
        route_one, popen_init = Session._route_one, subprocess.Popen.__init__

        def watched_route(session, index, message, blob):
            if message.get("op") == "event" and message.get("kind") == "jax_loading":
                self.seen.append(f"host {index} loaded JAX")
            route_one(session, index, message, blob)

        def watched_popen(popen, args, *rest, **kwargs):
            if "chrom" in str(args):
                self.seen.append(f"a browser ({args!r:.80})")
            popen_init(popen, args, *rest, **kwargs)

        monkeypatch.setattr(Session, "_route_one", watched_route)
        monkeypatch.setattr(subprocess.Popen, "__init__", watched_popen)
