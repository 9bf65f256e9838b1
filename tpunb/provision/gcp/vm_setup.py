"""What each VM of a cloud slice is prepared with, whichever API made it: the environment tpunb
makes there (uv, the notebook's Python and jax), or the VM's own Python with --no-setup."""
from __future__ import annotations

from tpunb import catalog
from tpunb.errors import TpunbError, UsageError
from tpunb.provision import hostenv, ssh
from tpunb.provision.gcp.config import CloudOptions
from tpunb.registry import Registry, SliceRecord


def host_setup(opts: CloudOptions, accelerator: catalog.Accelerator | None = None) -> dict:
    """The record's interpreter and host environment: by default each VM gets an environment tpunb
    makes (a fresh image has Python 3.10 and no JAX), with at least the jax and libtpu the
    accelerator's generation needs (hostenv.at_least); --no-setup runs on the VM's Python as it is."""
    if not opts.no_setup:
        interpreter, setup = ssh.setup_spec(opts.python, opts.jax, opts.pip, opts.requirements)
        if accelerator is not None:
            setup = hostenv.at_least(setup, catalog.generation(accelerator.generation), opts.jax)
        return {"interpreter": interpreter, "setup": setup}
    if opts.jax or opts.pip or opts.requirements:
        raise UsageError("--jax, --pip and --requirements go into the environment tpunb makes: drop --no-setup")
    return {"interpreter": opts.python or "python3", "setup": None}


def kept(opts: CloudOptions, exc: BaseException, record: SliceRecord, reg: Registry, progress) -> bool:
    """--keep: a slice whose hosts could not be reached or prepared stays, recorded as "kept", for a
    look (it bills until %tpu_down); the error says so. False without --keep (or on Ctrl-C)."""
    if not opts.keep or isinstance(exc, KeyboardInterrupt):
        return False
    record.state = "kept"
    reg.save_slice(record)
    if isinstance(exc, TpunbError):
        exc.args = (f"{exc}; {record.name} was kept (--keep): it bills until %tpu_down {record.name}",)
    progress.failed(str(exc))
    return True
