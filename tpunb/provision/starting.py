"""Every slice starts the same way, whichever backend made it: a Slice of what it made, every
host's agent started, the backend's last checks, and only then recorded as running. A failure or
Ctrl-C on the way closes the hosts and lets the backend undo what it made (``Made.failed``)."""
from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from tpunb import report
from tpunb.engine.masking import Masker
from tpunb.errors import CellInterrupted
from tpunb.provision.base import Made
from tpunb.registry import Registry
from tpunb.slice import Slice
from tpunb.transport.forkserver import LocalForks


@contextlib.contextmanager
def interrupt_says_one_line(name: str, reg: Registry):
    """Ctrl-C during a launch that a backend did not turn into its own error (before its cloud
    call, or while its hosts start): one line, and the launch's own record forgotten. Backends
    delete what they created themselves (local and SSH hosts are closed, a cloud node deleted)."""
    try:
        yield
    except KeyboardInterrupt:
        record = reg.get_slice(name)
        if record is not None and record.owner_pid == os.getpid() and record.state == "creating":
            reg.delete_slice(name)  # nothing exists for it yet: the cloud call had not started
        raise CellInterrupted(f"launch of {name} interrupted: nothing is left running") from None


def with_spec(made: Made, **entries: Any) -> Made:
    """What the launch decided beyond the backend's request, kept in the record's spec for every
    later start of its hosts (restarts, %tpu_use from another kernel, --recover): the shared
    ``compile_cache`` JAX points at, whether the hosts get the kernel's ``hf_token``. None: not set."""
    made.record.spec.update({key: value for key, value in entries.items() if value is not None})
    return made


def start_slice(made: Made, reg: Registry, masker: Masker | None, forks: LocalForks | None,
                since: float | None = None, quiet: bool = False) -> Slice:
    """The Slice of what a backend made, connected, checked and recorded as running (owned by this
    process, its hosts' pids published for other processes). ``since``: when the launch began (its
    ready line counts from then); ``quiet``: no ready line of ours."""
    started = time.perf_counter() if since is None else since
    record = made.record
    sl = Slice(record, made.transports, made.host_init, reg, coordinator_port=made.coordinator_port, node=made.node,
               masker=masker, forks=forks)
    try:
        sl.connect(attaching=True)  # the manager's attach ends it with mark_used
        if made.check is not None:
            made.check(sl)
        record.owner_pid, record.state = os.getpid(), "running"
        sl.publish_hosts()  # pids and stack dumps, for readers in other processes (the sidebar's server)
        reg.save_slice(record)
    except BaseException as exc:
        sl.close()
        if made.failed is not None:
            made.failed(exc)
        raise
    if made.ready is not None:
        made.ready()
    elif not quiet:
        report.info(f"Slice {sl.name!r} ready in {time.perf_counter() - started:.1f} s: run cells on it with %%on_tpu")
    return sl
