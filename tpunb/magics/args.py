"""What every magic shares: its line parsed into arguments, a bad line answered with one line and
the usage, and a Ctrl-C in tpunb's own code ended with one line (never a traceback of ours)."""
from __future__ import annotations

import contextlib

from IPython.core.error import UsageError as IPythonUsageError
from IPython.core.magic_arguments import argument, parse_argstring

from tpunb import provision
from tpunb.errors import CellInterrupted, UsageError


def parse_line(magic, line: str):
    """magic_arguments parsing whose errors are one line plus the magic's usage."""
    try:
        return parse_argstring(magic, line)
    except (IPythonUsageError, SystemExit, ValueError) as exc:
        raise UsageError(f"{exc}. Usage: {usage_of(magic)}") from None


@contextlib.contextmanager
def one_line_interrupt():
    """A Ctrl-C that lands in tpunb's own code (starting hosts, rendering output) ends the cell with
    one line, never a traceback of our internals."""
    try:
        yield
    except KeyboardInterrupt:
        raise CellInterrupted("interrupted") from None


def cloud_arguments(magic, flags: list | None = None):
    """%tpu_launch's flags for every launch option a backend offers (``provision.launch_flags``:
    ``--BACKEND-OPTION``, and ``--OPTION`` for the first backend offering it), listed once, in the
    backend's dataclass."""
    for flag in reversed(provision.launch_flags() if flags is None else flags):
        option = flag.option
        if option.type in (bool, "bool"):
            magic = argument(*flag.flags, dest=flag.dest, action="store_true", help=option.metadata["help"])(magic)
        else:
            kind = float if str(option.type) in ("float", "float | None") else None  # durations parse later
            magic = argument(*flag.flags, dest=flag.dest, type=kind, metavar=option.name.upper(),
                             help=option.metadata["help"])(magic)
    return magic


def usage_of(magic) -> str:
    usage = " ".join(magic.parser.format_usage().replace("::", "").split())
    return "%" + usage if getattr(magic, "__name__", "") == "on_tpu" else usage
