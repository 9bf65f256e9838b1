"""Which project and zone a cloud launch uses when the user did not say.

Order, first hit wins for each of the two: explicit arguments (the magic's --project/--zone),
the environment (GOOGLE_CLOUD_PROJECT or CLOUDSDK_CORE_PROJECT, CLOUDSDK_COMPUTE_ZONE), then
gcloud's own configuration files, read directly (no gcloud subprocess: it takes a second and
may not be installed). $CLOUDSDK_CONFIG moves gcloud's directory, as it does for gcloud.
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path

from tpunb.errors import ProvisionError


def gcloud_config_dir() -> Path:
    """gcloud's configuration directory: $CLOUDSDK_CONFIG or ~/.config/gcloud."""
    return Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")


def active_gcloud_config() -> configparser.ConfigParser | None:
    """The active gcloud configuration (``configurations/config_NAME``), or None if absent."""
    base = gcloud_config_dir()
    name = os.environ.get("CLOUDSDK_ACTIVE_CONFIG_NAME", "").strip()
    if not name:
        try:
            name = (base / "active_config").read_text(encoding="utf-8").strip()
        except OSError:
            name = ""
    path = base / "configurations" / f"config_{name or 'default'}"
    parser = configparser.ConfigParser(interpolation=None)
    try:
        if not parser.read(path, encoding="utf-8"):
            return None
    except configparser.Error:
        return None
    return parser


def resolve_project_zone(
    project: str | None = None, zone: str | None = None
) -> tuple[str | None, str | None]:
    """(project, zone) from arguments, then environment, then gcloud's config; None where unknown."""
    project = (
        project or os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT") or None
    )
    zone = zone or os.environ.get("CLOUDSDK_COMPUTE_ZONE") or None
    if project is None or zone is None:
        config = active_gcloud_config()
        if config is not None:
            project = project or config.get("core", "project", fallback=None) or None
            zone = zone or config.get("compute", "zone", fallback=None) or None
    return project, zone


def require_project_zone(project: str | None = None, zone: str | None = None) -> tuple[str, str]:
    """Like resolve_project_zone, but a missing one is a one-line ProvisionError saying how to set it."""
    project, zone = resolve_project_zone(project, zone)
    if project is None:
        from tpunb import colab

        if colab.in_colab():
            raise ProvisionError(f"no Google Cloud project: pass --project, or {colab.SIGN_IN}")
        raise ProvisionError(
            "no Google Cloud project: pass --project, set GOOGLE_CLOUD_PROJECT, "
            "or run `gcloud config set project PROJECT`"
        )
    if zone is None:
        raise ProvisionError(
            "no zone: pass --zone, set CLOUDSDK_COMPUTE_ZONE, or run `gcloud config set compute/zone ZONE`"
        )
    return project, zone
