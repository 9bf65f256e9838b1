"""Backends register without a change to tpunb: through the ``tpunb.backends`` entry-point group or
``$TPUNB_BACKENDS``; a name taken twice, or a module that is no backend, is refused in one line.
Two cloud backends' launch flags never collide in argparse: every option is ``--BACKEND-OPTION``,
and the bare ``--OPTION`` stays the first backend's (Cloud TPU's ``--zone``)."""
from __future__ import annotations

import types

import pytest
from IPython.core.magic_arguments import magic_arguments, parse_argstring

from tpunb import provision
from tpunb.errors import UsageError
from tpunb.magics.args import cloud_arguments
from tests.backends import second_cloud

SECOND = "second=tests.backends.second_cloud"


def test_a_backend_registers_through_the_environment_or_an_entry_point():
    by_env = provision.registered({provision.ENVIRONMENT: SECOND}, entry_points=[])
    assert list(by_env) == ["local", "ssh", "gcp", "second"] and by_env["second"] is second_cloud
    point = types.SimpleNamespace(name="second", value="tests.backends.second_cloud")
    assert provision.registered({}, entry_points=[point])["second"] is second_cloud


@pytest.mark.parametrize("given, said", [
    ("gcp=tests.backends.second_cloud", "backend 'gcp' (tests.backends.second_cloud) is registered twice"),
    ("other=tests.backends.second_cloud", "its NAME is 'second'"),
    ("second=tests.backends", "it lacks NAME, CAPABILITIES, create, attach, delete"),
])
def test_a_backend_that_cannot_be_registered_is_refused_in_one_line(given, said):
    with pytest.raises(UsageError) as refused:
        provision.registered({provision.ENVIRONMENT: given}, entry_points=[])
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_two_cloud_backends_flags_are_namespaced_and_parse_apart():
    flags = provision.launch_flags([provision.backend("gcp"), second_cloud])
    ours = {f.option.name: f.flags for f in flags if f.backend == "second"}
    assert ours == {"project": ("--second-project",), "zone": ("--second-zone",), "spot": ("--second-spot",)}
    gcp_zone = next(f for f in flags if f.backend == "gcp" and f.option.name == "zone")
    assert gcp_zone.flags == ("--zone", "--gcp-zone")

    def launch(line):
        """a launch magic with both backends' flags"""
    magic = magic_arguments()(cloud_arguments(launch, flags))  # argparse would raise on a second --zone
    args = parse_argstring(magic, "--zone us-central2-b --second-zone europe-west4-a --second-spot")
    assert (args.gcp__zone, args.second__zone, args.second__spot, args.gcp__spot) == (
        "us-central2-b", "europe-west4-a", True, False)


def test_a_launchs_flags_choose_their_backend_and_two_backends_flags_are_refused(monkeypatch):
    monkeypatch.setitem(provision._MODULES, "second", second_cloud)
    assert provision.launch_options({"second__zone": "z1", "second__spot": False}, None) == ("second", {"zone": "z1"})
    assert provision.launch_options({"gcp__zone": "z1"}, None) == (None, {"zone": "z1"})  # the default stays the launch's
    with pytest.raises(UsageError, match="--zone is a second option, and --backend is gcp"):
        provision.launch_options({"second__zone": "z1"}, "gcp")
    with pytest.raises(UsageError, match="flags of the gcp and the second backends at once"):
        provision.launch_options({"second__zone": "z1", "gcp__spot": True}, None)
