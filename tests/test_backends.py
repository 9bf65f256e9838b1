"""The backend contract in code: every member of provision.base.Backend, called on each backend
with real parts (local host processes, a real sshd, the Cloud TPU API emulator whose hosts are
that sshd, and tests/backends/exec_hosts.py's pods reached only through an exec channel), and what
each returns checked."""
from __future__ import annotations

import getpass
import importlib
import pkgutil

import pytest

from tpunb import catalog, provision
from tpunb.errors import UsageError
from tpunb.provision import Backend, LaunchRequest, Made, gcp, local, ssh
from tpunb.registry import Registry
from tpunb.slice import Slice
from tpunb.manager import SliceManager
from tpunb.status import SliceStatus
from tests.conftest import CPU_AS_TPU_HOST
from tests.emulator_fixture import on_sshd

#: the test backend whose hosts are reached through an exec channel, registered as another package's would be
EXEC = "exec=tests.backends.exec_hosts"


def register_exec(monkeypatch) -> Backend:
    """The exec backend, found through ``$TPUNB_BACKENDS`` and made known to this process's registry."""
    module = provision.registered({provision.ENVIRONMENT: EXEC}, entry_points=[])["exec"]
    monkeypatch.setitem(provision._MODULES, "exec", module)
    return module

ZONE = "us-central2-b"
MEMBERS = ("options", "default_name", "create", "attach", "delete", "record_transports", "name_reusable",
           "slice_status")


@pytest.fixture
def tpu_emulator_options(sshd):
    return on_sshd(sshd)


@pytest.fixture(params=["local", "ssh", "gcp", "exec"])
def backend(request, sshd, ssh_key):
    """(backend module, its options record, what slice_status says of its live slice)."""
    if request.param == "local":
        return local, local.options(), ("running", ["running", "running"])
    if request.param == "exec":
        module = register_exec(request.getfixturevalue("monkeypatch"))
        return module, module.options(), ("running", ["running", "running"])
    if request.param == "ssh":
        opts = ssh.options(hosts=[f"{a}:{sshd.port}" for a in sshd.addresses[:2]], key=str(ssh_key),
                           python=sshd.python)
        return ssh, opts, ("connected", ["connected", "connected"])
    request.getfixturevalue("tpu_emulator")
    return gcp, gcp.options(project="proj", zone=ZONE), ("READY", ["connected", "connected"])


@pytest.mark.fresh_slice
def test_every_backend_satisfies_the_protocol_member_by_member(backend):
    module, opts, (live_state, live_hosts) = backend
    assert isinstance(module, Backend) and all(callable(getattr(module, m)) for m in MEMBERS)
    assert provision.backend(module.NAME) is module
    assert isinstance(opts, type(module.options()))
    with pytest.raises(UsageError, match="unknown option"):
        module.options(no_such_option=1)
    accel = catalog.lookup("v4-16")
    name = module.default_name(accel)
    assert name == {"local": "v4-16", "ssh": "hosts", "gcp": f"tpunb-{getpass.getuser()}-v4-16",
                    "exec": "exec-v4-16"}[module.NAME]

    reg = Registry()
    made = module.create(LaunchRequest(name, accel, reg, dict(CPU_AS_TPU_HOST), opts))
    assert isinstance(made, Made) and made.record.name == name and len(made.transports) == 2
    assert reg.get_slice(name) is None or reg.get_slice(name).state != "running"  # running once its hosts are up
    manager = SliceManager()
    sl = manager.start(made, reg, dict(CPU_AS_TPU_HOST))
    try:
        assert isinstance(sl, Slice) and len(sl.session.hosts) == 2 and manager.current_name == name
        assert sl.run("import os\nos.environ['TPUNB_SLICE']", output=None).reprs == {0: repr(name), 1: repr(name)}
        record = reg.get_slice(name)
        assert record.backend == module.NAME and record.owner_pid is not None
        assert module.name_reusable(record) is False  # running: its name is taken
        nodes = gcp.Survey([record], reg).nodes
        seen = module.slice_status(record, nodes)
        assert isinstance(seen, SliceStatus) and (seen.state, seen.host_states) == (live_state, live_hosts)
        assert seen.usd_per_hour == {"local": 0.0, "ssh": None, "gcp": 25.76, "exec": None}[module.NAME]
        reached = module.record_transports(record, reg, [1, 0])  # from the record alone: as another process would
        try:
            assert sorted(reached) == [0, 1]
            for i, transport in reached.items():
                transport.connect()
                process = transport.spawn(["sh", "-c", f"echo host-{i}"])
                assert process.recv_exact(7) == f"host-{i}\n".encode(), (module.NAME, i)
                process.close()
                if not transport.same_machine:  # each remote host by its own address, as recorded
                    assert record.hosts[i].address.rsplit(":", 1)[0] == transport.address.rsplit(":", 1)[0]
        finally:
            for transport in reached.values():
                transport.close()
    finally:
        sl.close()
        manager.forks.close()  # this test's own manager: its fork server ends with it

    again = module.attach(record, reg, {})
    assert isinstance(again, Made) and again.record.name == name and len(again.transports) == 2
    for transport in again.transports:
        transport.close()
    after = module.slice_status(record, gcp.Survey([record], reg).nodes)
    if module is local:  # hosts ended with their slice: the one wording for it, and the name is free
        assert (after.state, after.host_states) == ("stopped: its kernel ended (%tpu_use restarts it)", ["gone"] * 2)
        assert module.name_reusable(record) is True
    else:  # hosts you bring, and a node that may bill, keep their names until %tpu_down
        assert module.name_reusable(record) is False
    module.delete(record)
    module.delete(record)  # idempotent
    reg.delete_slice(name)
    if module is gcp:
        assert gcp.tpu.api.get("proj", ZONE, name) is None
        gone = module.slice_status(record, gcp.Survey([record], reg).nodes)
        assert gone.state == "GONE" and gone.cloud["cloud_state"] == "GONE"


def test_optional_capabilities_are_declared_and_present_together(monkeypatch):
    """A backend has the members of exactly the capabilities it declares (SkyPilot's supports()),
    so callers ask ``provision.supports`` instead of naming a backend."""
    from tpunb.provision.base import OPTIONAL

    for module in (local, ssh, gcp, register_exec(monkeypatch)):
        assert module.CAPABILITIES <= set(OPTIONAL), module.CAPABILITIES
        for capability, members in OPTIONAL.items():
            has = all(callable(getattr(module, m, None)) for m in members)
            assert has == provision.supports(module, capability), (module.NAME, capability)
    assert provision.supporting("survey") == [gcp] and provision.supporting("hosts_here") == [local]
    with pytest.raises(ValueError, match="no backend capability"):
        provision.supports(local, "teleport")


def test_the_gcp_backends_two_handlers_offer_the_same_verbs():
    """One interface behind the gcp backend (provision/gcp/choice.py): every verb on both handlers,
    and each API's records, old ones without ``api`` included, read by their own handler."""
    from tpunb.provision.gcp import choice, compute, tpu
    from tpunb.registry import SliceRecord

    verbs = ("plan", "attach", "delete", "state", "gone", "replace_gone", "adopt", "recover", "survey", "surveyed",
             "delete_orphan", "listed")
    for handler in (tpu, compute):
        for module in pkgutil.iter_modules(handler.__path__):  # a submodule named as a verb would replace it
            importlib.import_module(f"{handler.__name__}.{module.name}")
        assert [v for v in verbs if not callable(getattr(handler, v, None))] == [], handler.__name__
    made = {api: SliceRecord(name="n", accelerator="v5p-8", backend="gcp", state="running", spec=spec)
            for api, spec in (("old", {"project": "p", "zone": "z"}), ("tpu", {"api": "tpu"}),
                              ("compute", {"api": "compute"}))}
    assert [choice.of(r) for r in made.values()] == [tpu, tpu, compute]
    assert choice.in_order() == [tpu, compute]
