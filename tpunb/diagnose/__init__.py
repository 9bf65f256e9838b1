"""Diagnoses at connect, one line each: version skew between hosts, a TPU another process
holds, a coordinator port a firewall drops. Each check is a small public function so that
``%tpu_doctor`` can run it too; the hosts' half of each lives in ``tpunb/host/diagnose.py``.
"""
from tpunb.diagnose import pythons
from tpunb.diagnose.probe import HostCheck, check_hosts, problems
from tpunb.diagnose.reach import COORDINATOR_PORT, PROBE_SECONDS, firewall_fix, probe_settings
from tpunb.diagnose.versions import PACKAGES, VersionRow, kernel_versions, skew_line, version_rows

__all__ = ["pythons", "COORDINATOR_PORT", "HostCheck", "PACKAGES", "PROBE_SECONDS", "VersionRow", "check_hosts", "firewall_fix", "kernel_versions",
           "probe_settings", "problems", "skew_line", "version_rows"]
