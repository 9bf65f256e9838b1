"""What each VM of a cloud slice is prepared with, whichever API made it: the environment tpunb
makes there (uv, the notebook's Python and jax), or the VM's own Python with --no-setup."""
from __future__ import annotations

from tpunb.errors import UsageError
from tpunb.provision import ssh
from tpunb.provision.gcp.config import CloudOptions


def host_setup(opts: CloudOptions) -> dict:
    """The record's interpreter and host environment: by default each VM gets an environment tpunb
    makes (a fresh image has Python 3.10 and no JAX); --no-setup runs on the VM's Python as it is."""
    if not opts.no_setup:
        interpreter, setup = ssh.setup_spec(opts.python, opts.jax, opts.pip, opts.requirements)
        return {"interpreter": interpreter, "setup": setup}
    if opts.jax or opts.pip or opts.requirements:
        raise UsageError("--jax, --pip and --requirements go into the environment tpunb makes: drop --no-setup")
    return {"interpreter": opts.python or "python3", "setup": None}
