"""A fresh Cloud TPU VM image, as the sandbox's hosts model it.

Google's TPU VM images (tpu-ubuntu2204-base, v2-alpha-tpuv5-lite, v2-alpha-tpuv6e, ...) are Ubuntu
22.04 with Python 3.10 and no framework (https://cloud.google.com/tpu/docs/runtimes: choose the
image, "then install the framework"). So every sandbox host gets:

- ``python3`` (and ``python3.10``, ``pip3``): a bare Python 3.10 with pip and the standard library
  only, first on PATH; this machine's own Python and its bin dir are not reachable. A Compute
  Engine VM's image (``ubuntu-accel-*``, an Ubuntu cloud image) gets its system Python without pip
  instead (``vm_pythons``, ``pipless``): no source says python3-pip is on it;
- its own home (``HOME``), as separate VMs have: what one host installs, no other host sees;
- JAX on the CPU, each host's chips as devices (``JAX_PLATFORMS=cpu``, ``XLA_FLAGS``): there are
  no TPU chips here, so plain ``jax`` stands in for ``jax[tpu]`` (libtpu would find nothing).

Stand-ins, where this machine cannot do what a VM does (docs/cloud-facts.md lists them):

- the bare Python 3.10 is pyenv's 3.10 (``$(pyenv root)/versions/3.10.*``);
- uv's managed Pythons download from GitHub, which this machine cannot reach: the image carries
  the Pythons the tests name (pyenv's X.Y, by default this kernel's) in uv's managed-Python layout
  (``UV_PYTHON_INSTALL_DIR``), so ``uv python install X.Y`` finds X.Y there as it would after a
  download, and the real code path runs unchanged;
- one uv and pip cache shared by every host (``UV_CACHE_DIR``, ``PIP_CACHE_DIR``, under
  ``$TPUNB_SANDBOX_CACHE``, default ``~/.cache/tpunb-sandbox``): a VM's fast path to the package
  index, so cold installs happen once per machine, not once per host and test;
- this machine reaches PyPI through a proxy whose certificate authority is in the system store,
  so hosts get ``SSL_CERT_FILE`` (uv reads it); a VM needs none of that.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

#: the Python Google's TPU VM images ship (Ubuntu 22.04)
IMAGE_PYTHON = "3.10"
#: the system Pythons of Compute Engine's TPU images (Ubuntu 22.04: v5p and v6e; 24.04: TPU7x)
VM_PYTHONS = ("3.10", "3.12")
CACHE_ENV = "TPUNB_SANDBOX_CACHE"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def pyenv_python(version: str) -> Path | None:
    """pyenv's newest X.Y.Z prefix for ``version`` X.Y (or exactly X.Y.Z), None if it has none."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found = sorted((p for p in root.glob(f"{version}*") if (p / "bin" / "python3").exists()
                    and (p.name == version or p.name.startswith(version + "."))),
                   key=lambda p: [int(x) for x in p.name.split(".") if x.isdigit()])
    return found[-1] if found else None


def kernel_prefix() -> Path:
    """The installation this kernel's Python comes from (a venv's base), to stand in for uv's X.Y."""
    return Path(sys.base_prefix)


def default_cache() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "tpunb-sandbox")


class Image:
    """The image files under ``directory`` and the environment every host's processes get."""

    def __init__(self, directory: Path, pythons: list[str | Path] | None = None, cache: Path | None = None,
                 devices_per_host: int = 4) -> None:
        self.dir = Path(directory)
        self.cache = Path(cache) if cache else default_cache()
        bare = pyenv_python(IMAGE_PYTHON)
        if bare is None:
            raise RuntimeError(f"no Python {IMAGE_PYTHON} for the TPU VM image: install it with pyenv "
                               f"(pyenv install {IMAGE_PYTHON})")
        self.bare_python = bare / "bin" / "python3"
        self.bin = self.dir / "bin"
        self.pythons = self.dir / "uv-python"
        self.devices_per_host = devices_per_host
        self._make_bin(bare)
        self.stand_ins = [self.add_python(p) for p in (pythons if pythons is not None else [kernel_prefix()])]

    def _make_bin(self, bare: Path) -> None:
        self.bin.mkdir(parents=True, exist_ok=True)
        for name, target in {"python3": "python3", f"python{IMAGE_PYTHON}": "python3", "python": "python3",
                             "pip3": "pip3", "pip": "pip3"}.items():
            link = self.bin / name
            if not link.exists():
                link.symlink_to(bare / "bin" / target)

    def vm_pythons(self) -> dict[str, str]:
        """X.Y -> the bin dir of a Compute Engine TPU image's system Python (3.10: Ubuntu 22.04's, v5p
        and v6e; 3.12: 24.04's, TPU7x), for each this machine has: pyenv's X.Y without pip
        (``pipless``), as an Ubuntu cloud image without python3-pip has it."""
        found = {}
        for version in VM_PYTHONS:
            prefix = pyenv_python(version)
            if prefix is not None:
                found[version] = str(pipless(prefix, self.dir / f"vm-python-{version}",
                                             externally_managed=version == "3.12") / "bin")  # 24.04: PEP 668
        return found

    def add_python(self, python: str | Path) -> str:
        """Make a Python (X.Y, found with pyenv, or an installation's prefix) look installed by uv:
        ``cpython-X.Y.Z-linux-<arch>-gnu`` with its bin, lib, include and share. Returns X.Y.Z."""
        prefix = Path(python) if "/" in str(python) else pyenv_python(str(python))
        if prefix is None or not (prefix / "bin").is_dir():
            raise RuntimeError(f"no Python {python} to stand in for uv's managed one: pyenv install {python}")
        out = subprocess.run([str(prefix / "bin" / "python3"), "-c", "import sys; print(*sys.version_info[:3], sep='.')"],
                             capture_output=True, text=True, check=True)
        version = out.stdout.strip()
        folder = self.pythons / f"cpython-{version}-linux-{platform.machine()}-gnu"
        if not folder.exists():
            folder.mkdir(parents=True)
            for part in ("bin", "include", "share"):
                if (prefix / part).exists():
                    (folder / part).symlink_to(prefix / part)
            _shadow(prefix / "lib", folder / "lib", depth=2)
        minor = self.pythons / f"cpython-{'.'.join(version.split('.')[:2])}-linux-{platform.machine()}-gnu"
        if not minor.exists():  # what `uv python install X.Y` leaves: hosts never race to make it
            minor.symlink_to(folder.name)
        return version

    def environment(self) -> dict[str, str]:
        """What every process on every host sees (the sshd sets it; boot scripts get it too)."""
        env = {"PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "UV_PYTHON_INSTALL_DIR": str(self.pythons), "UV_CACHE_DIR": str(self.cache / "uv"),
               "PIP_CACHE_DIR": str(self.cache / "pip"), "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": f"--xla_force_host_platform_device_count={self.devices_per_host}"}
        if os.path.exists(CA_BUNDLE):
            env["SSL_CERT_FILE"] = CA_BUNDLE
        return env

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def pipless(source: Path, target: Path, externally_managed: bool = False) -> Path:
    """An installation at ``target`` that is ``source``'s Python without pip or ensurepip, as Ubuntu's
    python3 without python3-pip and python3-venv: the interpreter copied (a symlink would lead
    Python back to ``source`` as its prefix), the standard library linked file by file, an empty
    site-packages. ``externally_managed``: PEP 668's marker, as Ubuntu 24.04 ships it."""
    version = ".".join(source.name.split(".")[:2])
    if (target / "bin" / "python3").exists():
        return target
    stdlib, own = source / "lib" / f"python{version}", target / "lib" / f"python{version}"
    (target / "bin").mkdir(parents=True, exist_ok=True)
    (own / "site-packages").mkdir(parents=True, exist_ok=True)
    for child in stdlib.iterdir():
        if child.name not in ("site-packages", "ensurepip"):
            (own / child.name).symlink_to(child)
    if externally_managed:
        (own / "EXTERNALLY-MANAGED").write_text("[externally-managed]\nError=this is the system Python "
                                                "(Ubuntu): use a virtual environment\n")
    shutil.copy2(source / "bin" / f"python{version}", target / "bin" / f"python{version}")
    for name in ("python3", "python"):
        (target / "bin" / name).symlink_to(f"python{version}")
    return target


def _shadow(source: Path, target: Path, depth: int) -> None:
    """``target`` as a tree of real folders ``depth`` deep whose files are symlinks into ``source``.
    uv marks a Python it installed by writing EXTERNALLY-MANAGED into lib/pythonX.Y and rewrites its
    ``_sysconfigdata_*.py`` there: both must land in the stand-in, never in the real installation
    it links to (this machine's own Python), so the latter is a copy."""
    target.mkdir(parents=True, exist_ok=True)
    for child in source.iterdir():
        if depth > 1 and child.is_dir() and not child.is_symlink():
            _shadow(child, target / child.name, depth - 1)
        elif child.name.startswith("_sysconfigdata_") and child.is_file():
            shutil.copy2(child, target / child.name)
        else:
            (target / child.name).symlink_to(child)
