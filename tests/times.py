"""A pytest plugin that keeps how long each test took (set-up, call and tear-down together), for
scripts/test's list of the slowest tests over every phase: ``-p tests.times`` with
``TPUNB_TEST_TIMES=FILE`` (lines appended: phase, seconds, test) and ``TPUNB_TEST_PHASE=NAME``."""
from __future__ import annotations

import os
from collections import defaultdict

_seconds: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report) -> None:
    _seconds[report.nodeid] += report.duration


def pytest_sessionfinish(session) -> None:
    path = os.environ.get("TPUNB_TEST_TIMES")
    if not path or hasattr(session.config, "workerinput"):  # a pytest-xdist worker: its controller reports
        return
    phase = os.environ.get("TPUNB_TEST_PHASE", "pytest")
    with open(path, "a", encoding="utf-8") as out:
        for nodeid, seconds in _seconds.items():
            out.write(f"{phase}\t{seconds:.2f}\t{nodeid}\n")
