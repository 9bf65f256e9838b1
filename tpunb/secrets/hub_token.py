"""The kernel's Hugging Face token and new slices. A slice launched here gets the kernel's
``HF_TOKEN`` as a secret (masked) by default, and its launch says so in one line; ``--no-hf-token``
(``hf_token=False``, kept in the slice's record for later kernels) leaves it out. Hosts brought with
``%tpu_connect`` get it only when ``%tpu_secret HF_TOKEN`` or ``--secret HF_TOKEN`` names it."""
from __future__ import annotations

import os

from tpunb import report
from tpunb.engine.masking import MIN_LENGTH, Masker

HF_TOKEN = "HF_TOKEN"


def with_token(values: dict[str, str], masker: Masker, wanted: bool = True) -> dict[str, str]:
    """``values`` with the kernel's HF_TOKEN (masked) when ``wanted``, it is set, and no other was given."""
    token = os.environ.get(HF_TOKEN, "")
    if wanted and len(token) >= MIN_LENGTH and HF_TOKEN not in values:
        masker.add(token)
        values[HF_TOKEN] = token
    return values


def say_if_added(name: str, values: dict[str, str], given: tuple[dict, ...]) -> None:
    """Say the default once it applied: ``values`` has the HF_TOKEN and none of ``given`` (the
    launch's --env and --secret values, the kernel's %tpu_secret ones) named it."""
    if HF_TOKEN in values and not any(HF_TOKEN in values_given for values_given in given):
        say_given(name)


def say_given(name: str) -> None:
    """The launch line that states the default: the hosts of ``name`` have this kernel's HF_TOKEN."""
    report.info(f"[tpunb] {name!r} has this kernel's HF_TOKEN as a secret (masked), as every launched slice does: "
                "--no-hf-token leaves it out")
