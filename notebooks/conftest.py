"""nbval's kernels group host output patiently ($TPUNB_GROUP_WAIT, as tests' patient_grouping does):
stored outputs of %%on_tpu cells are compared, and on a loaded machine hosts can print the same line
more than the usual 0.25 s apart. Set for the notebooks only: nbval starts a notebook's kernel in its
first cell's setup, and the kernel keeps the environment it started with."""
from __future__ import annotations

import os

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    os.environ["TPUNB_GROUP_WAIT"] = "60"


def pytest_runtest_teardown(item, nextitem):
    if nextitem is None or nextitem.path.suffix != ".ipynb":
        os.environ.pop("TPUNB_GROUP_WAIT", None)


def pytest_configure(config):
    """The suite's settings (tests/markers.py: no standby agents, a heartbeat limit for a loaded
    machine) reach every notebook's kernel. Under pytest-xdist each worker keeps its own
    $TPUNB_HOME: a notebook's %tpu_status lists the slices of its own registry, never those another
    worker's notebook launched at the same time."""
    from tests.markers import SUITE_ENVIRONMENT

    os.environ.update(SUITE_ENVIRONMENT)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and os.environ.get("TPUNB_HOME"):
        home = os.path.join(os.environ["TPUNB_HOME"], worker)
        os.makedirs(home, exist_ok=True)
        os.environ["TPUNB_HOME"] = home
        os.environ["CLOUDSDK_CONFIG"] = os.path.join(home, "gcloud")
