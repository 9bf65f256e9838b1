"""What goes into the environment tpunb makes on each host (``tpunb/host/prepare.py`` makes it).

A fresh Cloud TPU VM has Python 3.10 and no framework, and cloudpickle only loads functions and
classes between the same Python version: so by default each host gets a uv virtual environment
with this notebook's Python X.Y, jax at this notebook's version (when that Python can have it),
and ``HOST_PACKAGES``. ``--python``, ``--jax``, ``--pip`` and ``--requirements`` change that.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

from tpunb import report
from tpunb.diagnose.pythons import kernel_python
from tpunb.errors import UsageError

#: what every prepared host gets: extend it (``HOST_PACKAGES.append("einops")``) for every slice.
#: "jax" is jax[tpu] on a TPU VM (libtpu, requests) and plain jax plus requests elsewhere, at the
#: kernel's version when the host's Python can have it. cloudpickle loads what the notebook pushes;
#: ipython runs cells as the notebook does (!cmd, %timeit); tpu-info reads libtpu's metrics;
#: orbax-checkpoint saves snapshots, and gcsfs lets it write them to gs:// (orbax's metadata goes
#: through etils.epath, which needs it); py-spy reads native stacks of a stuck host; huggingface_hub
#: reads what %tpu_fetch put there; google-crc32c checks a gs:// object that has only a CRC32C (what
#: gcloud storage's parallel uploads make) at speed; filelock lets JAX bound the compile cache.
HOST_PACKAGES: list[str] = ["jax", "flax", "cloudpickle", "numpy", "ipython", "tpu-info", "orbax-checkpoint",
                            "gcsfs", "py-spy", "huggingface_hub", "google-crc32c", "filelock"]
_VERSION = re.compile(r"\d+\.\d+(\.\d+)?")


@functools.cache
def kernel_jax() -> tuple[str | None, str | None]:
    """(version, Requires-Python) of the kernel's jax, read from its metadata (never imported)."""
    import importlib.metadata as metadata

    try:
        return metadata.version("jax"), metadata.metadata("jax").get("Requires-Python")
    except metadata.PackageNotFoundError:
        return None, None


def split_packages(text: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """'einops optax==0.2' (or a list) -> ['einops', 'optax==0.2']."""
    if not text:
        return []
    items = text if isinstance(text, (list, tuple)) else re.split(r"[\s,]+", str(text).strip("'\""))
    return [item.strip().strip("'\"") for item in items if item and item.strip().strip("'\"")]


def host_spec(python: str | None = None, jax: str | None = None, pip=None, requirements: str | None = None,
              packages: list[str] | None = None) -> dict:
    """The spec every host's ``prepare`` gets: Python (X.Y, or an interpreter path on the hosts),
    jax, the packages and the user's own. A one-line UsageError for what cannot be right anywhere."""
    python = str(python or kernel_python()).strip()
    if re.fullmatch(r"[\d.]+", python) and not _VERSION.fullmatch(python):
        raise UsageError(f"--python {python}: give a version as X.Y (e.g. 3.11), or an interpreter's path on the hosts")
    version, requires = kernel_jax()
    if jax is not None and not re.fullmatch(r"[0-9][0-9a-z.\-+]*", str(jax)):
        raise UsageError(f"--jax {jax}: give a version, e.g. --jax 0.7.2")
    text = ""
    if requirements:
        path = Path(requirements).expanduser()
        try:
            text = path.read_text()
        except OSError as exc:
            raise UsageError(f"--requirements {requirements}: cannot read it here ({exc.strerror or exc}): give a "
                             "requirements file on this machine") from None
    wanted = [p for p in (HOST_PACKAGES if packages is None else packages) if p != "jax"]
    return {"python": python, "jax": str(jax) if jax else version, "jax_pinned": jax is not None,
            "jax_python": None if jax else requires, "packages": wanted, "pip": split_packages(pip),
            "requirements": text}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", str(text))[:4])


def at_least(spec: dict, generation, explicit_jax: str | None = None) -> dict:
    """``spec`` for a slice of ``generation`` (a catalog.Generation): a generation with a minimum
    (jax, libtpu) pair (catalog ``jax_min``) gets at least that pair. A Python too old for it is a
    one-line refusal with ``--python 3.12``; an older --jax is refused; an older jax of this
    notebook's is raised to the minimum on the hosts, with one notice naming both versions."""
    need = getattr(generation, "jax_min", None)
    if not need:
        return spec
    name, python = "TPU7x" if generation.key == "tpu7x" else generation.key, str(spec["python"])
    wanted = f"jax {need['jax']} or newer with libtpu {need['libtpu']} or newer"
    if _VERSION.fullmatch(python) and _version(python) < _version(need["python"]):
        raise UsageError(f"{name} needs {wanted}, which needs Python {need['python']} or newer, not {python}: add "
                         "--python 3.12 (the hosts get it from uv)")
    pinned = spec.get("jax")
    if pinned and _version(pinned) < _version(need["jax"]):
        if explicit_jax:
            raise UsageError(f"--jax {explicit_jax}: {name} needs {wanted} (docs/cloud-facts.md): give --jax "
                             f"{need['jax']} or newer, or leave --jax out")
        report.info(f"[tpunb] {name} needs {wanted}: this notebook's jax {pinned} is older, so the hosts get jax "
                    f"{need['jax']} (pushed and pulled arrays travel as numpy data, which both read)")
        spec = {**spec, "jax": need["jax"], "jax_pinned": True, "jax_python": None}
    return {**spec, "libtpu": need["libtpu"]}
