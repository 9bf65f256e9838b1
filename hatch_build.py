"""Builds the JupyterLab sidebar (extension/) into the wheel when Node.js is on this machine.

Why a small hook of our own rather than hatch-jupyter-builder's: the core install must not need
node. Here, without node the wheel is built without the sidebar (one warning line says how to
get it) and JupyterLab is not even installed into the build environment; with node, JupyterLab
(for its bundled ``jlpm`` and ``jupyter labextension build``) is added to the build
requirements, and a build is skipped when ``tpunb/labextension`` is newer than every source.
Wheels published from CI are built with node, so ``pip install 'tpunb[lab]'`` from an index
never needs it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCES = ("src", "style", "package.json", "yarn.lock", "tsconfig.json")
LAB = "jupyterlab>=4.2,<5"


def _newest(paths: list[Path]) -> float:
    stamps = [0.0]
    for path in paths:
        files = path.rglob("*") if path.is_dir() else [path]
        stamps.extend(f.stat().st_mtime for f in files if f.is_file())
    return max(stamps)


class LabExtensionHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    @property
    def _source(self) -> Path:
        return Path(self.root) / "extension"

    @property
    def _built(self) -> Path:
        return Path(self.root) / "tpunb" / "labextension"

    def _up_to_date(self) -> bool:
        marker = self._built / "package.json"
        return marker.exists() and marker.stat().st_mtime >= _newest([self._source / s for s in SOURCES])

    def _wanted(self) -> bool:
        return os.environ.get("TPUNB_SKIP_LABEXTENSION") != "1" and self._source.is_dir()

    def dependencies(self) -> list[str]:
        if self._wanted() and not self._up_to_date() and shutil.which("node"):
            return [LAB]
        return []

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or not self._wanted():
            return
        if not self._up_to_date():
            if not shutil.which("node"):
                print("tpunb: Node.js not found, so the JupyterLab sidebar is not built into this wheel; "
                      "install Node.js >= 18 and reinstall to get it", file=sys.stderr)
                return
            self._build()
        build_data["shared_data"][str(self._built)] = "share/jupyter/labextensions/tpunb"
        build_data["shared_data"][str(self._source / "install.json")] = "share/jupyter/labextensions/tpunb/install.json"

    def _build(self) -> None:
        """jlpm (JupyterLab's bundled yarn) with the locked dependencies, then the production build."""
        bindir = Path(sys.executable).parent  # jlpm and jupyter from this build environment first
        env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
        jlpm = shutil.which("jlpm", path=env["PATH"])
        if jlpm is None:
            raise RuntimeError(f"tpunb: building the JupyterLab sidebar needs {LAB} (for jlpm) in the build "
                               "environment; or set TPUNB_SKIP_LABEXTENSION=1 to build without it")
        for args in (["install", "--immutable"], ["build:prod"]):
            subprocess.run([jlpm, *args], cwd=self._source, env=env, check=True)
