"""What the kernel does around its slices (tpunb.notebook), apart from the manager: the hosts a
user brings read from what they typed, launch arguments, a new slice's name, --env values, and
the stop button, which outside a Jupyter kernel (here) is left alone."""
from __future__ import annotations

import pytest

from tpunb import catalog
from tpunb.engine.masking import Masker
from tpunb.errors import NoSliceError, UsageError
from tpunb.notebook import env, launch_args, names, stop_button
from tpunb.notebook.brought import brought_hosts
from tpunb.registry import Registry, SliceRecord
from tpunb.secrets.vault import Secrets


def test_brought_hosts_are_read_with_their_users_ports_and_slices():
    got = brought_hosts("me@10.0.0.2,me@10.0.0.3:2222", None, 22, 2, None, ["python3", "/opt/py"], 8476)
    assert got.places == [("10.0.0.2", 22), ("10.0.0.3", 2222)] and got.addresses == ["10.0.0.2", "10.0.0.3:2222"]
    assert (got.user, got.count, got.python, got.accelerator) == ("me", 2, "python3,/opt/py", None)
    assert brought_hosts(["a", "b"], "u", 22, None, "v4-16").accelerator == catalog.lookup("v4-16")


@pytest.mark.parametrize("hosts, user, slices, accelerator, port, said", [
    ("", None, None, None, None, "give at least one host"),
    ("a,b,c", None, 2, None, None, "3 hosts do not make 2 equal slices"),
    ("a", None, None, "v4-16", None, "v4-16 has 2 hosts, but 1 were given"),
    ("x@a,y@b", None, None, None, None, "give the user once"),
    ("a", None, 0, None, None, "--slices takes a whole number"),
    ("a", None, None, None, 70000, "--coordinator-port 70000: give a TCP port"),
])
def test_brought_hosts_that_cannot_be_are_refused_in_one_line(hosts, user, slices, accelerator, port, said):
    with pytest.raises(UsageError) as refused:
        brought_hosts(hosts, user, 22, slices, accelerator, coordinator_port=port)
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_launch_arguments_are_checked():
    assert launch_args.slice_count(None) == 1 and launch_args.slice_count(3) == 3
    with pytest.raises(UsageError, match="v3 has no multislice"):
        launch_args.check_multislice(catalog.lookup("v3-8"), 2)
    launch_args.check_multislice(catalog.lookup("v4-16"), 2)
    assert launch_args.compile_cache("gs://bucket/jax/") == "gs://bucket/jax"
    with pytest.raises(UsageError, match="give a Cloud Storage place"):
        launch_args.compile_cache("/tmp/cache")


def test_a_new_slice_is_named_after_the_base_and_a_taken_name_is_refused():
    reg = Registry()
    assert names.claim(None, "v4-16", reg, {"v4-16", "v4-16-2"}) == "v4-16-3"
    with pytest.raises(UsageError, match="a slice named 'v4-16' exists"):
        names.claim("v4-16", "v4-16", reg, {"v4-16"})
    with pytest.raises(UsageError, match="lowercase letters"):
        names.claim("My_Slice", "v4-16", reg, set())
    reg.save_slice(SliceRecord(name="kept", accelerator="", backend="ssh", state="running"))
    error = names.unknown("gone", reg)
    assert isinstance(error, NoSliceError) and "known slices: kept" in str(error)


def test_env_values_are_parsed_and_secret_looking_ones_masked():
    masker = Masker()
    values = env.parse_env(["A=1", "B=x=y"], None, masker, Secrets())
    assert values == {"A": "1", "B": "x=y"}
    with pytest.raises(UsageError, match="--env takes KEY=VALUE"):
        env.parse_env(["oops"], None, masker, Secrets())


def test_the_stop_button_is_left_alone_outside_a_jupyter_kernel():
    assert stop_button.take(lambda signum, frame: None) is None
