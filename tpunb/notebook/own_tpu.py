"""``%tpu_launch local``: this machine's own TPU chips (a Colab TPU runtime) as a one-host slice.
What the chips are comes from the machine (``colab.own_accelerator``), else from JAX on them."""
from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from tpunb import catalog, colab, provision, report
from tpunb.errors import UsageError
from tpunb.provision import LaunchRequest
from tpunb.registry import Registry
from tpunb.slice import Slice

NAME = colab.OWN_TPU


def check(count: int, backend: str | None, options: dict) -> None:
    """Only --name, --env and --compile-cache go with this machine's own TPU."""
    if count > 1:
        raise UsageError(f"%tpu_launch {NAME} is this machine's own TPU, one slice: give no --slices "
                         "(a simulated multislice: %tpu_launch v4-16 --slices 2 --backend local)")
    if not provision.runs_here(backend) or options:
        raise UsageError(f"%tpu_launch {NAME} runs on this machine's own TPU and takes only --name and "
                         "--env; for Cloud TPU name an accelerator, e.g. %tpu_launch v5litepod-8 --backend gcp")


def request(name: str, values: dict[str, str], reg: Registry) -> tuple[Any, LaunchRequest]:
    """The backend and the launch request for the chips here (refused while another process holds them)."""
    accel = colab.own_accelerator()
    colab.check_tpu_free()
    maker = provision.backend(provision.THIS_MACHINE)
    return maker, LaunchRequest(name, accel, reg, values, maker.options(own_tpu=True))


def name_chips(sl: Slice) -> catalog.Accelerator:
    """This machine's TPU as JAX on its chips names it (device kind and count), recorded, and said."""
    result = sl.run(colab.DEVICE_PROBE, output=None)
    result.raise_for_status()
    kind, devices = ast.literal_eval(result.reprs[0])
    named = colab.accelerator_from_devices(kind, int(devices))
    sl.record.accelerator, sl.accelerator = named.name, named
    sl.run(f"import os\nos.environ['TPUNB_ACCELERATOR'] = {named.name!r}", output=None).raise_for_status()
    sl.registry.save_slice(sl.record)
    return named


def name_or_end(sl: Slice, down: Callable[[str], Any]) -> None:
    """When the machine did not say what its chips are, JAX on them does (it starts there now, as a
    first cell would), and the launch says it; a failure ends the slice (``down``) and is raised."""
    try:
        named = name_chips(sl)
    except BaseException:
        down(sl.name)
        raise
    report.info(f"this machine's TPU is a {named.name} ({named.chips} chip{'s' if named.chips > 1 else ''}, "
                "from jax.devices() on it)")
