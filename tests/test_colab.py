"""tpunb in Google Colab: what only Colab has (tpunb.colab), against a stand-in google.colab.

Colab's runtime cannot run here, so ``google.colab`` is replaced by tests/colab_stand_in.py,
which records every call: the one place in this suite where a fake is honest, because the real
package only exists on Colab's servers. Everything it meets is real: the IPython shell, host
processes, JAX, ProvisionErrors from google-auth, and a real Jupyter kernel with ipywidgets.
The Colab profile (scripts/test_colab) runs this file on Colab's pinned runtime (Python 3.13,
IPython 7.34, ipywidgets 7.7.1, jax 0.7.2); the main suite runs it on current releases.
"""
from __future__ import annotations

import json
import os
import types

import pytest

import tpunb.colab
from tests import colab_stand_in
from tpunb import provision, report, manager
from tpunb.errors import ProvisionError, UsageError
from tpunb.provision.gcp.tpu import api as gcp
from tpunb.registry import Registry

COLAB_SIGN_IN = "run `import tpunb.colab; tpunb.colab.authenticate('PROJECT')` (Colab's Google sign-in)"


@pytest.fixture
def colab(monkeypatch):
    """The stand-in google.colab, installed for one test; yields the list of recorded calls."""
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "")
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT")  # restored to absent even if authenticate() sets it
    monkeypatch.setattr(report, "_once", set())  # a new kernel: nothing said or done once yet
    yield colab_stand_in.install()
    colab_stand_in.uninstall()


def test_colab_is_detected_only_where_google_colab_exists(colab):
    assert tpunb.colab.in_colab()
    colab_stand_in.uninstall()
    assert not tpunb.colab.in_colab()  # this runtime has no google.colab: not Colab


def test_missing_credentials_in_colab_offer_colabs_sign_in(colab, tmp_path, monkeypatch):
    monkeypatch.delenv("TPUNB_TPU_API_ENDPOINT", raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # no metadata-server probe: this is not a GCE VM
    with pytest.raises(ProvisionError) as info:
        gcp.get("p", "us-central2-b", "x")
    assert str(info.value) == f"no Google Cloud credentials: {COLAB_SIGN_IN}"
    assert colab == []  # offered, never called for the user: signing in opens Colab's dialog


@pytest.mark.fresh_slice
def test_no_project_in_colab_names_authenticate(colab, cell):
    run = cell("%tpu_launch v5litepod-8 --backend gcp")
    assert isinstance(run.error, ProvisionError)
    assert str(run.error) == f"no Google Cloud project: pass --project, or {COLAB_SIGN_IN}"


def test_authenticate_signs_in_through_colab_and_sets_the_project(colab):
    assert provision.default_backend() == "local"
    tpunb.colab.authenticate("my-proj")
    assert colab == [("auth.authenticate_user", "my-proj")]
    assert os.environ["GOOGLE_CLOUD_PROJECT"] == "my-proj"
    assert provision.default_backend() == "gcp"  # %tpu_launch now makes Cloud TPU slices


def test_authenticate_outside_colab_says_to_use_gcloud():
    with pytest.raises(UsageError, match="gcloud auth application-default login"):
        tpunb.colab.authenticate()


def test_custom_widget_manager_is_enabled_once_and_only_in_colab(colab):
    colab_stand_in.uninstall()
    assert tpunb.colab.enable_custom_widgets() is False  # elsewhere there is nothing to enable
    calls = colab_stand_in.install()
    assert tpunb.colab.enable_custom_widgets() is True
    assert tpunb.colab.enable_custom_widgets() is True
    assert calls == [("output.enable_custom_widget_manager",)]


# -- widgets in a real kernel --------------------------------------------------------------------

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def run_in_kernel(client, code: str, timeout: float = 120) -> tuple[dict, list[dict]]:
    """Run code in the kernel: its execute reply, and every iopub message it caused."""
    messages: list[dict] = []
    reply = client.execute_interactive(code, timeout=timeout, output_hook=messages.append)
    return reply["content"], messages


@pytest.mark.fresh_slice
def test_core_widgets_render_without_colabs_custom_manager_in_a_real_kernel(isolated_home):
    """%tpu_metrics is a core ipywidgets HTML widget (7.7 in Colab, 8 elsewhere): it shows as a widget
    view in a real ipykernel, and Colab's custom widget manager is left alone until a custom widget asks."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        setup = ("import IPython, ipywidgets, tests.colab_stand_in as s; calls = s.install()\n"
                 "print(json.dumps([IPython.__version__, ipywidgets.__version__]))")
        reply, messages = run_in_kernel(client, "import json\n" + setup)
        assert reply["status"] == "ok", reply
        versions = json.loads("".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream"))
        import IPython
        import ipywidgets

        assert versions == [IPython.__version__, ipywidgets.__version__]  # the kernel runs this runtime
        reply, _ = run_in_kernel(client, "%load_ext tpunb\n%tpu_launch v4-8")
        assert reply["status"] == "ok", reply
        reply, _ = run_in_kernel(client, "%%on_tpu\nimport tpunb\ntpunb.log(1, marker=7.5)")
        assert reply["status"] == "ok", reply
        reply, _ = run_in_kernel(client, "from tests.conftest import wait_for\nimport tpunb\n"
                                         "wait_for(lambda: 'marker' in set(tpunb.current().metrics().metric), 20, "
                                         "'the host to send the marker')")
        assert reply["status"] == "ok", reply  # the kernel holds the marker before the view is drawn
        reply, messages = run_in_kernel(client, "%tpu_metrics")  # the live view: a core HTML widget
        assert reply["status"] == "ok", reply
        views = [m for m in messages if m["msg_type"] == "display_data" and WIDGET_VIEW in m["content"]["data"]]
        assert len(views) == 1
        opened = [m["content"]["data"]["state"] for m in messages if m["msg_type"] == "comm_open"]
        html = [state for state in opened if state.get("_model_name") == "HTMLModel"]
        assert html and "host 0" in html[0]["value"] and "marker" in html[0]["value"]
        reply, messages = run_in_kernel(client, "print(json.dumps(calls)); import tpunb.colab\n"
                                                "tpunb.colab.enable_custom_widgets(); print(json.dumps(calls))")
        printed = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream").splitlines()
        assert [json.loads(line) for line in printed] == [[], [["output.enable_custom_widget_manager"]]]
        run_in_kernel(client, "%tpu_down")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


# -- this machine's own TPU ----------------------------------------------------------------------


@pytest.mark.fresh_slice
def test_own_accelerator_from_the_variable_or_left_to_jax_on_the_chips(colab, tmp_path):
    dev = tmp_path / "dev"
    (dev / "vfio").mkdir(parents=True)
    (dev / "vfio" / "vfio").touch()  # the VFIO control node is not a chip
    with pytest.raises(UsageError, match="no TPU on this machine: in Colab pick Runtime > Change runtime type > TPU"):
        tpunb.colab.own_accelerator({}, dev)
    (dev / "vfio" / "0").touch()
    assert tpunb.colab.own_accelerator({}, dev) is None  # JAX on the chips names it once the host runs
    assert tpunb.colab.own_accelerator({"TPU_ACCELERATOR_TYPE": "v4-8"}, dev).name == "v4-8"
    with pytest.raises(UsageError, match="one host of a v4-16 .2 hosts.: reach all of them with %tpu_connect"):
        tpunb.colab.own_accelerator({"TPU_ACCELERATOR_TYPE": "v4-16"}, dev)


@pytest.mark.parametrize("kind, devices, name", [
    ("TPU v5 lite", 1, "v5litepod-1"),  # Colab's TPU runtime
    ("TPU v6 lite", 1, "v6e-1"), ("TPU v6 lite", 8, "v6e-8"),
    ("TPU v2", 8, "v2-8"), ("TPU v3", 8, "v3-8"),  # Colab's older TPU runtimes: 4 chips x 2 cores
    ("TPU v4", 4, "v4-8"), ("TPU v5", 4, "v5p-8"),
])
def test_the_type_from_the_device_kind_jax_reports(kind, devices, name):
    assert tpunb.colab.accelerator_from_devices(kind, devices).name == name


def test_a_device_kind_that_is_no_tpu_says_what_to_set():
    with pytest.raises(UsageError, match="sees 8 'cpu' devices, not a TPU .* %env TPU_ACCELERATOR_TYPE=TYPE"):
        tpunb.colab.accelerator_from_devices("cpu", 8)


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_launch_local_names_the_type_from_what_jax_sees_on_the_chips(colab, cell, monkeypatch, tmp_path):
    """No TPU here: the host's jax is a stand-in package that answers as JAX on a v6e-4 VM does
    (``device_kind`` 'TPU v6 lite', 4 devices); this machine 'has' 4 chips."""
    fake = tmp_path / "stand-in" / "jax"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("class _Device:\n    device_kind = 'TPU v6 lite'\n    platform = 'tpu'\n"
                                      "def devices():\n    return [_Device()] * 4\n"
                                      "def device_count():\n    return 4\n")
    (fake / "distributed.py").write_text("def initialize(**kwargs):\n    pass\n")
    monkeypatch.setenv("PYTHONPATH", f"{fake.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
    monkeypatch.setattr(tpunb.colab, "count_chips", lambda dev=None: 4)
    run = cell("%tpu_launch local")
    assert run.error is None, run.shown
    assert "this machine's TPU is a v6e-4 (4 chips, from jax.devices() on it)" in run.stdout
    assert manager.current().kind == "v6e-4" and Registry().get_slice("local").accelerator == "v6e-4"
    assert "'v6e-4'" in cell("%%on_tpu\nimport os\nos.environ['TPUNB_ACCELERATOR']").shown  # one host: no label


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_launch_local_puts_the_one_host_on_this_machines_own_chips(colab, cell, monkeypatch, tmp_path):
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # what a simulated slice's host gets; the own-TPU host must not
    monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 --xla_dump_to={tmp_path}/dump")
    run = cell("%tpu_launch local")
    assert run.error is None, run.shown
    assert "Launching 'local' on this machine's own TPU (v5litepod-1: 1 host x 1 chip)" in run.stdout
    sl = manager.current()
    assert (sl.name, sl.num_hosts, sl.record.spec) == ("local", 1, {"own_tpu": True})
    run = cell("%%on_tpu\nimport os, jax\nprint(repr(os.environ['JAX_PLATFORMS']), os.environ['XLA_FLAGS'])\n"
               "print(os.environ['TPUNB_ACCELERATOR'], jax.process_count(), jax.local_device_count())")
    assert run.error is None, run.shown
    # JAX chooses the platform itself (the TPU in Colab; this machine's CPU here), one device, no forcing
    assert run.stdout.splitlines() == [f"'' --xla_dump_to={tmp_path}/dump", "v5litepod-1 1 1"]


@pytest.mark.fresh_slice
def test_launch_local_takes_no_cloud_flags(cell):
    run = cell("%tpu_launch local --backend gcp")
    assert isinstance(run.error, UsageError)
    assert "takes only --name and --env" in str(run.error)


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_a_kernel_whose_jax_holds_the_tpu_is_told_in_one_line(colab, cell, monkeypatch):
    """Only one process can open a TPU. Here the kernel's JAX really initializes (on this CPU); the
    one thing simulated is that its backend is Colab's chip: a "tpu" entry in JAX's backend table,
    which is what tpunb.colab reads."""
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    import jax
    from jax._src import xla_bridge

    jax.devices()
    assert not tpunb.colab.kernel_holds_tpu()  # a CPU backend holds no TPU
    assert cell("%tpu_launch local").error is None
    manager.detach_all()  # its host ends, as at a kernel restart; the registry keeps the slice

    monkeypatch.setitem(xla_bridge._backends, "tpu", types.SimpleNamespace(platform="tpu"))
    expected = ("this kernel already holds the TPU (jax was used here): restart the runtime and run "
                "%tpu_launch local before using jax in the notebook itself")
    for line in ("%tpu_use local", "%tpu_launch local --name again"):
        run = cell(line)
        assert isinstance(run.error, tpunb.colab.TpuHeldError), line
        assert str(run.error) == expected
        assert f"TpuHeldError: {expected}" in run.shown  # one line, no libtpu or tpunb traceback
    assert manager.MANAGER.attached == {}  # no host process was started
    assert [r.name for r in Registry().list_slices()] == ["local"]
