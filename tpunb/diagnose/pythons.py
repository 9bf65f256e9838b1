"""Kernel and host Python: cloudpickle loads functions and classes only between the same Python
version, so a host on another X.Y than this notebook is said once at connect, and a push of such
a value to it fails in one line before anything is sent."""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

from tpunb import report
from tpunb.errors import UsageError

#: a slice's hosts (each with ``index`` and the ``info`` its hello gave), and how it names hosts
Hosts = Iterable[Any]
Names = Callable[[list[int]], str]


def kernel_python() -> str:
    """This kernel's Python as X.Y."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def python_minor(version: str | None) -> str | None:
    """'3.10.13' -> '3.10' (None stays None)."""
    if not version:
        return None
    parts = str(version).split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else str(version)


def mismatch(connections: Hosts, indices: list[int] | None = None) -> tuple[list[int], str | None]:
    """Hosts (of ``indices``, default all) whose Python X.Y differs from this kernel's, and theirs."""
    mine, theirs, hosts = kernel_python(), None, []
    for host in connections:
        if indices is not None and host.index not in indices:
            continue
        minor = python_minor(host.info.get("python"))
        if minor and minor != mine:
            hosts.append(host.index)
            theirs = minor
    return hosts, theirs


def warn_mismatch(connections: Hosts, names: Names) -> str | None:
    """One warning naming the hosts on another Python and what breaks there; the line, or None."""
    hosts, theirs = mismatch(connections)
    if not hosts:
        return None
    many = len(hosts) > 1
    line = (f"[tpunb] host{'s' if many else ''} {names(hosts)} run{'' if many else 's'} Python {theirs}, this "
            f"notebook Python {kernel_python()}: functions and classes pushed from the notebook (%tpu_push) cannot "
            "load there (cloudpickle needs the same Python); values of plain types still can. Give the hosts this "
            "notebook's Python: a cloud slice gets it by default, %tpu_connect with --setup")
    report.warn(line)
    return line


def refuse_code(connections: Hosts, names: Names, values: dict[str, Any], chosen: list[int]) -> None:
    """A UsageError if ``values`` carry a function or class of this notebook (pickled by value) to a
    host on another Python; nothing is sent then."""
    hosts, theirs = mismatch(connections, chosen)
    if not hosts:
        return
    from tpunb.engine.transfer import code_by_value

    code = code_by_value(values)
    if code:
        raise UsageError(f"cannot push {', '.join(code)} to host{'s' if len(hosts) > 1 else ''} "
                         f"{names(hosts)}: {'they hold' if len(code) > 1 else 'it holds'} a function or "
                         f"class defined in this notebook, which cloudpickle loads only on the same Python (hosts "
                         f"{theirs}, notebook {kernel_python()}): define it in a %%on_tpu cell, or give the hosts "
                         "this notebook's Python")
